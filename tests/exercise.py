#!/usr/bin/env python3
"""Workshop exercise checker: does your copy of a chapter do what the exercise asks?

    python tests/exercise.py s02.1 my_s02.py     # check your copy
    python tests/exercise.py s02.1               # check s02_tools.py itself: must fail
    python tests/exercise.py s02.1 --solution    # check the reference solution
    python tests/exercise.py --list              # every exercise, one line each

No API key and no network. The scripted Messages API the demos use
(tests/fake_api.py) plays the model, and your file is loaded in this process
and driven as the tests drive the chapters: a fresh module, a fresh agent and
a fresh workspace for every point, so one point cannot spoil the next. Each
point prints PASS or FAIL; the first failure also prints a hint. The exit
status is 0 when every point passes.

The exercises are in exercises/sNN.md; the checks in tests/exercise_checks/sNN.py
(reading them gives the exercise away); the reference solutions are patches,
exercises/solutions/sNN_K.patch, applied to a copy of the chapter by --solution.

A check module defines EXERCISES = {K: (title, [(point, hint, fn), ...])}.
Each fn(x) takes the Exercise context below and raises AssertionError (with
a message that says what it saw) when the point does not hold.
"""
import argparse
import contextlib
import functools
import importlib
import importlib.util
import io
import os
import shutil
import subprocess
import sys
import tempfile
import traceback
from pathlib import Path

TESTS = Path(__file__).resolve().parent
ROOT = TESTS.parent
sys.path[:0] = [str(TESTS)]

from packages import require  # noqa: E402

require()  # before pip install: one line that says how, not a traceback

from fake_api import ScriptedAPI, reply  # noqa: E402

MODULE = "exercise_target"      # the name your file is loaded under
_API = []                       # one scripted server per process, started on first use


# ----------------------------------------------------------------------------
# Finding things: the exercise, the chapter file, the solution
def chapter_file(chapter):
    """s02 -> ROOT/s02_tools.py (agent_full for "full")."""
    if chapter == "full":
        return ROOT / "agent_full.py"
    found = sorted(ROOT.glob(f"{chapter}_*.py"))
    if not found:
        raise SystemExit(f"no chapter file for {chapter}")
    return found[0]


def load_checks(chapter):
    """The EXERCISES table of tests/exercise_checks/<chapter>.py."""
    path = TESTS / "exercise_checks" / f"{chapter}.py"
    if not path.exists():
        raise SystemExit(f"no exercises for {chapter} (looked for {path.relative_to(ROOT)})")
    spec = importlib.util.spec_from_file_location(f"exercise_checks_{chapter}", path)
    checks = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(checks)
    return checks.EXERCISES


def parse_name(name):
    """'s02.1' -> ('s02', 1), with one clear line for anything else."""
    chapter, _, k = name.partition(".")
    if not (k.isdigit() and (chapter[:1] == "s" and chapter[1:].isdigit() or chapter == "full")):
        raise SystemExit(f"exercise names look like s02.1, not {name!r} (see --list)")
    return chapter, int(k)


def solution_patch(chapter, k):
    return ROOT / "exercises" / "solutions" / f"{chapter}_{k}.patch"


def solution_source(chapter, k):
    """The chapter's text with the reference solution's patch applied (git apply, in a temp dir)."""
    src, patch = chapter_file(chapter), solution_patch(chapter, k)
    with tempfile.TemporaryDirectory() as tmp:
        shutil.copy(src, Path(tmp) / src.name)
        done = subprocess.run(["git", "apply", "--whitespace=nowarn", str(patch)],
                              cwd=tmp, capture_output=True, text=True)
        if done.returncode:
            raise RuntimeError(f"{patch.name} no longer applies to {src.name}: {done.stderr.strip()}")
        return (Path(tmp) / src.name).read_text()


# ----------------------------------------------------------------------------
# The context a check gets: your module, a workspace, the scripted model
class Exercise:
    """One point's world. x.mod is your file, freshly loaded; x.ws the workspace
    (also the cwd); x.api the scripted server, empty; x.client a client aimed
    at it; x.state the agent the point runs as (s07 and later: bypassPermissions,
    sandbox off, unless the check sets x.state.mode itself)."""

    def __init__(self, mod, ws, api, client):
        self.mod, self.ws, self.api, self.client = mod, ws, api, client
        self.state = None
        self._undo = []

    def turn(self, steps, prompt="do the work", finish="Finished."):
        """One user turn over scripted steps (then a final text reply); returns the history."""
        self.api.script(list(steps) + ([reply(finish)] if finish else []))
        history = [{"role": "user", "content": prompt}]
        self.reason = self.mod.agent_loop(self.client, history)
        return history

    def main(self, argv, stdin=""):
        """Your main(argv) in-process, stdin given; returns (exit code, stdout, stderr)."""
        out, err = io.StringIO(), io.StringIO()
        self.patch(sys, "stdin", io.StringIO(stdin))
        try:
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
                code = self.mod.main(argv)
        except SystemExit as e:
            code = e.code
        return code, out.getvalue(), err.getvalue()

    def bodies(self):
        """The Messages request bodies the point sent so far."""
        return [r["body"] for r in self.api.requests if r["path"].split("?")[0] == "/v1/messages"]

    def tool_results(self, history):
        """Every tool_result block in a history, in order."""
        return [b for m in history if m["role"] == "user" and isinstance(m["content"], list)
                for b in m["content"] if b.get("type") == "tool_result"]

    def patch(self, obj, name, value):
        """Set obj.name for this point only."""
        self._undo.append((obj, name, getattr(obj, name)))
        setattr(obj, name, value)

    def undo(self):
        for obj, name, old in reversed(self._undo):
            setattr(obj, name, old)


def api_server():
    if not _API:
        _API.append(ScriptedAPI().start())
    return _API[0]


def load_module(path, source):
    """A fresh module from your file's text, under one name, registered while it loads.
    The compiled code is kept (per file and text): every point runs the module's body
    afresh, but s12's 12,000 lines are compiled once, not once per point."""
    spec = importlib.util.spec_from_loader(MODULE, loader=None, origin=str(path))
    mod = importlib.util.module_from_spec(spec)
    mod.__file__ = str(path)
    sys.modules[MODULE] = mod
    exec(compiled(str(path), source), mod.__dict__)
    return mod


@functools.lru_cache(maxsize=8)
def compiled(path, source):
    return compile(source, path, "exec")


@contextlib.contextmanager
def world(path, source):
    """A workspace as cwd, a HOME of its own, the environment and cwd put back after."""
    import anthropic
    env, cwd = dict(os.environ), os.getcwd()
    tmp = Path(tempfile.mkdtemp(prefix="exercise-"))
    ws, home = tmp / "ws", tmp / "home"
    ws.mkdir(), home.mkdir()
    api = api_server()
    api.reset(full=True)
    try:
        os.chdir(ws)
        for var in ("ANTHROPIC_API_KEY", "ANTHROPIC_AUTH_TOKEN", "MODEL_ID", "AGENT_PERMISSION_MODE"):
            os.environ.pop(var, None)
        os.environ.update(HOME=str(home), ANTHROPIC_API_KEY="test", ANTHROPIC_BASE_URL=api.url,
                          AGENT_AUTO_MEMORY="0", NO_PROXY="127.0.0.1,localhost", no_proxy="127.0.0.1,localhost")
        mod = load_module(path, source)
        x = Exercise(mod, ws, api, anthropic.Anthropic(api_key="test", base_url=api.url, max_retries=0))
        with agent(mod, ws) as x.state:
            yield x
        x.undo()
    finally:
        os.chdir(cwd)
        os.environ.clear()
        os.environ.update(env)
        sys.modules.pop(MODULE, None)
        shutil.rmtree(tmp, ignore_errors=True)


@contextlib.contextmanager
def agent(mod, ws):
    """The point's agent, as the tests make one: nobody is asked, no sandbox (s07 on)."""
    if not hasattr(mod, "acting_as"):
        yield None
        return
    with mod.acting_as(mod.AgentState(ws)) as state:
        if hasattr(mod, "PERMISSION_MODES"):
            state.mode = "bypassPermissions"
            state.permissions["sandbox"]["enabled"] = False
        yield state


# ----------------------------------------------------------------------------
# Running an exercise's points
def run_point(path, source, fn):
    """None when the point holds, else what went wrong (one line or a short traceback)."""
    try:
        with world(path, source) as x:
            fn(x)
            bad = x.api.invalid()
            assert not bad, f"your file sent a request the API would reject: {bad[0]['error']}"
        return None
    except AssertionError as e:
        return str(e) or "the check's condition did not hold"
    except Exception as e:          # your code crashed: show where
        tb = traceback.extract_tb(e.__traceback__)
        where = next((f"{Path(f.filename).name}:{f.lineno}" for f in reversed(tb)
                      if f.filename == str(path)), "")
        return f"{type(e).__name__}: {e}" + (f" (at {where})" if where else "")


def check(name, path=None, source=None):
    """Run exercise `name` against a file: [(point, hint, None or failure)]."""
    chapter, k = parse_name(name)
    exercises = load_checks(chapter)
    if k not in exercises:
        raise SystemExit(f"{chapter} has exercises {', '.join(f'{chapter}.{n}' for n in exercises)}")
    path = Path(path) if path else chapter_file(chapter)
    if source is None:
        if not path.exists():
            raise SystemExit(f"no such file: {path}")
        source = path.read_text()
    return [(point, hint, run_point(path.resolve(), source, fn)) for point, hint, fn in exercises[k][1]]


def report(name, results, label, out=sys.stdout):
    chapter, k = parse_name(name)
    title = load_checks(chapter)[k][0]
    print(f"{name}  {title}  (checking {label})", file=out)
    hinted = False
    for point, hint, failure in results:
        print(f"  {'PASS' if failure is None else 'FAIL'}  {point}", file=out)
        if failure is not None:
            print(f"        saw: {failure.splitlines()[0][:300]}", file=out)
            if not hinted:
                print(f"        hint: {hint}", file=out)
                hinted = True
    passed = sum(f is None for _, _, f in results)
    print(f"{passed} of {len(results)} points pass.", file=out)
    return 0 if passed == len(results) else 1


def list_all():
    for path in sorted((TESTS / "exercise_checks").glob("*.py")):
        for k, (title, points) in load_checks(path.stem).items():
            print(f"{path.stem}.{k:<3} {title}  ({len(points)} points)")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("name", nargs="?", help="the exercise, e.g. s02.1")
    ap.add_argument("file", nargs="?", help="your copy of the chapter (default: the chapter itself)")
    ap.add_argument("--solution", action="store_true", help="check the reference solution")
    ap.add_argument("--list", action="store_true", help="list the exercises")
    args = ap.parse_args(argv)
    if args.list or not args.name:
        list_all()
        return 0
    chapter, k = parse_name(args.name)
    try:
        if args.solution:
            results = check(args.name, chapter_file(chapter), solution_source(chapter, k))
            label = f"{solution_patch(chapter, k).relative_to(ROOT)} applied"
        else:
            results = check(args.name, args.file)
            label = args.file or chapter_file(chapter).name
    except RuntimeError as e:
        print(e, file=sys.stderr)
        return 2
    return report(args.name, results, label)


if __name__ == "__main__":
    sys.exit(main())
