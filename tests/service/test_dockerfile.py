"""The Hugging Face Docker Space recipe: the Dockerfile's facts (Docker cannot build
here), the Space card, and the recipe itself performed by scripts/check_docker_recipe.sh
in a fresh venv."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "Dockerfile"


def instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs, continuation lines joined, comments dropped."""
    joined = re.sub(r"\\\n", " ", DOCKERFILE.read_text())
    out = []
    for line in joined.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            out.append((word.upper(), " ".join(rest.split())))
    return out


def test_base_image_user_and_workdir_are_what_hugging_face_expects() -> None:
    """python:3.11-slim, a user with uid 1000 that runs the app, WORKDIR /app (the code)."""
    steps = instructions()
    assert steps[0] == ("FROM", "python:3.11-slim")
    useradd = [args for word, args in steps if word == "RUN" and "useradd" in args]
    assert useradd and re.search(r"(--uid|-u) 1000\b", useradd[0])
    users = [args for word, args in steps if word == "USER"]
    assert users and users[-1] in ("user", "1000")
    cmd_index = next(i for i, (word, _) in enumerate(steps) if word == "CMD")
    user_index = max(i for i, (word, _) in enumerate(steps) if word == "USER")
    assert user_index < cmd_index
    assert ("WORKDIR", "/app") in steps


def test_port_healthcheck_command_and_coordinator() -> None:
    """EXPOSE 7860, HEALTHCHECK on /healthz, CMD uvicorn app.main:app, SQLite in /tmp."""
    steps = instructions()
    assert ("EXPOSE", "7860") in steps
    health = [args for word, args in steps if word == "HEALTHCHECK"]
    assert health and "/healthz" in health[0] and "7860" in health[0]
    cmd = [args for word, args in steps if word == "CMD"]
    assert len(cmd) == 1
    assert "uvicorn app.main:app" in cmd[0]
    assert "--host 0.0.0.0" in cmd[0] and "--port 7860" in cmd[0]
    assert "--workers ${WEB_CONCURRENCY:-1}" in cmd[0]
    env = " ".join(args for word, args in steps if word == "ENV")
    assert "POOL_COORDINATOR_URL=sqlite:////tmp/spacepool/coordinator.db" in env


ROOT_USERS = ("root", "0", "root:root", "0:0")


def _under(path: str, folder: str) -> bool:
    path, folder = path.rstrip("/") or "/", folder.rstrip("/") or "/"
    return path == folder or path.startswith(folder + "/")


def _targets(command: str, tool: str) -> list[str]:
    """The paths each ``chown``/``chmod`` in a RUN command changes (its last words)."""
    found = []
    for part in re.split(r"&&|\|\||;|\|", command):
        words = part.split()
        if words and words[0] == tool:
            operands = [w for w in words[1:] if not w.startswith("-")]
            found += operands[1:]  # the owner or mode first, then the paths
    return found


def test_the_code_belongs_to_root_and_the_runtime_user_writes_only_its_data() -> None:
    """Issue 28, finding 10: the app's code and its venv are copied and installed as
    root, into directories the runtime user cannot write to (not its home, not the temp
    dir), and no chown/chmod hands them over; only the data dir becomes the user's."""
    steps = instructions()
    user = "root"
    as_root: list[tuple[str, str]] = []  # the steps that put code in place
    code: list[str] = []  # where the code lives
    writable = ["/tmp", "/var/tmp", "/dev/shm"]  # for every user
    for word, args in steps:
        if word == "USER":
            user = args
        elif word in ("COPY", "ADD"):
            flags = [a for a in args.split() if a.startswith("--")]
            for flag in flags:
                if flag.startswith("--chown="):
                    assert flag.split("=", 1)[1] in ROOT_USERS, f"{word} {args}: not root's"
                assert not flag.startswith("--chmod="), f"{word} {args}: mode set by hand"
            code.append(args.split()[-1])
            as_root.append((word, args))
        elif word == "WORKDIR":
            code.append(args)
        elif word == "ENV":
            code += re.findall(r"\bVIRTUAL_ENV=(\S+)", args)
        elif word == "RUN":
            if re.search(r"\bpip install\b|-m venv\b", args):
                as_root.append((word, args))
                if "-m venv" in args:
                    code.append(args.split("-m venv", 1)[1].split()[0])
            writable += _targets(args, "chown")
            for target in _targets(args, "chmod"):
                assert not any(_under(target, c) or _under(c, target) for c in code), args
            home = re.search(r"useradd .*--create-home.* (\S+)$", args)
            if home:
                writable.append(f"/home/{home.group(1)}")
        if (word, args) in as_root:
            assert user in ROOT_USERS, f"{word} {args}: runs as {user}, not root"
    assert user not in ROOT_USERS, "the runtime user is root"
    assert code and as_root
    for place in code:
        owned = [w for w in writable if _under(place, w) or _under(w, place)]
        assert not owned, f"code in {place}: the runtime user can write to {owned}"
    assert "/tmp/spacepool" in writable  # the coordinator's file and output files


def test_the_image_installs_the_project_without_gradio_or_test_extras() -> None:
    """pip installs the project itself; no gradio (only gradio_client), no [test] extra."""
    runs = [args for word, args in instructions() if word == "RUN"]
    installs = [args for args in runs if "pip install" in args]
    assert any(re.search(r"pip install (\S+ )*/app\b", args) for args in installs)
    for args in runs:
        assert not re.search(r"\bgradio\b(?!_client)", args), args
        assert "[test]" not in args
    ignored = (ROOT / ".dockerignore").read_text().split()
    assert {"tests", "devspaces", ".venv", ".git"} <= set(ignored)


def test_space_card_has_the_docker_front_matter_and_lists_the_settings() -> None:
    """space-config/README.md: sdk docker, app_port 7860, and the secrets to set."""
    card = (ROOT / "space-config" / "README.md").read_text()
    front = re.match(r"---\n(.*?)\n---\n", card, re.S)
    assert front, "front matter missing"
    meta = dict(line.split(":", 1) for line in front.group(1).splitlines() if ":" in line)
    assert meta["sdk"].strip() == "docker"
    assert meta["app_port"].strip() == "7860"
    assert meta["title"].strip()
    for name in ("POOL_SPACES", "HF_TOKEN", "POOL_ADMIN_TOKEN", "POOL_API_TOKEN", "redis://"):
        assert name in card


@pytest.mark.timeout(300)
@pytest.mark.skipif(
    bool(os.environ.get("SPACEPOOL_SKIP_RECIPE")), reason="SPACEPOOL_SKIP_RECIPE is set"
)
@pytest.mark.skipif(
    not (shutil.which("python3.11") and shutil.which("curl")), reason="needs python3.11 and curl"
)
def test_the_recipe_installs_and_serves_in_a_fresh_venv() -> None:
    """scripts/check_docker_recipe.sh: fresh venv, pip install, the CMD serves /healthz."""
    started = time.monotonic()
    done = subprocess.run(
        ["bash", str(ROOT / "scripts" / "check_docker_recipe.sh")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=280,
        check=False,
    )
    elapsed = time.monotonic() - started
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert done.stdout.rstrip().endswith("OK")
    assert "/healthz answers" in done.stdout and "alpha:recipe" in done.stdout
    print(f"\nrecipe check: {elapsed:.0f} s")
