#!/usr/bin/env python3
"""The range we claim is the range we test: the tests that touch the SDK and the
other libraries, run where the lock does not reach.

    python tests/newest.py            # what .ci/run does, before the suite on the lock
    python tests/newest.py --lowest   # the lowest versions the ranges allow (.ci/lock runs it)

Each check makes a virtual environment under .ci-newest/ (git-ignored), installs
into it, runs TESTS there and prints one line per failing test naming the
versions that differ from the lock (constraints.txt, for that Python):
  newest   the newest versions requirements.txt's ranges allow (its `-c` line
           dropped), on this Python;
  oldest   the lock itself on the oldest Python the README claims, when one is
           installed here (the lock resolves some packages differently there);
  lowest   the lowest versions of the packages we name (a resolver picks them).
It reports and never fails: an upstream release must not block a landing. When
it is red, the next change adapts the code to both versions or narrows the range,
and says which in its commit.
"""
import glob
import json
import os
import shutil
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
WORK = ROOT / ".ci-newest"
OLDEST_PYTHON = "3.10"  # the README's claim
UV = "uv==0.13.9"       # the resolver for --lowest, pinned so its answer is repeatable
RUN_TIMEOUT = 600       # seconds one check's tests may take before it is reported as hung
TESTS = [  # the scripted API, streaming, recovery, request bodies, headless output, MCP, cron, the UI
    "tests/test_fake_api.py", "tests/test_s01_loop.py", "tests/test_s06_recovery.py",
    "tests/test_history_cache.py", "tests/test_full_request_review.py", "tests/test_full_headless.py",
    "tests/test_s12_mcp.py", "tests/test_s12_mcp_review.py", "tests/test_s10_schedules.py",
    "tests/test_full_ui.py",
]


def say(line):
    print(f"ranges: {line}", flush=True)


def ranges():
    """requirements.txt's lines without the lock."""
    return [line for line in (ROOT / "requirements.txt").read_text().splitlines()
            if not line.startswith(("-c ", "--constraint"))]


def pinned(python):
    """{name: version} the lock pins for that Python (its markers evaluated there)."""
    code = ("import json,sys\nfrom packaging.markers import Marker\nout={}\n"
            "for line in open(sys.argv[1]):\n"
            "    req, _, marker = line.split('#')[0].partition(';')\n"
            "    if '==' in req and (not marker.strip() or Marker(marker).evaluate()):\n"
            "        name, version = req.split('==')\n"
            "        out[name.strip().lower().replace('_','-')] = version.strip()\n"
            "print(json.dumps(out))")
    run = subprocess.run([python, "-c", code, str(ROOT / "constraints.txt")], capture_output=True, text=True)
    return json.loads(run.stdout) if run.returncode == 0 else {}


def installed(python):
    out = subprocess.run([python, "-m", "pip", "list", "--format=json"], capture_output=True, text=True,
                         check=True).stdout
    return {p["name"].lower().replace("_", "-"): p["version"] for p in json.loads(out)}


def venv(name, base=sys.executable):
    path = WORK / name
    subprocess.run([base, "-m", "venv", "--clear", str(path)], check=True, capture_output=True)
    return str(path / "bin" / "python")


def pip(python, *args):
    subprocess.run([python, "-m", "pip", "install", "-q", *args], check=True, capture_output=True, text=True)


def newest_env():
    python = venv("newest")
    (WORK / "ranges.txt").write_text("\n".join(ranges()) + "\n")
    pip(python, "--upgrade", "-r", str(WORK / "ranges.txt"))
    return python


def lowest_env():
    python = venv("lowest")
    (WORK / "ranges.txt").write_text("\n".join(ranges()) + "\n")
    pip(python, UV)
    pins = subprocess.run([str(Path(python).parent / "uv"), "pip", "compile", "--quiet", "--resolution",
                           "lowest-direct", "--no-header", str(WORK / "ranges.txt")],
                          capture_output=True, text=True, check=True).stdout
    (WORK / "lowest.txt").write_text(pins)
    pip(python, "-r", str(WORK / "lowest.txt"))
    return python


def oldest_python():
    """An interpreter of OLDEST_PYTHON that runs, or None."""
    found = [shutil.which(f"python{OLDEST_PYTHON}")]
    found += sorted(glob.glob(os.path.expanduser(f"{os.getenv('PYENV_ROOT', '~/.pyenv')}/versions/"
                                                 f"{OLDEST_PYTHON}.*/bin/python")))
    for candidate in filter(None, found):
        if subprocess.run([candidate, "-c", "pass"], capture_output=True).returncode == 0:
            return candidate
    return None


def oldest_env():
    base = oldest_python()
    if base is None:
        return None
    python = venv("oldest", base)
    pip(python, "-r", str(ROOT / "requirements.txt"))
    return python


def failures(junit):
    """(node ids of the tests that failed or errored, how many ran), from pytest's JUnit XML."""
    failed, ran = [], 0
    for case in ET.parse(junit).getroot().iter("testcase"):
        ran += 1
        if case.find("failure") is not None or case.find("error") is not None:
            module = case.get("classname") or case.get("name") or "?"   # a file that did not even import
            name = case.get("name") if case.get("classname") else ""
            failed.append(f"{module.replace('.', '/')}.py" + (f"::{name}" if name else " (could not be collected)"))
    return failed, ran


def check(label, make_env, lock_python=sys.executable):
    started = time.monotonic()
    try:
        python = make_env()
    except subprocess.CalledProcessError as e:
        say(f"{label}: could not install; nothing tested: {' '.join((e.stderr or '').split())[-300:]}")
        return
    if python is None:
        say(f"{label}: no Python {OLDEST_PYTHON} here; the oldest claimed version is not run")
        return
    lock, have = pinned(python) or pinned(lock_python), installed(python)
    differ = sorted(f"{n} {v} (lock {lock.get(n, 'none')})" for n, v in have.items()
                    if lock.get(n) not in (None, v) and n not in ("pip", "setuptools", "uv"))
    say(f"{label}: versions that differ from the lock: " + (", ".join(differ) or "none"))
    junit = WORK / f"{label}.xml"
    junit.unlink(missing_ok=True)
    try:
        run = subprocess.run([python, "-m", "pytest", "-q", "-n", "2", "-p", "no:cacheprovider",
                              f"--junitxml={junit}", *TESTS], cwd=ROOT, capture_output=True, text=True,
                             timeout=RUN_TIMEOUT)
    except subprocess.TimeoutExpired:
        say(f"{label}: the tests did not finish within {RUN_TIMEOUT} s: reported as hung")
        return
    failed, ran = failures(junit) if junit.exists() else ([], 0)
    for test in failed:
        say(f"{label}: fails there: {test}, with {', '.join(differ) or 'the lock versions'}")
    if not ran:
        tail = (run.stdout + run.stderr).strip().splitlines()[-3:]
        say(f"{label}: nothing ran (pytest exit {run.returncode}): " + " | ".join(tail))
    elif not failed:
        say(f"{label}: all {ran} hold")
    say(f"{label}: {len(failed)} of {ran} red; {time.monotonic() - started:.0f} s with the install "
        f"(reported, never failed)")


def main(argv):
    WORK.mkdir(exist_ok=True)
    if "--lowest" in argv:
        check("lowest", lowest_env)
        return 0
    check("newest", newest_env)
    check("oldest", oldest_env)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
