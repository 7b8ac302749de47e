# Sourced by scripts/run and scripts/test: create or reuse .venv in the checkout and
# (re)install the project, with the extras the caller names, whenever pyproject.toml
# changes or an extra is missing.
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
# SPACEPOOL_EXTRAS (set by the sourcing script, space-separated): the extras it needs on top
# of the runtime dependencies: "" (scripts/run with POOL_SPACES), "demo" (gradio, for the
# demo Spaces), "test" (scripts/test, scripts/bench: the suite's tools and gradio; the
# default when SPACEPOOL_EXTRAS is unset).
# The stamp records pyproject.toml's hash and the extras installed with it.
STAMP=".venv/.spacepool-installed"
HASH="$(sha256sum pyproject.toml | cut -d' ' -f1)"
HAVE=""
if [ -f "$STAMP" ] && [ "$(head -n1 "$STAMP")" = "$HASH" ]; then HAVE="$(sed -n 2p "$STAMP")"; fi
NEED=""
for extra in ${SPACEPOOL_EXTRAS-test}; do
    case " $HAVE " in *" $extra "*) ;; *) NEED="$NEED $extra" ;; esac
done
if [ ! -f "$STAMP" ] || [ "$(head -n1 "$STAMP")" != "$HASH" ] || [ -n "$NEED" ]; then
    ALL="$(echo $HAVE $NEED)"
    SPEC="."
    if [ -n "$ALL" ]; then SPEC=".[$(echo $ALL | tr ' ' ',')]"; fi
    echo "installing spacepool${ALL:+ with its extras: $ALL} into .venv" >&2
    .venv/bin/python -m pip install -q --upgrade pip >&2
    .venv/bin/python -m pip install -q -e "$SPEC" >&2
    printf '%s\n%s\n' "$HASH" "$ALL" > "$STAMP"
fi
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
export GRADIO_ANALYTICS_ENABLED=False HF_HUB_DISABLE_TELEMETRY=1
