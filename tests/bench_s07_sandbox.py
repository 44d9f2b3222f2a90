#!/usr/bin/env python3
"""Benchmark (not a test): what the OS sandbox adds to one bash call.

    python tests/bench_s07_sandbox.py [--runs 30] [--chapter s07_permissions] [--before REV]

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
ones a real project gets.

Then the boundary's costs beside the chapter as it was at REV (default: before
the boundary's four rules): a sandboxed `git add` and commit; the git audit
alone (one snapshot before and one audit after a command: a walk of the
workspace and of git's folders) in a repository of 20,000 files; and
write_file, which writes through s02's door (a walk of descriptors, a
temporary file and a rename) where it wrote the path directly.
Figures only; nothing here can fail.
"""
import argparse
import importlib
import importlib.util
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


def chapter_at(rev, name, where):
    """The chapter as it was at a git revision, imported from a copy (no side effects)."""
    text = subprocess.run(["git", "show", f"{rev}:{name}.py"], cwd=ROOT, capture_output=True,
                          text=True, check=True).stdout
    path = Path(where) / f"{name}_before.py"
    path.write_text(text)
    spec = importlib.util.spec_from_file_location(path.stem, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def big_repo(root, files=20_000):
    """A committed repository of `files` small files in 200 folders."""
    project(root)
    for i in range(files):
        d = root / "src" / f"pkg{i % 200}"
        d.mkdir(exist_ok=True)
        (d / f"m{i}.py").write_text(f"x = {i}\n")
    subprocess.run(["git", "add", "-A"], cwd=root, check=True)
    subprocess.run(["git", "-c", "user.name=b", "-c", "user.email=b@b", "commit", "-qm", "big"],
                   cwd=root, check=True)


def audit_ms(mod, root, runs):
    """One snapshot and one audit: what each sandboxed command adds for git."""
    state = mod.AgentState(root)
    if hasattr(mod, "git_snapshot"):
        def once():
            state.git_before = mod.git_snapshot(mod.git_roots(state))
            mod.audit_git(state)
    else:
        def once():
            state.git_before = mod.git_pointers(state.workdir)
            mod.undo_git_redirects(state)
    return median_ms(once, runs)


def boundary(mod, old, runs):
    """The rows beside the chapter at --before."""
    print(f"\n  {'the boundary':32} {'before':>12} {'now':>12} {'added':>10}")
    for label, fn in [("sandboxed git add + commit", commit_ms), ("write_file, 1 KB", write_ms)]:
        with tempfile.TemporaryDirectory() as a, tempfile.TemporaryDirectory() as b:
            project(Path(a))
            project(Path(b))
            row(label, fn(old, Path(a), runs), fn(mod, Path(b), runs))
    with tempfile.TemporaryDirectory() as a:
        big_repo(Path(a))
        row("git audit, 20,000-file repo", audit_ms(old, Path(a), runs), audit_ms(mod, Path(a), runs))
        row("run_bash('true'), same repo", commit_ms(old, Path(a), runs, "true"),
            commit_ms(mod, Path(a), runs, "true"))


def commit_ms(mod, root, runs, command=None):
    """A sandboxed command's median: by default a change, git add and a commit."""
    with mod.acting_as(mod.AgentState(root)) as state:
        state.permissions["sandbox"]["enabled"] = True
        n = iter(range(10**6))
        return median_ms(lambda: mod.run_bash(command or f"echo {next(n)} > f.txt && git add -A && "
                                              f"git -c user.name=b -c user.email=b@b commit -qm x"), runs)


def write_ms(mod, root, runs):
    with mod.acting_as(mod.AgentState(root)):
        return median_ms(lambda: mod.write_file("src/out.txt", "x" * 1024), runs * 10)


def row(label, plain, boxed):
    print(f"  {label:32} {plain:9.1f} ms {boxed:9.1f} ms {boxed - plain:+7.1f} ms")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=30)
    ap.add_argument("--chapter", default="s07_permissions")
    ap.add_argument("--before", default="6f790bb", help="the revision to compare with")
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
    with tempfile.TemporaryDirectory() as where:
        boundary(mod, chapter_at(args.before, args.chapter, where), runs)


if __name__ == "__main__":
    main()
