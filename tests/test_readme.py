"""The README's and the banner's shell commands parse as pasted and name files that exist;
every Python and JavaScript block of the README compiles. (Every block runs against the
demo in tests/service/test_run_command.py, with the helpers below.)"""

from __future__ import annotations

import ast
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

from app.__main__ import _banner

ROOT = Path(__file__).resolve().parents[1]


def _blocks(text: str) -> list[str]:
    return re.findall(r"```(?:bash|sh)\n(.*?)```", text, flags=re.S)


def readme_blocks(language: str) -> list[str]:
    """The README's code blocks of ``language`` (python, js), as written."""
    text = (ROOT / "README.md").read_text()
    return re.findall(rf"```{language}\n(.*?)```", text, flags=re.S)


def not_run(block: str) -> str | None:
    """Why a block is not run against the demo, when its first line says so
    (``# not run: …`` or ``// not run: …``: it needs something the demo is not)."""
    first = block.lstrip().splitlines()[0] if block.strip() else ""
    found = re.match(r"^(?:#|//)\s*not run:\s*(.+)$", first)
    return found.group(1) if found else None


def _parses(script: str) -> str:
    done = subprocess.run(["bash", "-n"], input=script, text=True, capture_output=True)
    return done.stderr


def test_readme_commands_parse_and_their_files_exist() -> None:
    """Every bash block of README.md is valid shell; every @file/< file it reads ships."""
    blocks = _blocks((ROOT / "README.md").read_text())
    assert blocks
    for block in blocks:
        assert _parses(block) == "", block
        for name in re.findall(r"(?:=@|<\s*)([\w./-]+\.\w+)", block):
            assert (ROOT / name).is_file(), name
        assert "…" not in re.sub(r"#.*", "", block), block  # no placeholder to paste


def test_banner_commands_parse() -> None:
    """The banner's curl commands are shell that runs as pasted (no <placeholders>)."""
    text = _banner("http://127.0.0.1:7860", "tok", demo=True)
    lines = [line for line in text.splitlines() if line.startswith(("  curl", "       "))]
    assert _parses("\n".join(lines)) == ""
    assert "<" not in "".join(lines)


# Run as pasted (tests/service/test_run_command.py calls this against `python -m app`'s
# demo, the service scripts/run starts). Each curl is given --fail-with-body (a non-2xx
# answer fails the script) and reports its answer's size on stderr; nothing else changes.
_CURL = """curl() { command curl --fail-with-body -w '%{stderr}size=%{size_download}\\n' "$@"; }
set -euo pipefail
"""
# Commands not run, and why (they are not requests to the running demo).
NOT_RUN = {
    "scripts/run": "the command that started the service under test",
    "scripts/test": "the whole suite (this test is part of it)",
}


def pasted_commands(url: str) -> list[str]:
    """Every shell block of README.md and the demo banner's commands, for ``url``: one
    script per README block (its commands use each other's variables), one per banner
    command. README blocks made only of NOT_RUN commands are left out."""
    scripts = []
    for block in _blocks((ROOT / "README.md").read_text()):
        lines = [line for line in block.splitlines() if not line.lstrip().startswith("#")]
        commands = {line.split("#")[0].strip() for line in lines if line.strip()}
        if commands <= set(NOT_RUN) or not_run(block):
            continue
        scripts.append("\n".join(lines).replace("http://127.0.0.1:7860", url))
    text = _banner(url, None, demo=True)
    current: list[str] = []
    for line in text.splitlines():
        if line.startswith("  curl"):
            current = [line]
            scripts.append("")
        elif line.startswith("       ") and current:
            current.append(line)
        else:
            current = []
            continue
        scripts[-1] = "\n".join(current)
    return scripts


def run_pasted(script: str, cwd: Path, env: dict[str, str]) -> tuple[str, list[int]]:
    """Run ``script`` with bash as pasted: its stdout and each answer's size; a non-2xx
    answer or a failing command fails."""
    done = subprocess.run(
        ["bash", "-c", _CURL + script], cwd=cwd, env=env, capture_output=True, text=True,
        timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, f"{script}\n→ {done.returncode}\n{done.stdout}\n{done.stderr}"
    sizes = [int(m) for m in re.findall(r"^size=(\d+)$", done.stderr, flags=re.M)]
    return done.stdout, sizes


def test_readme_python_and_js_blocks_compile() -> None:
    """Every Python block of README.md compiles (top-level await allowed: they are pasted
    into ``python -m asyncio``); every JS block is a module node accepts."""
    python = readme_blocks("python")
    assert len(python) >= 2
    for block in python:
        compile(block, "README.md", "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)
    for block in readme_blocks("js"):
        if shutil.which("node") is None:
            continue
        done = subprocess.run(["node", "--check", "--input-type=module"], input=block,
                              text=True, capture_output=True)  # fmt: skip
        assert done.returncode == 0, done.stderr


# Runs a README Python block as `python -m asyncio` would (top-level await).
_ASYNC_RUNNER = """
import ast, asyncio, sys
code = compile(sys.stdin.read(), "README.md", "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)
async def main():
    result = eval(code, {"__name__": "__main__"})
    if asyncio.iscoroutine(result):
        await result
asyncio.run(main())
"""


def run_python_block(block: str, url: str, cwd: Path, env: dict[str, str]) -> str:
    """Run a README Python block as pasted (the README's 127.0.0.1:7860 is ``url``): its
    stdout; any exception fails."""
    script = block.replace("http://127.0.0.1:7860", url)
    done = subprocess.run(
        [sys.executable, "-c", _ASYNC_RUNNER], input=script, cwd=cwd, env=env,
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, f"{script}\n→ {done.returncode}\n{done.stdout}\n{done.stderr}"
    return done.stdout


def run_js_block(block: str, url: str, cwd: Path, env: dict[str, str]) -> str:
    """Run a README JS block as its comment says (saved as a .mjs, run with node, where
    @gradio/client is installed: tests/front/js's node_modules): its stdout."""
    (cwd / "node_modules").unlink(missing_ok=True)
    (cwd / "node_modules").symlink_to(ROOT / "tests" / "front" / "js" / "node_modules")
    (cwd / "block.mjs").write_text(block.replace("http://127.0.0.1:7860", url))
    done = subprocess.run(["node", "block.mjs"], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=120)  # fmt: skip
    assert done.returncode == 0, f"{block}\n→ {done.returncode}\n{done.stdout}\n{done.stderr}"
    return done.stdout


def js_runnable() -> str | None:
    """Why the JS blocks cannot run here (None when they can)."""
    if shutil.which("node") is None:
        return "no node on this machine"
    if not (ROOT / "tests" / "front" / "js" / "node_modules" / "@gradio" / "client").is_dir():
        return "@gradio/client not installed (scripts/test runs npm ci in tests/front/js)"
    return None


def on_ci() -> bool:
    return os.environ.get("CI", "").lower() in {"1", "true", "yes"}
