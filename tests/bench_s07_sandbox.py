#!/usr/bin/env python3
"""Benchmark (not a test): what the OS sandbox adds to one bash call.

    python tests/bench_s07_sandbox.py [--runs 30] [--chapter s07_permissions]

Runs the chapter's own run_bash on a trivial command (`true`) in a throwaway
workspace, with the sandbox off (the plain shell) and on (bubblewrap), and
prints the median wall time of each side by side and the difference; the
same for a command that does a little work (git status), and for the bare
process without run_bash around it (subprocess.run of `bash -c true` versus
the sandbox's argv), which shows how much of the difference is bwrap itself
and how much is run_bash waiting for a longer-lived process. Then the cost of
the trial run that decides once per process whether the sandbox works
(sandbox_available, cache cleared before each run). The workspace is a git
repository with the agent's config and skills, so the bind mounts are the
ones a real project gets. Figures only; nothing here can fail.
"""
import argparse
import importlib
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def median_ms(fn, runs):
    times = []
    for _ in range(runs):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times) * 1000


def project(root):
    """A small project: a git repository (hooks, config), the agent's config and skills."""
    subprocess.run(["git", "init", "-q", str(root)], check=True)
    for d in (".agent/skills/review", "src"):
        (root / d).mkdir(parents=True)
    for f, text in {".agent/config.yaml": "{}\n", "src/app.py": "print('hi')\n"}.items():
        (root / f).write_text(text)


def row(label, plain, boxed):
    print(f"  {label:32} {plain:9.1f} ms {boxed:9.1f} ms {boxed - plain:+7.1f} ms")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=30)
    ap.add_argument("--chapter", default="s07_permissions")
    args = ap.parse_args()
    mod = importlib.import_module(args.chapter)
    ok, why = mod.sandbox_available()
    if not ok:
        print(f"the OS sandbox does not work here: {why}")
        return
    on = mod.sandbox_settings
    off = lambda: {**mod.SANDBOX_DEFAULTS, "enabled": False}  # noqa: E731
    with tempfile.TemporaryDirectory() as tmp:
        project(Path(tmp))
        mod.CURRENT.set(mod.AgentState(tmp))
        print(f"median of {args.runs} runs each; a git workspace with the usual protected paths\n")
        print(f"  {'call':32} {'unsandboxed':>12} {'sandboxed':>12} {'added':>10}")
        for command in ["true", "git status --short"]:
            mod.sandbox_settings = off
            plain = median_ms(lambda: mod.run_bash(command), args.runs)
            mod.sandbox_settings = on
            boxed = median_ms(lambda: mod.run_bash(command), args.runs)
            row(f"run_bash({command!r})", plain, boxed)
        protected, masked = mod.sandbox_paths(tmp)
        argv = mod.sandbox_argv("true", tmp, protected, masked)
        plain = median_ms(lambda: subprocess.run(["bash", "-c", "true"], cwd=tmp), args.runs)
        boxed = median_ms(lambda: subprocess.run(argv, cwd=tmp), args.runs)
        row("bare process, `true`", plain, boxed)

    def trial():
        mod.sandbox_available.cache_clear()
        mod.sandbox_available()
    runs = max(args.runs // 3, 5)
    print(f"\n  trial run (once per process), median of {runs}: {median_ms(trial, runs):.1f} ms")


if __name__ == "__main__":
    main()
