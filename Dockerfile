# spacepool as a Hugging Face Docker Space (SPEC 7).
#
# The image holds the library and the service only: no gradio (that is the stand-in
# Spaces' test dependency), no test extra. scripts/check_docker_recipe.sh performs the
# same install and start-up steps in a fresh venv, where Docker cannot build.
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

# Hugging Face runs the container as uid 1000. The code and the venv belong to root, in
# directories the runtime user cannot write to (not under its home): a compromised
# process cannot change what the next worker imports. Only the data dir is its own.
RUN useradd --create-home --uid 1000 user
ENV HOME=/home/user \
    VIRTUAL_ENV=/opt/venv \
    PATH=/opt/venv/bin:$PATH
WORKDIR /app

RUN python -m venv /opt/venv
COPY . /app
# The project itself, without extras (gradio is only for tests).
RUN pip install /app

# Admission state shared by every worker in the container (several containers: a shared
# Redis, reachable from a Space only on ports 80, 443 or 8080: docs/hub.md);
# output files go beside it (POOL_FILE_DIR's default, under the temp dir).
RUN mkdir -p /tmp/spacepool && chown user:user /tmp/spacepool && chmod 700 /tmp/spacepool
USER user
ENV POOL_COORDINATOR_URL=sqlite:////tmp/spacepool/coordinator.db \
    GRADIO_ANALYTICS_ENABLED=False \
    HF_HUB_DISABLE_TELEMETRY=1 \
    PORT=7860

EXPOSE 7860

# Liveness: /healthz answers while the process does (a restart would not help otherwise).
# Readiness is GET /readyz (the coordinator answers, every app has a Space up or
# wakeable): for a load balancer in front of several containers, not for a restart.
HEALTHCHECK --interval=30s --timeout=5s --start-period=30s --retries=3 \
    CMD python -c "import urllib.request as u; u.urlopen('http://127.0.0.1:7860/healthz', timeout=4)" || exit 1

# Shell form so that WEB_CONCURRENCY is expanded; exec so that uvicorn is PID 1 and
# receives SIGTERM (graceful shutdown: jobs cancelled, leases released). Open SSE
# streams get 5 s to finish before the shutdown goes on without them. --http: request
# heads bounded (app/_http.py; uvicorn picks its protocol before it imports the app).
CMD exec uvicorn app.main:app --host 0.0.0.0 --port 7860 --workers ${WEB_CONCURRENCY:-1} --timeout-graceful-shutdown 5 --http app._http:BoundedHttpToolsProtocol
