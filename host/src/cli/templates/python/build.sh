#!/usr/bin/env bash
# Builds build/{{name}}.wasm. Needs: pip install componentize-py==0.25.1
# What this writes is untested: `poolgate plugin build .` runs it, then the
# fixtures, and only then puts the component in dist/ (or --out).
set -euo pipefail
cd "$(dirname "$0")"
# The console script, or the module when the script is not on PATH (a pyenv
# without a rehash, a user install).
if command -v componentize-py >/dev/null; then
    cpy() { componentize-py "$@"; }
elif python3 -c 'import componentize_py' 2>/dev/null; then
    cpy() { python3 -c 'import sys; from componentize_py import script; sys.argv[0] = "componentize-py"; sys.exit(script())' "$@"; }
else
    echo "error: componentize-py is not installed; install it with: pip install componentize-py==0.25.1" >&2
    exit 127
fi
mkdir -p build
# --stub-wasi: a pure component that imports nothing but poolgate's host interface.
PYTHONDONTWRITEBYTECODE=1 cpy --quiet -d wit -w policy \
    componentize app -p . -o "build/{{name}}.wasm" --stub-wasi
echo "$PWD/build/{{name}}.wasm"
