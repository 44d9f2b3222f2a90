#!/usr/bin/env python3
"""Mutation check, run by hand (not by CI; pytest does not collect this file).

Each mutant is one small change to a chapter or to the scripted API that the
suite must notice. It is applied to a scratch copy of the repository (the
files git knows, as they are in the working tree, so uncommitted test edits
count), the test files named for it run there with -x, and the mutant is

    killed          a test failed, as it should
    survived        every test passed: the suite misses this change
    not applicable  the old text is not in the file (the code moved or changed:
                    update the mutant's old text) or occurs more than once

Usage:
    python tests/mutants.py                 # every mutant
    python tests/mutants.py grep-limit ...  # only these (by name)
    python tests/mutants.py --list
    python tests/mutants.py --without "documented_default or fit_together"
                                            # do the behaviour tests alone catch them?

Exit status 1 when any mutant survived (or a baseline run failed), else 0.

To add or update a mutant, copy the exact old text from the file (whitespace
included; make it long enough to be unique) and write the new text beside it.
"""
import argparse
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CH = "s06_compact.py"           # the chapter the audit mutated
ONLY = "s06_compact"            # pytest -k: only the mutated chapter's parametrisations

# (name, file, old text, new text, test files, -k expression or None)
MUTANTS = [
    # documented defaults
    ("max-turns", CH, "MAX_TURNS = 50 ", "MAX_TURNS = 10000 ",
     ["tests/test_limits.py", "tests/test_agent_state.py"], ONLY),
    ("subagent-max-turns", CH, "SUBAGENT_MAX_TURNS = 30 ", "SUBAGENT_MAX_TURNS = 10000 ",
     ["tests/test_limits.py", "tests/test_s04_subagent.py"], ONLY),
    ("working-budget", CH, "WORKING_BUDGET = 40_000 ", "WORKING_BUDGET = 150_000 ",
     ["tests/test_limits.py", "tests/test_s06_compact.py"], ONLY),
    ("max-tokens", CH, "MAX_TOKENS = 8_000 ", "MAX_TOKENS = 10_000_000 ",
     ["tests/test_limits.py"], ONLY),
    ("max-continuations", CH, "MAX_CONTINUATIONS = 3 ", "MAX_CONTINUATIONS = 100 ",
     ["tests/test_limits.py", "tests/test_s06_compact.py"], ONLY),
    ("max-output", CH, "MAX_OUTPUT = 30_000 ", "MAX_OUTPUT = 300_000 ",
     ["tests/test_limits.py", "tests/test_s02_tools.py"], ONLY),
    ("grep-limit", CH, "GREP_LIMIT = 250 ", "GREP_LIMIT = 100_000 ",
     ["tests/test_limits.py", "tests/test_s02_tools.py"], ONLY),
    ("reattach-files", CH, "REATTACH_FILES = 5 ", "REATTACH_FILES = 50 ",
     ["tests/test_limits.py", "tests/test_s06_compact.py"], ONLY),
    # tool input types
    ("check-input-accepts-bool", CH,
     "if want and (not isinstance(value, want) or (want is int and isinstance(value, bool))):",
     "if want and not isinstance(value, want):",
     ["tests/test_limits.py", "tests/test_s02_tools.py"], ONLY),
    # compaction
    ("compact-keeps-stale-usage", CH,
     '        m.pop("_usage", None)  # sizes measured before the cut mean nothing now\n',
     "        pass\n",
     ["tests/test_s06_edges.py", "tests/test_s06_compact.py"], ONLY),
    ("reattach-ignores-tail", CH,
     "for p in dict.fromkeys(p for p in paths if isinstance(p, str) and p not in in_tail):",
     "for p in dict.fromkeys(p for p in paths if isinstance(p, str)):",
     ["tests/test_s06_compact.py", "tests/test_s06_edges.py"], ONLY),
    ("summary-retry-drops-nothing", CH,
     "            older = older[max(1, len(older) // 5):]\n", "            older = older\n",
     ["tests/test_s06_edges.py", "tests/test_s06_compact.py"], ONLY),
    ("summary-no-retry", CH,
     "    for attempt in range(MAX_COMPACT_FAILURES):\n", "    for attempt in range(1):\n",
     ["tests/test_s06_edges.py", "tests/test_s06_compact.py"], ONLY),
    ("clear-ignores-keep-results", CH,
     "    old = results[:-KEEP_RESULTS] if KEEP_RESULTS else results\n",
     "    old = results[:-1]\n",
     ["tests/test_s06_compact.py"], ONLY),
    # subagent bill
    ("bill-ignores-cache", CH,
     'usage["input"] += (u.input_tokens + (u.cache_read_input_tokens or 0)  # s06: cached tokens\n'
     '                       + (u.cache_creation_input_tokens or 0))  # s06: were sent too, billed cheaper',
     'usage["input"] += u.input_tokens',
     ["tests/test_s06_edges.py", "tests/test_s04_subagent.py"], ONLY),
    # saved results
    ("preview-mid-line", CH,
     "    return preview[:cut] if cut > PREVIEW_CHARS // 2 else preview\n",
     "    return preview\n",
     ["tests/test_s06_edges.py", "tests/test_s06_compact.py"], ONLY),
    # path sandbox
    ("sandbox-off", CH,
     "    if not path.is_relative_to(root):\n        raise ToolError(f\"{p} is outside the workspace",
     "    if False:\n        raise ToolError(f\"{p} is outside the workspace",
     ["tests/test_s02_tools.py"], ONLY),
    ("pattern-guard-off", CH,
     '    if pattern.startswith(("/", "~")) or ".." in pattern.split("/"):\n',
     "    if False:\n",
     ["tests/test_s02_tools.py"], ONLY),
    # the scripted API's validator (the checks as written after the request-validation rework)
    ("api-tool-use-id-type", "tests/fake_api.py",
     "    if not isinstance(value, str):\n"
     '        raise _Invalid(f"{path}: Input should be a valid string")\n'
     "    if not _TOOL_ID.match(value):\n",
     "    if not _TOOL_ID.match(value):\n",
     ["tests/test_fake_api.py"], None),
    ("api-thinking-signature", "tests/fake_api.py",
     'fields = ("thinking", "signature") if kind == "thinking" else ("data",)',
     'fields = ("thinking",) if kind == "thinking" else ("data",)',
     ["tests/test_fake_api.py"], None),
    # the beta fields the real CLI sends: accepted, and still checked
    ("api-tool-flags-unchecked", "tests/fake_api.py",
     '        for flag in ("defer_loading", "strict", "eager_input_streaming"):\n',
     "        for flag in ():\n",
     ["tests/test_fake_api.py"], None),
    ("api-system-message-first", "tests/fake_api.py",
     "        if i == 0:\n            raise _Invalid(f'{path}.role: first message",
     "        if False:\n            raise _Invalid(f'{path}.role: first message",
     ["tests/test_fake_api.py"], None),
]


def tracked_files():
    """What git would commit: tracked files plus untracked ones not ignored."""
    out = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                         cwd=ROOT, capture_output=True, check=True).stdout
    return [name for name in out.decode().split("\0") if name and (ROOT / name).is_file()]


def scratch_copy(into):
    for name in tracked_files():
        (into / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / name, into / name)


def pytest(where, files, select, timeout, without=None):
    cmd = [sys.executable, "-m", "pytest", "-x", "-q", "-n", "2", "-p", "no:cacheprovider", *files]
    if without:
        select = f"({select or 'test'}) and not ({without})"
    cmd += ["-k", select] if select else []
    try:
        p = subprocess.run(cmd, cwd=where, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return None, f"timed out after {timeout}s"
    lines = [line for line in p.stdout.splitlines() if line.strip()]
    first = next((line.split(" - ")[0].split("::", 1)[-1] for line in lines
                  if line.startswith(("FAILED ", "ERROR "))), "")
    summary = lines[-1] if lines else p.stderr.strip()[-200:]
    return p.returncode, f"{summary}  {first}".rstrip()


def run(mutants, timeout, without=None):
    failed = False
    with tempfile.TemporaryDirectory(prefix="mutants-") as tmp:
        where = Path(tmp)
        scratch_copy(where)
        # each selection must pass unmutated, or "killed" would mean nothing
        baseline = {}
        for files, select in dict.fromkeys((tuple(m[4]), m[5]) for m in mutants):
            code, last = pytest(where, files, select, timeout, without)
            baseline[files, select] = None if code == 0 else last
            if code != 0:
                print(f"baseline FAILED: {' '.join(files)} -k {select}: {last}")
        print(f"{'mutant':30} {'result':15} {'secs':>5}  detail")
        for name, file, old, new, files, select in mutants:
            path = where / file
            original = path.read_text(encoding="utf-8")
            began = time.monotonic()
            count = original.count(old)
            if baseline[tuple(files), select]:
                result, detail = "baseline failed", baseline[tuple(files), select]
            elif count != 1:
                result, detail = "not applicable", ("old text not found" if count == 0 else
                                                    f"old text occurs {count} times")
            else:
                path.write_text(original.replace(old, new), encoding="utf-8")
                try:
                    code, detail = pytest(where, files, select, timeout, without)
                finally:
                    path.write_text(original, encoding="utf-8")
                result = {0: "survived", 5: "no tests ran", None: "killed (hung)"}.get(code, "killed")
            failed |= result in ("survived", "no tests ran", "baseline failed")
            print(f"{name:30} {result:15} {time.monotonic() - began:5.0f}  {detail}", flush=True)
    return 1 if failed else 0


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="*", help="mutants to run (default: all)")
    parser.add_argument("--list", action="store_true", help="list the mutants and exit")
    parser.add_argument("--timeout", type=int, default=900, help="seconds per pytest run")
    parser.add_argument("--without", metavar="EXPR", help="also deselect these tests (pytest -k)")
    args = parser.parse_args()
    if args.list:
        for name, file, _, _, files, _ in MUTANTS:
            print(f"{name:30} {file:20} {' '.join(files)}")
        return 0
    unknown = set(args.names) - {m[0] for m in MUTANTS}
    if unknown:
        print(f"unknown mutant(s): {', '.join(sorted(unknown))}; see --list")
        return 2
    return run([m for m in MUTANTS if not args.names or m[0] in args.names], args.timeout, args.without)


if __name__ == "__main__":
    sys.exit(main())
