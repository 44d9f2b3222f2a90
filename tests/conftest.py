"""Shared fixtures: the scripted API server, chapter modules, isolated workspaces.

Chapters are imported once per test session (importing the SDK is slow) and
driven in-process with a client aimed at the scripted server. Before each test
every module-level container of the chapter (TOOLS, COMMANDS, ...) is put
back to its state right after import, and the test runs as a fresh agent
(AgentState) on its own workspace, so tests cannot leak into each other.
"""
import copy
import fcntl
import importlib
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import anthropic
import pytest

# The scripted server is on 127.0.0.1: never reach it through a proxy set in the environment
# (httpx honours HTTP(S)_PROXY; lowercase no_proxy wins over NO_PROXY where both are set).
for _var in ("NO_PROXY", "no_proxy"):
    _hosts = ["127.0.0.1", "localhost"] + [h.strip() for h in os.environ.get(_var, "").split(",")]
    os.environ[_var] = ",".join(h for h in dict.fromkeys(_hosts) if h)

# The memory side calls (s09) would take scripted replies meant for the loop: off for
# every process the suite starts, unless a test turns them on (marker memory).
os.environ["AGENT_AUTO_MEMORY"] = "0"

# What the shell running the suite may set, and the agent or its UI reads: a turn cap,
# a teammate's mark, a tmux session (teammates would open panes in it), colour and
# size. Tests that want one set it themselves.
for _var in ("AGENT_MAX_TURNS", "AGENT_TEAMMATE", "TMUX", "TMUX_PANE", "NO_COLOR", "FORCE_COLOR",
             "COLUMNS", "LINES"):
    os.environ.pop(_var, None)

ROOT = Path(__file__).resolve().parents[1]
TESTS = Path(__file__).resolve().parent
sys.path[:0] = [str(ROOT), str(TESTS)]

from fake_api import ScriptedAPI  # noqa: E402

CHAPTERS = sorted(p.stem for p in ROOT.glob("s[0-9][0-9]_*.py"))
if (ROOT / "agent_full.py").exists():
    CHAPTERS.append("agent_full")


def chapters_from(first):
    """The chapter that introduces a mechanism and every file after it."""
    return [c for c in CHAPTERS if c[:3] >= first or c == "agent_full"]


def pytest_collection_modifyitems(config, items):
    """Subprocess runs cost ~2 s each (Python start + SDK import), so a test
    marked e2e("sNN") runs on sNN and on the newest file, not on every file.
    slow("sNN") does the same for in-process tests that wait on a real timeout
    or run a long scripted session."""
    keep, drop = [], []
    for item in items:
        marker = item.get_closest_marker("e2e") or item.get_closest_marker("slow")
        name = getattr(item, "callspec", None) and item.callspec.params.get("mod")
        files = chapters_from(marker.args[0]) if marker else []
        (drop if marker and name and name not in (files[0], files[-1]) else keep).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep
    # The long tests first (a stable sort keeps the rest in order): with -n, a worker
    # that met a 40 s test at the end of the run would finish alone.
    items.sort(key=lambda item: not (item.get_closest_marker("e2e") or item.get_closest_marker("slow")))


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """-n without --dist: work stealing instead of xdist's "load". "load" hands out
    the tests in chunks and never takes them back, so the worker given the long
    tests at the front ends long after the other; with work stealing each worker
    starts on half the tests, and one that runs out takes half of what the other
    has left."""
    from xdist.scheduler import WorkStealingScheduling
    if config.getoption("dist") == "load" and not any(
            a == "-d" or a.startswith("--dist") for a in config.invocation_params.args):
        return WorkStealingScheduling(config, log)
    return None


_SNAPSHOTS = {}


def load(name):
    """Import a chapter once; remember its pristine module-level containers."""
    mod = importlib.import_module(name)
    if name not in _SNAPSHOTS:
        _SNAPSHOTS[name] = {k: copy.copy(v) for k, v in vars(mod).items()
                            if type(v) in (dict, list, set) and not k.startswith("__")}
    return mod


def restore(mod):
    for k, v in _SNAPSHOTS[mod.__name__].items():
        setattr(mod, k, copy.copy(v))


@pytest.fixture(scope="session")
def api_server():
    server = ScriptedAPI().start()
    yield server
    server.close()


@pytest.fixture
def api(api_server):
    """The scripted server, empty; fails the test if any request was invalid."""
    api_server.reset(full=True)         # a mid-test reset() keeps what was refused
    yield api_server
    bad = api_server.invalid()
    assert not bad, f"invalid request sent to the API: {bad[0]['error']}"


@pytest.fixture(scope="session")
def session_client(api_server):
    """One SDK client for the whole session. Building one loads the CA bundle (~35 ms
    of CPU, as much as an average test takes), and a client holds no state a test
    could leak: settings and a connection pool. The state of a conversation lives
    in the scripted server, which `api` resets for every test."""
    shared = anthropic.Anthropic(api_key="test", base_url=api_server.url, max_retries=0)
    yield shared
    shared.close()


@pytest.fixture
def client(api, session_client):
    return session_client


@pytest.fixture
def tmp_path(request, tmp_path_factory):
    """pytest's tmp_path, without its numbering: to number a test's folder it lists
    every folder made before it (one a test, ~4,500 per worker by the end), which
    cost ~3 ms a test. A random suffix needs no listing; the prefix names the test."""
    name = re.sub(r"\W", "_", request.node.name)[:30]
    return Path(tempfile.mkdtemp(prefix=f"{name}-", dir=tmp_path_factory.getbasetemp()))


@pytest.fixture
def workspace(tmp_path, monkeypatch, request):
    """A fresh project directory as cwd, and a fresh HOME for user-level state. The
    memory side calls (s09) are off unless the test is marked memory: they would
    take scripted replies meant for the loop."""
    ws, home = tmp_path / "ws", tmp_path / "home"
    ws.mkdir()
    home.mkdir()
    monkeypatch.chdir(ws)
    monkeypatch.setenv("HOME", str(home))
    for var in ("ANTHROPIC_API_KEY", "ANTHROPIC_AUTH_TOKEN", "ANTHROPIC_BASE_URL",
                "MODEL_ID", "AGENT_PERMISSION_MODE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("AGENT_AUTO_MEMORY", "1" if request.node.get_closest_marker("memory") else "0")
    return ws


@pytest.fixture
def mod(request, workspace):
    """The chapter named by the parametrisation, reset, with a fresh agent on the workspace."""
    m = load(request.param)
    restore(m)
    with m.acting_as(m.AgentState(workspace)) as state:
        if hasattr(m, "PERMISSION_MODES") and not request.node.get_closest_marker("permissions"):
            state.mode = "bypassPermissions"         # earlier mechanisms' tests: nobody is asked
            state.permissions["sandbox"]["enabled"] = False
        yield m


@pytest.fixture
def fast(mod, monkeypatch):
    """The chapter's retries without waiting (s06 and later)."""
    monkeypatch.setattr(mod, "RETRY_BASE_DELAY", 0.0)
    monkeypatch.setattr(mod, "RETRY_MAX_DELAY", 0.0)
    return mod


def message_bodies(api):
    """The bodies of Messages requests only (count_tokens calls are logged too)."""
    return [r["body"] for r in api.requests if r["path"].split("?")[0] == "/v1/messages"]


def run_turn(mod, api, client, steps, prompt="do the work"):
    """One user turn over a script that must be used up exactly; ends on 'Finished.'."""
    from fake_api import reply
    api.script(steps + [reply("Finished.")])
    history = [{"role": "user", "content": prompt}]
    assert mod.agent_loop(client, history) == "end_turn"
    assert api.remaining() == 0 and api.exhausted == 0
    return history


def strip_cache(obj):
    """A request body part without cache_control marks (s06 adds them to copies)."""
    if isinstance(obj, dict):
        return {k: strip_cache(v) for k, v in obj.items() if k != "cache_control"}
    if isinstance(obj, list):
        return [strip_cache(v) for v in obj]
    return obj


def run_chapter(name, *args, api=None, input=None, cwd=None, env=None, timeout=60):
    """Run a chapter file as a learner would: python sNN_x.py [args] < input."""
    full_env = {k: v for k, v in os.environ.items()
                if not k.startswith("ANTHROPIC") and k not in ("MODEL_ID", "AGENT_PERMISSION_MODE", "AGENT_AUTO_MEMORY")}
    if api is not None:
        full_env |= {"ANTHROPIC_API_KEY": "test", "ANTHROPIC_BASE_URL": api.url}
    if (name >= "s07" or name == "agent_full") and "AGENT_PERMISSION_MODE" not in (env or {}):
        full_env["AGENT_PERMISSION_MODE"] = "bypassPermissions"   # earlier mechanisms' runs
    if "AGENT_AUTO_MEMORY" not in (env or {}):
        full_env["AGENT_AUTO_MEMORY"] = "0"                       # no memory side calls (s09)
    full_env |= env or {}
    return subprocess.run([sys.executable, str(ROOT / f"{name}.py"), *args], input=input,
                          cwd=cwd, env=full_env, capture_output=True, text=True, timeout=timeout)


def once_per_run(tmp_path_factory, name, make):
    """make(folder) run once per test run, its JSON-able result shared: with -n, the
    first worker to get here runs it (the workers' temporary folders share a parent)
    while the others wait on a lock, then read what it saved."""
    base = tmp_path_factory.getbasetemp()
    root = (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / name
    root.mkdir(exist_ok=True)
    with open(root / "lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        saved = root / "runs.json"
        if not saved.exists():
            saved.write_text(json.dumps(make(root)))
        return json.loads(saved.read_text())
