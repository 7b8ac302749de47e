# Sourced by scripts/run and scripts/test: create or reuse .venv in the checkout and
# (re)install the project with its test/demo extra whenever pyproject.toml changes.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
PYTHON_BIN="${PYTHON:-python3}"
if ! "$PYTHON_BIN" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
    for candidate in python3.13 python3.12 python3.11; do
        if command -v "$candidate" >/dev/null 2>&1; then PYTHON_BIN="$candidate"; break; fi
    done
fi
"$PYTHON_BIN" -c 'import sys; sys.exit(sys.version_info < (3, 11))' \
    || { echo "spacepool needs Python >= 3.11 (set PYTHON=...)" >&2; exit 1; }
if [ ! -x .venv/bin/python ]; then
    echo "creating .venv with $PYTHON_BIN" >&2
    "$PYTHON_BIN" -m venv .venv
fi
STAMP=".venv/.spacepool-installed"
WANT="$(sha256sum pyproject.toml | cut -d' ' -f1)"
if [ ! -f "$STAMP" ] || [ "$(cat "$STAMP")" != "$WANT" ]; then
    echo "installing spacepool and its test/demo dependencies into .venv" >&2
    .venv/bin/python -m pip install -q --upgrade pip >&2
    .venv/bin/python -m pip install -q -e '.[test]' >&2
    echo "$WANT" > "$STAMP"
fi
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
export GRADIO_ANALYTICS_ENABLED=False HF_HUB_DISABLE_TELEMETRY=1
