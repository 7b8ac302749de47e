#!/usr/bin/env bash
# Prove the Dockerfile's recipe works where Docker cannot build: do its steps by hand.
#
#   1. copy the build context as .dockerignore leaves it;
#   2. a fresh Python 3.11 venv, then the Dockerfile's `pip install` (no extras: no gradio);
#   3. start one stand-in Space (devspaces, from the checkout's .venv, which has gradio);
#   4. run the Dockerfile's CMD line (host/port swapped for loopback and a free port) with
#      its POOL_COORDINATOR_URL form, wait for /healthz, run the HEALTHCHECK command,
#      send one predict through the Space, then stop everything.
#
# Usage: scripts/check_docker_recipe.sh
#   WEB_CONCURRENCY      workers for the CMD (default 2: proves workers share the SQLite file)
#   RECIPE_COORDINATOR_URL  override the coordinator (default: the Dockerfile's sqlite form,
#                        with the file in this run's temp dir)
#   PYTHON311            interpreter for the fresh venv (default: python3.11)
#   RECIPE_FRESH=1       resolve the dependencies from the index again
# The first run resolves and downloads the dependencies (30-70 s here); later runs install
# the same wheels offline from ~/.cache/spacepool/recipe-wheels-<hash of the dependencies>.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DEV_PY="$ROOT/.venv/bin/python"
PY311="${PYTHON311:-python3.11}"
WORK="$(mktemp -d "${TMPDIR:-/tmp}/spacepool-recipe.XXXXXX")"
SPACE_PID=""
APP_PID=""
START=$(date +%s)

say() { printf '[recipe %3ss] %s\n' "$(( $(date +%s) - START ))" "$*"; }

cleanup() {
    for pid in $APP_PID $SPACE_PID; do
        if kill -0 "$pid" 2>/dev/null; then
            kill -TERM "$pid" 2>/dev/null || true
            for _ in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
            kill -KILL "$pid" 2>/dev/null || true
        fi
    done
    rm -rf "$WORK"
}
trap cleanup EXIT

free_port() { "$DEV_PY" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

wait_http() {  # url, seconds, pid to watch
    local url="$1" limit="$2" pid="$3"
    for _ in $(seq 1 $((limit * 10))); do
        if curl -fsS -o /dev/null --max-time 2 "$url" 2>/dev/null; then return 0; fi
        if ! kill -0 "$pid" 2>/dev/null; then return 1; fi
        sleep 0.1
    done
    return 1
}

SPACE_PORT="$(free_port)"
(cd "$ROOT" && exec "$DEV_PY" -m devspaces serve --name alpha --port "$SPACE_PORT") \
    >"$WORK/space.log" 2>&1 &
SPACE_PID=$!

# 1. the build context
say "copying the build context (as .dockerignore leaves it)"
mkdir -p "$WORK/app"
excludes=()
while IFS= read -r line; do
    line="${line%%#*}"; line="$(echo "$line" | xargs)"
    [ -n "$line" ] && excludes+=("--exclude=${line#\*\*/}")
done < "$ROOT/.dockerignore"
tar -C "$ROOT" "${excludes[@]}" -cf - . | tar -C "$WORK/app" -xf -

# 2. the Dockerfile's install step, in a fresh venv
say "fresh venv with $PY311; pip install of the project (no extras)"
"$PY311" -m venv "$WORK/venv"
pip_install() {
    "$WORK/venv/bin/python" -m pip install -q --disable-pip-version-check "$@" \
        >>"$WORK/pip.log" 2>&1 || { tail -30 "$WORK/pip.log" >&2; echo "FAIL: pip install $*" >&2; exit 1; }
}
# The image runs `pip install /app` against the index. Here the resolved
# wheels are kept in a wheelhouse keyed by the dependencies (this machine's pip does not
# cache downloads), so later runs install the same set offline in seconds.
# Keyed by what decides the wheels (the build system, the dependencies, the Python range),
# not the whole file: a change of the linters' or pytest's settings resolves nothing anew.
KEY="$("$DEV_PY" - "$ROOT/pyproject.toml" <<'PY'
import hashlib, json, sys, tomllib
with open(sys.argv[1], "rb") as file:
    meta = tomllib.load(file)
project = meta["project"]
deciding = [meta.get("build-system"), project.get("dependencies"), project.get("requires-python")]
print(hashlib.sha256(json.dumps(deciding, sort_keys=True).encode()).hexdigest()[:16])
PY
)"
WHEELS="${RECIPE_WHEELHOUSE:-${XDG_CACHE_HOME:-$HOME/.cache}/spacepool/recipe-wheels-$KEY}"
if [ -n "${RECIPE_FRESH:-}" ] || [ ! -f "$WHEELS/.complete" ]; then
    say "resolving the dependencies from the index into $WHEELS"
    rm -rf "$WHEELS"; mkdir -p "$WHEELS"
    "$WORK/venv/bin/python" -m pip wheel -q --disable-pip-version-check -w "$WHEELS" \
        "$WORK/app" "setuptools>=68" >>"$WORK/pip.log" 2>&1 \
        || { tail -30 "$WORK/pip.log" >&2; echo "FAIL: pip wheel" >&2; exit 1; }
    rm -f "$WHEELS"/spacepool-*.whl
    touch "$WHEELS/.complete"
fi
# --no-compile: the image byte-compiles at build time; that changes nothing installed and
# costs 20 s of CPU here.
pip_install --no-index --find-links "$WHEELS" --no-compile "$WORK/app"
if "$WORK/venv/bin/python" -c 'import gradio' 2>/dev/null; then
    echo "FAIL: gradio is installed in the image venv" >&2; exit 1
fi
say "installed: $("$WORK/venv/bin/python" -m pip list --format=freeze 2>/dev/null | wc -l) packages, no gradio"
(cd "$WORK" && "$WORK/venv/bin/python" -c 'import pool.admission, app.main' 2>/dev/null) \
    || say "WARNING: the installed wheel alone cannot import pool.admission/app.main" \
           "(the image works because WORKDIR holds the sources; see pyproject packages)"

# 3. one stand-in Space (started before the install, so that both proceed together)
wait_http "http://127.0.0.1:$SPACE_PORT/gradio_api/app_id" 90 "$SPACE_PID" \
    || { echo "FAIL: the stand-in Space did not start" >&2; tail -20 "$WORK/space.log" >&2; exit 1; }
say "stand-in Space ready on 127.0.0.1:$SPACE_PORT"

# 4. the Dockerfile's CMD
APP_PORT="$(free_port)"
CMD_LINE="$(sed -n 's/^CMD //p' "$ROOT/Dockerfile")"
[ -n "$CMD_LINE" ] || { echo "FAIL: no shell-form CMD in the Dockerfile" >&2; exit 1; }
CMD_LINE="${CMD_LINE//--host 0.0.0.0/--host 127.0.0.1}"
CMD_LINE="${CMD_LINE//--port 7860/--port $APP_PORT}"
DOCKER_COORD="$(sed -n 's/^ENV POOL_COORDINATOR_URL=\([^ ]*\).*/\1/p' "$ROOT/Dockerfile")"
[ "${DOCKER_COORD#sqlite:////}" != "$DOCKER_COORD" ] \
    || { echo "FAIL: the Dockerfile's POOL_COORDINATOR_URL is not sqlite:////..." >&2; exit 1; }
mkdir -p "$WORK/spacepool"
COORD="${RECIPE_COORDINATOR_URL:-sqlite:///$WORK/spacepool/coordinator.db}"
say "running: $CMD_LINE   (POOL_COORDINATOR_URL=$COORD)"
(
    cd "$WORK/app"
    export PATH="$WORK/venv/bin:$PATH" VIRTUAL_ENV="$WORK/venv"
    export POOL_SPACES="alpha=http://127.0.0.1:$SPACE_PORT/" POOL_COORDINATOR_URL="$COORD"
    export POOL_MIN_CONNECTIONS=1 WEB_CONCURRENCY="${WEB_CONCURRENCY:-2}"
    export GRADIO_ANALYTICS_ENABLED=False HF_HUB_DISABLE_TELEMETRY=1 PYTHONPATH=
    exec sh -c "$CMD_LINE"
) >"$WORK/app.log" 2>&1 &
APP_PID=$!
if ! wait_http "http://127.0.0.1:$APP_PORT/healthz" 60 "$APP_PID"; then
    echo "FAIL: /healthz did not answer" >&2; tail -40 "$WORK/app.log" >&2; exit 1
fi
say "/healthz answers"
HEALTH_CMD="$(sed -n 's/^ *CMD \(python -c .*\) || exit 1$/\1/p' "$ROOT/Dockerfile")"
HEALTH_CMD="${HEALTH_CMD//7860/$APP_PORT}"
(export PATH="$WORK/venv/bin:$PATH"; sh -c "$HEALTH_CMD") \
    || { echo "FAIL: the HEALTHCHECK command failed" >&2; exit 1; }
say "HEALTHCHECK command passes"
ANSWER="$(curl -fsS --max-time 30 -X POST "http://127.0.0.1:$APP_PORT/api/predict" \
    -H 'Content-Type: application/json' -d '{"api_name": "/echo", "args": ["recipe", 0]}')" \
    || { echo "FAIL: predict through the service failed" >&2; tail -40 "$WORK/app.log" >&2; exit 1; }
case "$ANSWER" in
    *'"result":"alpha:recipe"'*) say "predict through the Space: $ANSWER" ;;
    *) echo "FAIL: unexpected predict answer: $ANSWER" >&2; exit 1 ;;
esac

kill -TERM "$APP_PID"
for _ in $(seq 1 100); do kill -0 "$APP_PID" 2>/dev/null || break; sleep 0.1; done
if kill -0 "$APP_PID" 2>/dev/null; then
    echo "FAIL: uvicorn did not stop within 10 s of SIGTERM" >&2; exit 1
fi
say "stopped cleanly; the recipe works"
echo "OK"
