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
