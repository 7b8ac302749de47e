"""scripts/conformance on a two-test suite of our own (gradio's suite is not in this
repository): each test runs once against the app and once through the front, where
the app's URL is the service's ``/gradio/demo/``, and the table says so."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SUITE = """
import gradio as gr
from gradio_client import Client


def _url(demo):
    _, url, _ = demo.launch(prevent_thread_lock=True)
    return url


def test_predict_answers():
    demo = gr.Interface(lambda x: x.upper(), "text", "text", api_name="predict")
    try:
        assert Client(_url(demo)).predict("ab", api_name="/predict") == "AB"
    finally:
        demo.close()


def test_the_url_is_the_apps_own():
    demo = gr.Interface(lambda x: x, "text", "text", api_name="predict")
    try:
        assert "/gradio/" not in _url(demo)
    finally:
        demo.close()
"""


def test_the_script_runs_a_suite_directly_and_through_the_front(tmp_path: Path) -> None:
    """The table has each test's outcome in both runs; a test that passes directly but
    not through the front is named, and the exit status says so."""
    (tmp_path / "test_client.py").write_text(SUITE)
    (tmp_path / "conftest.py").write_text("")
    done = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "_conformance.py"), "--suite", str(tmp_path)],
        cwd=ROOT, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    rows = {line.split("|")[1].strip(): [c.strip() for c in line.split("|")[2:4]]
            for line in done.stdout.splitlines() if line.startswith("| test_")}  # fmt: skip
    assert rows == {
        "test_predict_answers": ["pass", "pass"],
        "test_the_url_is_the_apps_own": ["pass", "FAIL"],
    }, done.stdout + done.stderr[-3000:]
    assert "2 pass directly; 1 of them pass through the front." in done.stdout
    assert "through the front, test_the_url_is_the_apps_own: FAIL" in done.stdout
    assert done.returncode == 1
