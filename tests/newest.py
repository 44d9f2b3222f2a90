#!/usr/bin/env python3
"""The range we claim is the range we test: the tests that touch the SDK and the
other libraries, run on the newest versions requirements.txt's ranges allow.

    python tests/newest.py            # what .ci/run does after the suite on the lock

It makes a virtual environment (.ci-newest/, git-ignored) from the ranges alone
(requirements.txt without its `-c constraints.txt` line), runs TESTS there, and
prints one line per failing test naming the versions that differ from the lock.
It reports and never fails: an upstream release must not block a landing. When
it is red, the next change adapts the code to both versions or narrows the range,
and says which in its commit.
"""
import json
import os
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
VENV = ROOT / ".ci-newest"
TESTS = [  # the scripted API, streaming, recovery, request bodies, headless output, MCP
    "tests/test_fake_api.py", "tests/test_s01_loop.py", "tests/test_s06_recovery.py",
    "tests/test_history_cache.py", "tests/test_full_request_review.py", "tests/test_full_headless.py",
    "tests/test_s12_mcp.py", "tests/test_s12_mcp_review.py",
]


def installed(python):
    """{name: version} of what pip installed for that Python."""
    out = subprocess.run([python, "-m", "pip", "list", "--format=json"], capture_output=True, text=True,
                         check=True).stdout
    return {p["name"].lower().replace("_", "-"): p["version"] for p in json.loads(out)}


def make_newest_env():
    """A fresh venv holding the newest versions the ranges allow; its python."""
    subprocess.run([sys.executable, "-m", "venv", "--clear", str(VENV)], check=True)
    python = str(VENV / "bin" / "python")
    ranges = [line for line in (ROOT / "requirements.txt").read_text().splitlines() if not line.startswith("-c ")]
    with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as f:
        f.write("\n".join(ranges) + "\n")
    try:
        subprocess.run([python, "-m", "pip", "install", "-q", "--upgrade", "-r", f.name], check=True,
                       capture_output=True, text=True)
    finally:
        os.unlink(f.name)
    return python


def failures(junit):
    """The node ids of the tests that failed or errored, from pytest's JUnit XML."""
    out = []
    for case in ET.parse(junit).getroot().iter("testcase"):
        if case.find("failure") is not None or case.find("error") is not None:
            path = case.get("classname", "").replace(".", "/")
            out.append(f"{path}.py::{case.get('name')}")
    return out


def main():
    started = time.monotonic()
    try:
        python = make_newest_env()
    except subprocess.CalledProcessError as e:
        print(f"newest: could not install the newest versions the ranges allow; nothing tested:\n"
              f"{(e.stderr or '').strip()[-500:]}")
        return 0
    lock = installed(sys.executable)
    newest = installed(python)
    differ = sorted(f"{name} {version} (lock {lock.get(name, 'none')})"
                    for name, version in newest.items() if lock.get(name) != version and name != "pip")
    print("newest: versions that differ from the lock: " + (", ".join(differ) or "none"))
    junit = VENV / "junit.xml"
    run = subprocess.run([python, "-m", "pytest", "-q", "-n", "2", "-p", "no:cacheprovider",
                          f"--junitxml={junit}", *TESTS], cwd=ROOT, capture_output=True, text=True)
    failed = failures(junit) if junit.exists() else []
    for test in failed:
        print(f"newest: fails there: {test}, with {', '.join(differ) or 'the lock versions'}")
    if run.returncode and not failed:
        print(f"newest: pytest exited {run.returncode}: {(run.stdout + run.stderr).strip()[-300:]}")
    elif not failed:
        print("newest: every one of these tests holds on the newest versions too")
    took = time.monotonic() - started
    print(f"newest: {len(failed)} test(s) red there, in {len(TESTS)} files; {took:.0f} s with the "
          f"install (reported, never failed)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
