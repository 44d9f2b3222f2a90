"""s12's worktree half, after a hostile review: what a child can leave in its lane
(a nested repository), what a lane may expose (secrets the main checkout hides),
where the project's own data lives while an agent works in a lane, work that
outlives its lane, names and bases, half-made lanes, the manager's git, and tests
for code paths the first tests could not tell apart from broken ones.

Like test_s12_worktrees.py, every test runs real git on a real repository (`repo`).
One test is the carried s07 sandbox fix, on s07 and every later file.
"""
import fcntl
import json
import os
import subprocess
import sys
import time
import types
from pathlib import Path

import pytest

from conftest import chapters_from, message_bodies, run_turn
from fake_api import reply, tool

S12 = chapters_from("s12")
in_s12 = pytest.mark.parametrize("mod", S12, indirect=True)

IDENTITY = ["-c", "user.name=test", "-c", "user.email=test@example.com"]
APP = "def parse(text):\n    return text.split(',')\n"


def git(where, *args, check=True, env=None):
    """git as the test (the human) runs it: stdout, stripped."""
    p = subprocess.run(["git", *IDENTITY, *args], cwd=where, capture_output=True, text=True, env=env)
    assert p.returncode == 0 or not check, p.stderr
    return p.stdout.strip()


@pytest.fixture
def repo(mod, workspace):
    """The workspace as a repository on main with one commit: app.py and a .gitignore."""
    git(workspace, "init", "-q", "-b", "main")
    (workspace / "app.py").write_text(APP)
    (workspace / ".gitignore").write_text(".agent/\n.env\nnode_modules/\n")
    git(workspace, "add", "-A")
    git(workspace, "commit", "-q", "-m", "first")
    return workspace


def lanes(workspace):
    folder = workspace / ".agent" / "worktrees"
    return sorted(p.name for p in folder.iterdir() if p.is_dir()) if folder.exists() else []


def events(workspace):
    path = workspace / ".agent" / "worktrees" / "events.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def refused(mod, handler, *args, **kwargs):
    with pytest.raises(mod.ToolError) as e:
        handler(*args, **kwargs)
    return str(e.value)


def call(mod, name, args):
    """One tool call through run_tool, as the loop makes it."""
    return mod.run_tool(types.SimpleNamespace(id="toolu_1", name=name, input=args))


def results(body):
    return [b for b in body["messages"][-1]["content"] if b.get("type") == "tool_result"]


def deny_read(mod, pattern, state=None):
    """A user-level Read(pattern) deny rule for the running agent (its lane's too)."""
    state = state or mod.agent_state()
    state.permissions["rules"].append(mod.parse_rule(f"Read({pattern})")
                                      | {"effect": "deny", "scope": "user", "file": "user config"})


@pytest.fixture
def sandboxed(mod):
    ok, why = mod.sandbox_available()
    if not ok:
        pytest.skip(f"the OS sandbox does not work here: {why}")
    mod.agent_state().permissions["sandbox"]["enabled"] = True   # the test default turns it off
    return mod


# --- s07 (carried): a masked folder and the files in it -------------------------------------

@pytest.mark.parametrize("mod", chapters_from("s07"), indirect=True)
def test_a_denied_folder_and_its_files_are_masked_once_and_bash_still_runs(sandboxed, workspace):
    """Read(./secrets/**) matches the folder and every file in it: bwrap masks the
    folder with a read-only tmpfs, and then could not bind /dev/null on a file in it."""
    mod = sandboxed
    (workspace / "secrets").mkdir()
    (workspace / "secrets" / "prod.key").write_text("PROD-KEY\n")
    deny_read(mod, "./secrets/**")
    assert {str(workspace / "secrets"), str(workspace / "secrets" / "prod.key")} <= set(mod.masked_paths(mod.agent_state()))
    assert mod.run_bash("echo hi").strip() == "hi"
    out = mod.run_bash("ls secrets; cat secrets/prod.key 2>&1; true")
    assert "PROD-KEY" not in out and "No such file" in out
