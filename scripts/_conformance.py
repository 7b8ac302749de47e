"""gradio_client's own test suite, run directly and through the Gradio front, as a table.

``scripts/conformance --suite DIR [-k EXPR] [--timeout S]``

``DIR`` holds gradio_client's tests (the gradio repository's ``client/python/test/``
at the release of the installed gradio_client: ``test_client.py`` and its
``conftest.py``). They are not part of this repository (they are gradio's code): the
run takes them from where you put them. The suite is run twice with pytest, each test
in this machine's loopback only:

* **direct**: as gradio runs it, every test's demo app launched on 127.0.0.1 and called
  by ``gradio_client.Client``;
* **through the front**: the same, with :mod:`scripts._conformance_front` loaded, which
  starts a spacepool service over each demo app the suite launches and hands the test
  ``http://127.0.0.1:<port>/gradio/demo/`` as the app's URL (a demo launched with
  ``auth=`` gets that login as ``POOL_SPACE_AUTH``).

Then it prints one line per test, its outcome in each run, and names the tests that pass
directly but not through the front. Exit status: 0 when every test that passes directly
passes through the front, 1 otherwise.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RUNS = ("direct", "front")


def _run(suite: Path, mode: str, report: Path, extra: list[str], timeout_s: float) -> float:
    """One pytest run of ``suite``; its outcomes in the JUnit XML ``report``."""
    command = [sys.executable, "-m", "pytest", str(suite), "-q", "-p", "no:cacheprovider",
               f"--junitxml={report}", f"--timeout={timeout_s:g}", "--rootdir", str(suite),
               "-W", "ignore", *extra]  # fmt: skip
    if mode == "front":
        command += ["-p", "scripts._conformance_front"]
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    started = time.monotonic()
    print(f"== {mode}: {' '.join(command[3:])}", file=sys.stderr, flush=True)
    subprocess.run(command, cwd=suite, env=env, stdout=sys.stderr, check=False)
    return time.monotonic() - started


def _outcomes(report: Path) -> dict[str, tuple[str, str]]:
    """{test id: (outcome, first line of its failure)} from a JUnit XML report."""
    found: dict[str, tuple[str, str]] = {}
    if not report.exists():
        return found
    for case in ET.parse(report).getroot().iter("testcase"):
        cls = (case.get("classname") or "").rsplit(".", 1)[-1]
        name = f"{cls}::{case.get('name')}" if cls.startswith("Test") else str(case.get("name"))
        outcome, why = "pass", ""
        for tag in ("failure", "error", "skipped"):
            node = case.find(tag)
            if node is not None:
                outcome = {"failure": "FAIL", "error": "ERROR", "skipped": "skip"}[tag]
                message = (node.get("message") or "").strip()
                why = message.splitlines()[0][:110] if message else ""
                break
        found[name] = (outcome, why)
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--suite",
        type=Path,
        default=os.environ.get("GRADIO_CLIENT_SUITE"),
        help="the folder of gradio_client's tests (or $GRADIO_CLIENT_SUITE)",
    )
    parser.add_argument("-k", dest="keyword", help="only the tests pytest's -k selects")
    parser.add_argument("--timeout", type=float, default=120.0, help="per test, seconds")
    parser.add_argument("--only", choices=RUNS, help="one run instead of both")
    args = parser.parse_args(argv)
    if args.suite is None or not (args.suite / "test_client.py").is_file():
        parser.error("--suite DIR: a folder with gradio_client's test_client.py and conftest.py")
    extra = ["-k", args.keyword] if args.keyword else []
    folder = Path(tempfile.mkdtemp(prefix="spacepool-conformance-"))
    results: dict[str, dict[str, tuple[str, str]]] = {}
    for mode in (args.only,) if args.only else RUNS:
        report = folder / f"{mode}.xml"
        took = _run(args.suite.resolve(), mode, report, extra, args.timeout)
        results[mode] = _outcomes(report)
        print(f"== {mode}: {len(results[mode])} tests in {took:.0f} s", file=sys.stderr)
    return _table(results)


def _table(results: dict[str, dict[str, tuple[str, str]]]) -> int:
    direct, front = results.get("direct", {}), results.get("front", {})
    names = list(dict.fromkeys([*direct, *front]))
    width = max((len(n) for n in names), default=10)
    print(f"| {'test':<{width}} | direct | through front |")
    print(f"|{'-' * (width + 2)}|--------|---------------|")
    for name in names:
        d, f = direct.get(name, ("-", ""))[0], front.get(name, ("-", ""))[0]
        print(f"| {name:<{width}} | {d:<6} | {f:<13} |")
    passing = [n for n in names if direct.get(n, ("",))[0] == "pass"]
    if not direct or not front:  # one run only (--only)
        print(f"\n{sum(o == 'pass' for o, _ in (direct or front).values())} pass.")
        return 0
    lost = [n for n in passing if front.get(n, ("",))[0] != "pass"]
    print(f"\n{len(passing)} pass directly; {len(passing) - len(lost)} of them pass through"
          f" the front.")  # fmt: skip
    for name in lost:
        outcome, why = front.get(name, ("-", "not run"))
        print(f"  through the front, {name}: {outcome} {why}")
    # A test that fails both ways may still fail otherwise through the front (an answer
    # of the front's that the client cannot read): worth a look, not a conformance loss.
    unlike = [n for n in names if direct.get(n, ("",))[0] in ("FAIL", "ERROR")
              and front.get(n, ("",))[0] in ("FAIL", "ERROR")
              and _kind(direct[n][1]) != _kind(front[n][1])]  # fmt: skip
    if unlike:
        print("\nFailing both ways, but not alike:")
        for name in unlike:
            print(f"  {name}\n    directly:  {direct[name][1]}\n    the front: {front[name][1]}")
    return 1 if lost else 0


def _kind(why: str) -> str:
    """A failure's exception type (``AssertionError: ...`` → ``AssertionError``), so
    that failures differing only in their values (a random pick, a port) are alike."""
    return why.split(":", 1)[0].strip()


if __name__ == "__main__":
    sys.exit(main())
