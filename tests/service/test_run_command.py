"""``python -m app`` (the README's run command): demo Spaces when POOL_SPACES is unset, a
generated admin token printed exactly once, a URL and a curl example that work, and a
clean stop on Ctrl-C that takes the demo Spaces down too."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest

from app.__main__ import DEMO_SPACES
from devspaces import free_port
from tests.test_readme import (
    NOT_RUN,
    js_runnable,
    not_run,
    on_ci,
    pasted_commands,
    readme_blocks,
    run_js_block,
    run_pasted,
    run_python_block,
)

from .conftest import tls, wait_for

ROOT = Path(__file__).resolve().parents[2]


def run_readme_and_banner_commands(url: str, token: str, directory: Path) -> None:
    """Every shell command of README.md and of the banner, pasted into bash against this
    demo (the README's port 7860 replaced by the test's, as the README says to): each
    answer is 2xx and non-empty; the flipped image is a PNG. Not run: NOT_RUN."""
    (directory / "examples").symlink_to(ROOT / "examples")  # "from the checkout"
    env = {**os.environ, "POOL_ADMIN_TOKEN": token, "NO_PROXY": "*", "no_proxy": "*"}
    scripts = pasted_commands(url)
    assert len(scripts) == 9, scripts  # 4 README blocks (queue, files, stream, teams), 5 banner
    for script in scripts:
        started = time.monotonic()
        out, sizes = run_pasted(script, directory, env)
        assert sizes and all(size > 0 for size in sizes), (script, sizes)
        if '"slow ' in script:  # the queue example: the third call waited its turn
            waits = sorted(float(m) for m in re.findall(r'"queued_ms": ?([\d.]+)', out))
            assert len(waits) == 3 and waits[-1] > 1000 and waits[0] < 1000, out
            assert time.monotonic() - started < 20
    assert (directory / "flipped.png").read_bytes().startswith(b"\x89PNG")
    print(f"\n{len(scripts)} pasted scripts answered; not run: {NOT_RUN}")


def run_readme_code_blocks(url: str, pool_spaces: str, directory: Path) -> None:
    """Every Python and JavaScript block of README.md, as pasted (its comment says how),
    against this demo: the library's with the demo's POOL_SPACES (as scripts/run prints
    it), the clients' at the service's URL. A block whose first line says ``not run:``
    is left out (and named)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("POOL_")}
    env.update(POOL_SPACES=pool_spaces, POOL_COORDINATOR_URL="memory://", NO_PROXY="*",
               no_proxy="*")  # fmt: skip
    skipped, failed = [], []
    for block in readme_blocks("python"):
        if (why := not_run(block)) is not None:
            skipped.append(why)
            continue
        try:  # every block is run; the failures are reported together
            run_python_block(block, url, directory, env)
        except AssertionError as exc:
            failed.append(str(exc))
    reason = js_runnable()
    if reason is not None and on_ci():
        pytest.fail(f"the README's JS blocks cannot run: {reason}")
    for block in readme_blocks("js") if reason is None else []:
        if (why := not_run(block)) is not None:
            skipped.append(why)
            continue
        try:
            out = run_js_block(block, url, directory, env)
            assert "/gradio/pic/" in out and "heard 'hello'" in out, out
        except AssertionError as exc:
            failed.append(str(exc))
    assert not failed, "\n\n".join(failed)
    assert (directory / "out").is_dir(), "the library's download_to= folder"
    print(f"README code blocks run; not run: {skipped or 'none'}; JS: {reason or 'run'}")


@pytest.mark.timeout(300)
def test_python_m_app_starts_demo_spaces_serves_and_stops_cleanly(tmp_path: Path) -> None:
    """No POOL_SPACES/POOL_ADMIN_TOKEN: demo Spaces of three kinds, token shown once, the
    printed examples work (echo, streamed chat, a file URL), Ctrl-C stops."""
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("POOL_")}
    env.update(PYTHONUNBUFFERED="1", NO_PROXY="*")
    output: list[str] = []
    proc = subprocess.Popen(
        [sys.executable, "-m", "app", "--port", str(port)],
        cwd=ROOT,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    assert proc.stdout is not None
    stdout = proc.stdout
    reader = threading.Thread(target=lambda: output.extend(stdout), daemon=True)
    reader.start()
    try:
        url = f"http://127.0.0.1:{port}"

        def healthy() -> bool:
            assert proc.poll() is None, "".join(output)
            try:
                return httpx.get(f"{url}/healthz", timeout=1, verify=tls()).status_code == 200
            except httpx.TransportError:
                return False

        wait_for(healthy, 200, "python -m app serving")
        text = "".join(output)
        assert f"spacepool is starting on {url}" in text
        spaces = re.search(r"POOL_SPACES=(\S+)", text)
        token = re.search(r"export POOL_ADMIN_TOKEN=(\S+)", text)
        assert spaces and token, text
        assert "curl -s -X POST" in text and "/api/predict" in text

        # The printed examples, as printed: echo, a streamed chat reply, a file.
        bodies = re.findall(r"-d '(\{.*\})'", text)
        assert len(bodies) == 3, text

        def post(body: str) -> httpx.Response:
            return httpx.post(
                f"{url}/api/predict",
                content=body,
                headers={"Content-Type": "application/json"},
                timeout=60,
            )

        answer = post(bodies[0])
        assert answer.status_code == 200, answer.text
        assert answer.json()["result"] in {f"{name}:hello" for name in DEMO_SPACES}
        streamed = post(bodies[1])
        assert streamed.headers["content-type"].startswith("text/event-stream"), streamed.text
        events = [json.loads(line[5:]) for line in streamed.text.splitlines()
                  if line.startswith("data:")]  # fmt: skip
        partials = [e["partial"] for e in events if "partial" in e]
        assert len(partials) >= 3 and events[-1]["stage"] == "done", events
        assert events[-1]["result"] == partials[-1] and events[-1]["space"] == "chat"
        made = post(bodies[2])
        assert made.status_code == 200, made.text
        report = httpx.get(url + made.json()["result"]["file"]["url"], timeout=10)
        assert report.status_code == 200 and report.text == "pic:hello\n" * 3
        stats = httpx.get(
            f"{url}/api/admin/pool-stats",
            headers={"Authorization": f"Bearer {token.group(1)}"},
            timeout=10,
        )
        assert stats.status_code == 200 and set(stats.json()["pools"]) == set(DEMO_SPACES)
        # The demo serves its Spaces' own pages, and says where (issue 42).
        for name in DEMO_SPACES:
            assert f"{url}/gradio/{name}/" in text, text
            page = httpx.get(f"{url}/gradio/{name}/", timeout=30)
            assert page.status_code == 200 and "window.gradio_config" in page.text

        run_readme_and_banner_commands(url, token.group(1), tmp_path)
        run_readme_code_blocks(url, spaces.group(1), tmp_path)

        started = time.monotonic()
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=30) == 0, "".join(output)
        stop_s = time.monotonic() - started
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)
        reader.join(timeout=10)  # the child is gone: the pipe is at its end
        stdout.close()
    text = "".join(output)
    assert text.count(token.group(1)) == 1, "the admin token must be printed exactly once"
    assert "Application shutdown complete" in text
    for entry in spaces.group(1).split(","):
        space_url = entry.split("=", 1)[1]
        with pytest.raises(httpx.TransportError):
            httpx.get(f"{space_url}gradio_api/app_id", timeout=1)
    print(f"\npython -m app stopped {stop_s:.1f} s after SIGINT")
