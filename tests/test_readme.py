"""The README's and the banner's shell commands parse as pasted and name files that exist."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

from app.__main__ import _banner

ROOT = Path(__file__).resolve().parents[1]


def _blocks(text: str) -> list[str]:
    return re.findall(r"```(?:bash|sh)\n(.*?)```", text, flags=re.S)


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
        if commands <= set(NOT_RUN):
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
