#!/usr/bin/env bash
# Builds target/{{name}}.wasm. Needs: Node.js 20+ and `npm install` here once.
set -euo pipefail
cd "$(dirname "$0")"
if [ ! -d node_modules/@bytecodealliance/componentize-js ]; then
    echo "error: componentize-js is not installed; run: npm install (in $PWD)" >&2
    exit 127
fi
node build.mjs | tail -n 1
