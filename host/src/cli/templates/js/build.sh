#!/usr/bin/env bash
# Builds build/{{name}}.wasm (untested: `poolgate plugin build .` runs this, then
# the fixtures, and only then puts it in dist/ or --out). Needs Node.js 20+ and componentize-js 0.23.0: either
# `npm install` here (from package.json; needs the npm registry once), or one
# install for every plugin, found here without a network:
#   npm install -g @bytecodealliance/componentize-js@0.23.0 @bytecodealliance/jco@1.35.0 @bytecodealliance/preview2-shim@0.17.9 @bytecodealliance/wizer@10.0.0
# or POOLGATE_JS_TOOLCHAIN=<a node_modules directory that has them>.
set -euo pipefail
cd "$(dirname "$0")"
have() { [ -d "$1/@bytecodealliance/componentize-js" ]; }
if ! have node_modules; then
    for toolchain in "${POOLGATE_JS_TOOLCHAIN:-}" "$(npm root -g 2>/dev/null || true)"; do
        if [ -n "$toolchain" ] && have "$toolchain" && [ ! -e node_modules ]; then
            ln -s "$toolchain" node_modules
            break
        fi
    done
fi
if ! have node_modules; then
    echo "error: componentize-js is not installed. Either run: npm install (in $PWD)" >&2
    echo "       or install it once: npm install -g @bytecodealliance/componentize-js@0.23.0 @bytecodealliance/jco@1.35.0 @bytecodealliance/preview2-shim@0.17.9 @bytecodealliance/wizer@10.0.0" >&2
    echo "       (or set POOLGATE_JS_TOOLCHAIN to a node_modules directory that has it)" >&2
    exit 127
fi
node build.mjs | tail -n 1
