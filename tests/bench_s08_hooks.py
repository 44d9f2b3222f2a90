#!/usr/bin/env python3
"""Benchmark (not a test): what command hooks add to one tool call.

    python tests/bench_s08_hooks.py [--runs 20] [--chapter s08_hooks]

Runs the chapter's own run_tool on a read_file of a small file, in process,
in a throwaway workspace (default mode: the read is allowed without a
question), with a fresh AgentState for each configuration:
  1. no hooks,
  2. one no-op pre_tool_use command hook (`true`),
  3. ten of them,
  4. ten whose condition does not match (tool == "bash"): they never spawn,
  5. ten that start Python (`python3 -c pass`, whichever python3 is on PATH),
  6. the same with this interpreter's full path (a python3 on PATH may be a
     version manager's shim, a shell script that costs more than Python),
and prints the median time per call side by side, what the hooks add, and
that divided by the number of hooks; then the bare process (`bash -c true`
through subprocess.run) for reference. Each hook that runs also writes its line
to .agent/hooks.log, as in a real session; the number of lines is printed as
a sanity check. Figures only; nothing here can fail.
"""
import argparse
import importlib
import os
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def median_ms(fn, runs):
    times = []
    for _ in range(runs):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times) * 1000


def hooks(mod, n, command="true", condition=None):
    """n pre_tool_use command hooks, loaded as from a trusted user config."""
    item = {"event": "pre_tool_use", "action": {"type": "command", "command": command}}
    item |= {"if": condition} if condition else {}
    return mod.read_hooks(Path("config.yaml"), {"hooks": [item] * n}, "user", trusted=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--chapter", default="s08_hooks")
    args = ap.parse_args()
    mod = importlib.import_module(args.chapter)
    mod.say = lambda text: None
    configs = [("no hooks", 0, {}),
               ("1 hook `true`", 1, {}),
               ("10 hooks `true`", 10, {}),
               ("10 hooks, condition false", 10, {"condition": 'tool == "bash"'}),
               ("10 hooks `python3 -c pass`", 10, {"command": "python3 -c pass"}),
               ("10 hooks, full python path", 10, {"command": f"{shlex.quote(sys.executable)} -c pass"})]
    block = SimpleNamespace(name="read_file", input={"path": "small.txt"}, id="toolu_bench")
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "small.txt").write_text("".join(f"line {i}\n" for i in range(20)))
        print(f"read_file of a 20-line file through run_tool; median of {args.runs} calls each; "
              f"{os.cpu_count()} cores\n  python3 on PATH: {shutil.which('python3')}; this "
              f"interpreter: {sys.executable}\n")
        print(f"  {'configuration':28} {'per call':>12} {'added':>12} {'per hook':>12}")
        base = None
        for label, n, options in configs:
            state = mod.AgentState(tmp)
            state.permissions["hooks"] = hooks(mod, n, **options)
            mod.CURRENT.set(state)
            if (result := mod.run_tool(block)).get("is_error"):  # a broken setup, not a slow one
                sys.exit(f"{label}: the call failed: {result['content']}")
            ms = median_ms(lambda: mod.run_tool(block), args.runs)
            base = ms if base is None else base
            added = f"{ms - base:+9.2f} ms" if n else f"{'-':>12}"
            each = f"{(ms - base) / n:9.2f} ms" if n else f"{'-':>12}"
            print(f"  {label:28} {ms:9.2f} ms {added} {each}")
        bare = median_ms(lambda: subprocess.run([shutil.which("bash") or "/bin/sh", "-c", "true"]),
                         args.runs)
        print(f"\n  for reference, the bare process: subprocess.run of `bash -c true` {bare:.2f} ms")
        log = Path(tmp) / ".agent" / "hooks.log"
        runs = len(log.read_text().splitlines()) if log.exists() else 0
        print(f"  {runs} hook runs logged in .agent/hooks.log "
              f"(expected {(args.runs + 1) * 31} unless it rotated at 1 MB)")


if __name__ == "__main__":
    main()
