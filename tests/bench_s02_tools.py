#!/usr/bin/env python3
"""Benchmark (not a test): grep speed and parallel tool calls, side by side.

    python tests/bench_s02_tools.py [--files 20000] [--runs 5]

Builds a throwaway tree of N source-like files (with a .gitignore'd build/
folder), then prints median wall times for:
  1. the grep tool with ripgrep on PATH,
  2. the grep tool's pure-Python fallback,
  3. rg run directly (the floor: what the tool adds on top is parsing),
and the wall time of 4 concurrency-safe calls (grep) run through run_tools
(parallel) versus one after another. Figures only; nothing here can fail.
"""
import argparse
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import s02_tools as s02  # noqa: E402

WORDS = "alpha beta gamma delta request response handler client server cache token".split()


def build_tree(root, n):
    rnd = random.Random(7)
    (root / ".gitignore").write_text("build/\n")
    for i in range(n):
        d = root / ("build" if i % 10 == 0 else f"pkg{i % 50}") / f"mod{i % 37}"
        d.mkdir(parents=True, exist_ok=True)
        lines = [" ".join(rnd.choices(WORDS, k=8)) for _ in range(30)]
        if i % 97 == 0:
            lines[rnd.randrange(30)] += "  # NEEDLE: fix me"
        (d / f"f{i}.py").write_text("\n".join(lines) + "\n")


def median_time(fn, runs):
    times = []
    for _ in range(runs):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--files", type=int, default=20_000)
    ap.add_argument("--runs", type=int, default=5)
    args = ap.parse_args()
    rg = shutil.which("rg")
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        build_tree(root, args.files)
        s02.CURRENT.set(s02.AgentState(root))
        print(f"tree: {args.files} files under a temporary directory; median of {args.runs} runs\n")
        rows = []
        if rg:
            rows.append(("grep tool, ripgrep", median_time(lambda: s02.grep("NEEDLE"), args.runs)))
        real_which = shutil.which
        s02.shutil.which = lambda name: None
        rows.append(("grep tool, Python fallback", median_time(lambda: s02.grep("NEEDLE"), args.runs)))
        s02.shutil.which = real_which
        if rg:
            cmd = [rg, "-l", "--hidden", "--no-require-git", "NEEDLE", str(root)]
            rows.append(("rg directly", median_time(lambda: subprocess.run(cmd, capture_output=True), args.runs)))
        else:
            print("(ripgrep not installed: rows 1 and 3 skipped)")
        base = rows[-1][1]
        for name, t in rows:
            print(f"  {name:28} {t * 1000:9.1f} ms   {t / base:5.1f}x rg")

        s02.say = lambda text: None
        mixes = {
            "4 greps (rg is already multi-threaded)": [
                ("grep", {"pattern": p, "output_mode": "count"})
                for p in ["NEEDLE", "fix me", "gamma delta alpha", "token handler server"]],
            "glob + 3 greps (Python walk overlaps rg)": [
                ("glob", {"pattern": "**/*.py"}), ("grep", {"pattern": "NEEDLE"}),
                ("grep", {"pattern": "gamma delta alpha"}), ("grep", {"pattern": "fix me"})],
        }
        cores = len(os.sched_getaffinity(0))
        print(f"\n4 concurrency-safe calls in one reply ({cores} cores):")
        for label, spec in mixes.items():
            calls = [SimpleNamespace(id=f"t{i}", name=n, input=a) for i, (n, a) in enumerate(spec)]
            parallel = median_time(lambda: s02.run_tools(calls, []), args.runs)
            serial = median_time(lambda: [s02.run_tool(c) for c in calls], args.runs)
            print(f"  {label:42} parallel {parallel * 1000:8.1f} ms   serial {serial * 1000:8.1f} ms"
                  f"   speed-up {serial / parallel:.2f}x")

if __name__ == "__main__":
    main()
