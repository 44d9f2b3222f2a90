"""s12: git worktrees, with real git: lanes made, reused and set up; the tools and
their refusals; isolated subagents and teammates; the bookkeeping; and what a
cloned repository may plant.

Each test's workspace is a real repository with one commit (`repo`). The agent
loop runs against the scripted model; a subagent runs inside its parent's tool
call, so one linear script serves both. Two subprocess runs (marked e2e): a
session started with --worktree, and a lead whose teammate works in a lane.
"""
import json
import os
import shutil
import subprocess
import sys
import threading
import time
import types
from pathlib import Path

import pytest

from conftest import ROOT, chapters_from, message_bodies, run_chapter, run_turn
from fake_api import reply, tool

pytestmark = pytest.mark.parametrize("mod", chapters_from("s12"), indirect=True)

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


def branches(workspace):
    return git(workspace, "branch", "--format=%(refname:short)").split()


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


def test_no_top_level_name_is_defined_twice(mod):
    """A chapter adds names to one module: a second def of a name an earlier chapter
    uses (s09's included(), lock_path()) would silently replace it."""
    import ast
    tree = ast.parse(Path(mod.__file__).read_text(encoding="utf-8"))
    names = [n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef))]
    names += [t.id for n in tree.body if isinstance(n, ast.Assign) for t in n.targets if isinstance(t, ast.Name)]
    assert not {n for n in names if names.count(n) > 1}


# --- s12.1: the manager -------------------------------------------------------------------

def test_a_lane_is_made_on_its_branch_and_entered_without_a_chdir(mod, repo):
    state, cwd = mod.agent_state(), os.getcwd()
    mod.read_file("app.py")
    out = mod.worktree_create("fix-parser")
    lane = repo / ".agent" / "worktrees" / "fix-parser"
    assert out.startswith("Created worktree fix-parser from ") and "branch agent/fix-parser" in out
    assert git(lane, "rev-parse", "--abbrev-ref", "HEAD") == "agent/fix-parser"
    assert git(lane, "rev-parse", "HEAD") == git(repo, "rev-parse", "HEAD")
    assert os.getcwd() == cwd                                    # entering never chdirs the process
    assert state.workdir == lane and state.files == {}           # the agent's own workdir, fresh records
    assert mod.run_bash("pwd").strip() == str(lane)              # bash follows the agent, not the process
    assert "Read app.py with read_file" in refused(mod, mod.edit_file, "app.py", "split", "rsplit")
    mod.task_create("the parser")                                # the board is the project's
    assert (repo / ".agent" / "tasks" / "1.json").exists() and not (lane / ".agent" / "tasks").exists()
    out = mod.worktree_closeout("fix-parser", "keep")
    assert "Kept worktree fix-parser" in out and state.workdir == repo and state.worktree is None
    assert lanes(repo) == ["fix-parser"] and "agent/fix-parser" in branches(repo)


def test_an_existing_lane_is_reused_when_its_pointer_leads_to_a_valid_head(mod, repo):
    mod.worktree_create("fix")
    mod.write_file("wip.py", "x = 1\n")
    mod.worktree_closeout("fix", "keep")
    out = mod.worktree_create("fix", base="main")                          # where it is: no refusal
    assert out.startswith("Reused worktree fix")
    assert (repo / ".agent" / "worktrees" / "fix" / "wip.py").exists()       # the same checkout
    assert [e["event"] for e in events(repo)] == ["create", "enter", "leave", "keep", "reuse", "enter"]
    mod.worktree_closeout("fix", "keep")
    (repo / ".git" / "worktrees" / "fix" / "HEAD").write_text("ref: refs/heads/nowhere\n")
    assert "not a worktree of this repository" in refused(mod, mod.worktree_create, "fix")   # no valid HEAD


def test_a_lane_removed_by_hand_is_made_again_on_its_kept_branch(mod, repo):
    mod.worktree_create("fix")
    mod.worktree_closeout("fix", "keep")
    lane = repo / ".agent" / "worktrees" / "fix"
    git(lane, "commit", "-q", "--allow-empty", "-m", "kept work")
    shutil.rmtree(lane)                                          # git still has its record: prune
    assert mod.worktree_create("fix").startswith("Created worktree fix")
    assert git(lane, "log", "-1", "--format=%s") == "kept work"


@pytest.mark.parametrize("bad", ["..", "a/b", "x" * 65, "-rf", "--help", "a..b", "x.lock", "", "dot.",
                                 ".hidden", "sp ace", "caf\u00e9", "nul\0"])
def test_a_name_is_a_slug(mod, repo, bad):
    assert "not a worktree name" in refused(mod, mod.worktree_create, bad) or bad.startswith("-")
    if bad.startswith("-"):
        assert "git would read as an option" in refused(mod, mod.worktree_create, bad)
    assert "not a worktree name" in refused(mod, mod.worktree_closeout, bad, "remove") or bad.startswith("-")
    assert lanes(repo) == [] and branches(repo) == ["main"]


def test_a_base_that_is_an_option_or_no_commit_is_refused(mod, repo):
    out = call(mod, "worktree_create", {"name": "fix", "base": "--orphan"})
    assert out["is_error"] and "not an option" in out["content"]
    assert "is no commit here" in refused(mod, mod.worktree_create, "fix", base="nope")
    assert lanes(repo) == [] and branches(repo) == ["main"]
    git(repo, "tag", "v1")
    assert "Created worktree fix from" in mod.worktree_create("fix", base="v1")
    assert mod.worktree_closeout("fix", "remove").startswith("Removed worktree fix")


def test_outside_a_repository_or_its_top_folder_a_lane_cannot_be_made(mod, workspace):
    assert "need a git repository" in refused(mod, mod.worktree_create, "fix")
    git(workspace, "init", "-q", "-b", "main")
    assert "no commit yet" in refused(mod, mod.worktree_create, "fix")
    (workspace / "sub").mkdir()
    with mod.acting_as(mod.AgentState(workspace / "sub")):
        assert "top folder" in refused(mod, mod.worktree_create, "fix")


def fsmonitor_trap(tmp_path):
    """A repository whose config runs a program (core.fsmonitor) when git looks at
    its working tree: the marker appears if any git command obeys it."""
    evil, marker = tmp_path / "evil", tmp_path / "pwned"
    git(tmp_path, "init", "-q", str(evil))
    git(evil, "commit", "-q", "--allow-empty", "-m", "bait")
    script = evil / "monitor.sh"
    script.write_text(f"#!/bin/sh\ntouch {marker}\n")
    script.chmod(0o755)
    git(evil, "config", "core.fsmonitor", str(script))
    return evil, marker


def test_a_planted_lane_with_a_pointer_elsewhere_is_left_alone(mod, repo, tmp_path):
    """A clone ships .agent/worktrees/evil, its .git naming another repository."""
    evil, marker = fsmonitor_trap(tmp_path)
    planted = repo / ".agent" / "worktrees" / "evil"
    planted.mkdir(parents=True)
    (planted / ".git").write_text(f"gitdir: {evil}/.git\n")
    (planted / "app.py").write_text("planted\n")
    for handler, args in ((mod.worktree_create, ("evil",)), (mod.worktree_closeout, ("evil", "remove"))):
        assert "not a worktree of this repository" in refused(mod, handler, *args)
    assert "evil  [not a worktree of this repository: left alone]" in mod.worktree_list()
    # an admin folder of this repository that names another folder is no better
    mod.worktree_create("real")
    mod.worktree_closeout("real", "keep")
    impostor = repo / ".agent" / "worktrees" / "impostor"
    impostor.mkdir()
    (impostor / ".git").write_text((repo / ".agent" / "worktrees" / "real" / ".git").read_text())
    assert "not a worktree of this repository" in refused(mod, mod.worktree_create, "impostor")
    assert not marker.exists() and (planted / "app.py").read_text() == "planted\n"
    assert mod.agent_state().workdir == repo


def test_a_linked_worktrees_folder_is_refused(mod, repo, tmp_path):
    (tmp_path / "elsewhere").mkdir()
    (repo / ".agent").mkdir()
    (repo / ".agent" / "worktrees").symlink_to(tmp_path / "elsewhere")
    assert "leads outside" in refused(mod, mod.worktree_create, "fix")
    assert list((tmp_path / "elsewhere").iterdir()) == []


def test_setup_copies_local_config_carries_hooks_links_folders_and_copies_included_files(mod, repo, tmp_path,
                                                                                       monkeypatch):
    monkeypatch.setattr(mod, "find_dotenv", lambda *a, **k: "")   # the agent's own .env is never copied
    agent = repo / ".agent"
    agent.mkdir()
    (agent / "config.local.yaml").write_text("permissions: {deny: ['bash(rm *)']}\n")
    (agent / "config.yaml").write_text("worktree:\n  symlink_directories: [node_modules, ../outside, .git, "
                                       "missing, /etc, '-x']\n")
    (repo / "node_modules" / "pkg").mkdir(parents=True)
    (repo / "node_modules" / "pkg" / "index.js").write_text("module.exports = 1\n")
    secret = tmp_path / "home-secret"
    secret.write_text("id_rsa\n")
    (repo / ".env").write_text("TOKEN=1\n")                               # ignored, selected: copied
    (repo / "linked.env").symlink_to(secret)                             # ignored link to a secret
    (repo / "build").mkdir()
    (repo / "build" / "big.env").write_text("b\n")                       # selected, but not ignored
    (agent / "notes.env").write_text("n\n")                              # the agent's own: never
    (repo / ".gitignore").write_text(".agent/\n.env\nnode_modules/\nlinked.env\n")
    (repo / ".worktreeinclude").write_text(".env\n*.env\n../*\n/etc/passwd\n")
    (repo / ".husky").mkdir()
    git(repo, "add", ".gitignore", ".worktreeinclude")
    git(repo, "commit", "-q", "-m", "setup files")
    git(repo, "config", "core.hooksPath", ".husky")                      # relative: the lane's own copy
    out = mod.worktree_create("fix")
    lane = repo / ".agent" / "worktrees" / "fix"
    assert "copied .agent/config.local.yaml" in out and "linked node_modules" in out
    assert "copied 1 ignored file(s)" in out and f"core.hooksPath set to {repo / '.husky'}" in out
    for skipped in ("../outside", ".git", "/etc", "-x"):
        assert f"skipped symlink_directories entry {skipped!r}" in out
    assert (lane / ".agent" / "config.local.yaml").read_text() == (agent / "config.local.yaml").read_text()
    assert (lane / "node_modules").is_symlink() and (lane / "node_modules" / "pkg" / "index.js").exists()
    assert os.readlink(lane / "node_modules") == str(repo / "node_modules")
    assert (lane / ".env").read_text() == "TOKEN=1\n" and not (lane / ".env").is_symlink()
    assert not os.path.lexists(lane / "linked.env") and not (lane / "build" / "big.env").exists()
    assert not (lane / ".agent" / "notes.env").exists() and not (lane / "missing").exists()
    assert git(lane, "config", "core.hooksPath") == str(repo / ".husky")
    assert git(repo, "config", "core.hooksPath") == ".husky"             # the main checkout's unchanged
    setup = [e for e in events(repo) if e["event"] == "create"][0]["setup"]
    assert "linked node_modules" in setup
    mod.worktree_closeout("fix", "remove")                               # the link goes, not its target
    assert (repo / "node_modules" / "pkg" / "index.js").exists() and lanes(repo) == []


def test_a_copy_never_goes_through_a_link_in_the_lane(mod, repo, tmp_path):
    """A checkout may hold a tracked link (conf -> somewhere outside): a copy into
    conf/ would land outside the lane."""
    outside = tmp_path / "outside"
    outside.mkdir()
    lane = tmp_path / "lane"
    lane.mkdir()
    (lane / "conf").symlink_to(outside)
    (repo / "x.env").write_text("secret\n")
    assert mod.copy_plain(repo / "x.env", lane / "conf" / "deep" / "x.env", lane) is None
    assert list(outside.iterdir()) == []
    assert mod.copy_plain(repo / "x.env", lane / "ok" / "x.env", lane) == 7
    assert (lane / "ok" / "x.env").read_text() == "secret\n"


def test_include_copies_are_bounded(mod, repo, monkeypatch):
    monkeypatch.setattr(mod, "INCLUDE_MAX_FILES", 2)
    (repo / "cache").mkdir()
    for n in range(5):
        (repo / "cache" / f"{n}.env").write_text("x\n")
    (repo / ".gitignore").write_text(".agent/\ncache/\n")
    (repo / ".worktreeinclude").write_text("cache/*.env\n")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "cache")
    out = mod.worktree_create("fix")
    assert "copied 2 ignored file(s)" in out and "3 more not copied" in out
    assert len(list((repo / ".agent" / "worktrees" / "fix" / "cache").iterdir())) == 2


# --- s12.2: the tools and the bookkeeping --------------------------------------------------

def test_remove_refuses_a_dirty_tree_unless_the_human_says_yes(mod, repo, monkeypatch):
    asked = []
    mod.worktree_create("fix")
    mod.write_file("wip.py", "unsaved work\n")
    monkeypatch.setattr(mod, "ask_human", lambda q: asked.append(q) or "n")
    out = call(mod, "worktree_closeout", {"name": "fix", "action": "remove"})
    assert out["is_error"] and "1 uncommitted change(s), and the user did not confirm" in out["content"]
    assert "Remove worktree fix and branch agent/fix?" in asked[0] and "1 uncommitted change(s)" in asked[0]
    assert lanes(repo) == ["fix"] and mod.agent_state().workdir == repo / ".agent" / "worktrees" / "fix"
    assert events(repo)[-1]["event"] == "remove_refused"
    monkeypatch.setattr(mod, "ask_human", lambda q: asked.append(q) or "y")
    assert mod.worktree_closeout("fix", "remove").startswith("Removed worktree fix and branch agent/fix.")
    assert lanes(repo) == [] and branches(repo) == ["main"] and mod.agent_state().workdir == repo


def test_remove_refuses_unmerged_commits_and_needs_no_yes_once_merged(mod, repo, monkeypatch):
    mod.worktree_create("fix")
    mod.write_file("new.py", "x = 1\n")
    state = mod.agent_state()
    state.worktree, commit = mod.commit_lane(state.worktree, "new.py")      # as the manager does
    mod.worktree_closeout("fix", "keep")
    asked = []
    monkeypatch.setattr(mod, "ask_human", lambda q: asked.append(q) or "")  # Enter: no
    assert "1 commit(s) no other branch has" in refused(mod, mod.worktree_closeout, "fix", "remove")
    assert "fix  [free] branch agent/fix" in mod.worktree_list() and "1 unmerged commit(s)" in mod.worktree_list()
    git(repo, "merge", "-q", "--ff-only", "agent/fix")
    assert mod.worktree_closeout("fix", "remove").startswith("Removed") and len(asked) == 1
    assert (repo / "new.py").read_text() == "x = 1\n" and branches(repo) == ["main"]


def test_a_lane_in_use_by_another_agent_cannot_be_removed_or_entered(mod, repo):
    other = mod.AgentState(repo)
    with mod.acting_as(other):
        mod.worktree_create("busy")
    assert "in use by another agent" in refused(mod, mod.worktree_closeout, "busy", "remove")
    assert "in use by another agent" in refused(mod, mod.worktree_create, "busy")
    assert "busy  [in use]" in mod.worktree_list()
    with mod.acting_as(other):
        assert "You are in worktree busy" in refused(mod, mod.worktree_create, "second")
        mod.worktree_closeout("busy", "keep")
    assert mod.worktree_closeout("busy", "remove").startswith("Removed")


def test_file_tools_never_write_the_lanes_folder_but_read_it(mod, repo):
    """The lanes' .git pointers, locks and log are the program's; work in a lane by entering it."""
    mod.worktree_create("fix")
    mod.worktree_closeout("fix", "keep")
    for path in (".agent/worktrees/fix/.git", ".agent/worktrees/events.jsonl", ".agent/worktrees/fix/app.py"):
        out = call(mod, "write_file", {"path": path, "content": "gitdir: ../../evil/.git\n"})
        assert out["is_error"] and "is protected" in out["content"], path
    assert "def parse" in call(mod, "read_file", {"path": ".agent/worktrees/fix/app.py"})["content"]
    assert (repo / ".agent" / "worktrees" / "fix" / ".git").read_text().startswith(f"gitdir: {repo}/.git/")


def test_an_agent_whose_lane_was_deleted_under_it_can_still_leave(mod, repo):
    mod.worktree_create("fix")
    shutil.rmtree(repo / ".agent" / "worktrees" / "fix")
    out = mod.worktree_closeout("fix", "keep")
    assert out.startswith("Worktree fix is gone") and mod.agent_state().workdir == repo
    assert mod.agent_state().worktree is None and mod.worktree_create("fix").startswith("Created")


def test_a_bad_action_or_an_unknown_lane_is_refused(mod, repo):
    assert "keep or remove" in refused(mod, mod.worktree_closeout, "fix", "merge")
    assert "No worktree fix" in refused(mod, mod.worktree_closeout, "fix", "keep")
    assert mod.worktree_list() == "No worktrees. worktree_create {name} makes one."


def test_a_task_is_bound_to_a_lane_and_unbound_when_it_goes(mod, repo):
    mod.task_create("the parser")
    mod.task_create("the docs")
    mod.task_update("1", worktree="fix")
    mod.task_update("2", worktree="fix", status="completed")
    assert "#1 [ready, worktree: fix] the parser" in mod.task_list()
    assert "worktree: fix" in mod.task_get("1")
    assert "not a worktree name" in refused(mod, mod.task_update, "1", worktree="../x")
    mod.worktree_create("fix")
    mod.worktree_closeout("fix", "keep")
    assert "tasks #1, #2" in mod.worktree_list()
    mod.worktree_closeout("fix", "remove")
    board = {p.stem: json.loads(p.read_text()) for p in (repo / ".agent" / "tasks").glob("*.json")}
    assert "worktree" not in board["1"] and board["2"]["worktree"] == "fix"   # the done one keeps its record
    mod.task_update("2", worktree="")
    assert "worktree" not in json.loads((repo / ".agent" / "tasks" / "2.json").read_text())


@pytest.mark.parametrize("rg", [True, False], ids=["ripgrep", "python"])
def test_glob_and_grep_never_list_the_lanes_unless_asked_inside(mod, repo, monkeypatch, rg):
    if rg and not shutil.which("rg"):
        pytest.skip("ripgrep is not installed")
    if not rg:
        real = shutil.which
        monkeypatch.setattr(mod.shutil, "which", lambda name: None if name == "rg" else real(name))
    mod.worktree_create("fix")
    mod.write_file("needle.py", "needle = 1\n")
    mod.worktree_closeout("fix", "keep")
    (repo / ".agent" / "notes.md").write_text("needle\n")
    (repo / ".agent" / "worktrees" / ".gitignore").unlink()      # its "*" is not what keeps them out
    for path in (".", ".agent"):
        assert "worktrees" not in mod.glob_files("**/*", path)
        assert "worktrees" not in mod.grep("needle", path)
    assert mod.grep("needle", ".agent") == ".agent/notes.md"
    inside = ".agent/worktrees/fix"
    assert mod.glob_files("*.py", inside).splitlines() == [f"{inside}/needle.py", f"{inside}/app.py"]
    assert mod.grep("needle", inside) == f"{inside}/needle.py"


def test_every_step_is_logged_and_the_log_is_bounded(mod, repo, monkeypatch):
    mod.worktree_create("fix")
    mod.worktree_closeout("fix", "remove")
    log = events(repo)
    assert [e["event"] for e in log] == ["create", "enter", "leave", "remove"]
    assert all(e["name"] == "fix" and e["by"] == "main" and e["pid"] == os.getpid() for e in log)
    monkeypatch.setattr(mod, "EVENTS_BYTES", (repo / ".agent" / "worktrees" / "events.jsonl").stat().st_size + 300)
    for n in range(5):
        mod.log_event(repo, "note", "fix", n=n)
    assert events(repo)[-1]["event"] == "log_full" and sum(e["event"] == "log_full" for e in events(repo)) == 1


def make_agent_lane(mod, repo, age=None, dirty=False, commit=False):
    """A lane as the program makes one for a child; aged (seconds unused) when asked."""
    lane, _ = mod.make_lane(repo, f"agent-{os.urandom(4).hex()}")
    if dirty or commit:
        (lane["path"] / "work.py").write_text("w\n")
    if commit:
        git(lane["path"], "add", "work.py")
        git(lane["path"], "commit", "-q", "-m", "work")
    if age:
        old = time.time() - age
        os.utime(lane["path"], (old, old))
    return lane


def test_start_up_removes_stale_agent_lanes_with_nothing_in_them(mod, repo):
    day = mod.STALE_WORKTREE_AGE
    stale = make_agent_lane(mod, repo, age=day + 60)
    young = make_agent_lane(mod, repo, age=day - 600)
    dirty = make_agent_lane(mod, repo, age=day + 60, dirty=True)
    ahead = make_agent_lane(mod, repo, age=day + 60, commit=True)
    busy = make_agent_lane(mod, repo, age=day + 60)
    fd = mod.lock_lane(busy, touch=False)                         # an agent of another process in it
    mod.make_lane(repo, "mine")                                   # named by a human or model: never
    old = time.time() - 2 * day
    os.utime(repo / ".agent" / "worktrees" / "mine", (old, old))
    planted = repo / ".agent" / "worktrees" / "agent-deadbeef"    # no worktree at all: left alone
    planted.mkdir()
    os.utime(planted, (old, old))
    try:
        assert mod.clean_stale_worktrees() == [stale["name"]]
    finally:
        os.close(fd)
    assert sorted(lanes(repo)) == sorted([young["name"], dirty["name"], ahead["name"], busy["name"],
                                          "mine", "agent-deadbeef"])
    assert f"agent/{stale['name']}" not in branches(repo) and f"agent/{ahead['name']}" in branches(repo)
    gone = [e for e in events(repo) if e["event"] == "remove"]
    assert [e["name"] for e in gone] == [stale["name"]] and "stale: unused for 24 h" in gone[0]["why"]


def test_start_up_looks_only_at_lanes_git_knows(mod, repo, monkeypatch):
    """A clone that plants a thousand agent-<hex> folders costs one git command, not 3000."""
    for n in range(1000):
        (repo / ".agent" / "worktrees" / f"agent-{n:08x}").mkdir(parents=True)
    monkeypatch.setattr(mod, "find_lane", lambda *a: pytest.fail("a planted folder was looked at"))
    assert mod.clean_stale_worktrees() == []


def test_lanes_are_capped_and_worktree_list_is_bounded(mod, repo, monkeypatch):
    monkeypatch.setattr(mod, "MAX_WORKTREES", 2)
    monkeypatch.setattr(mod, "WORKTREE_LIST_LIMIT", 1)
    mod.make_lane(repo, "one")
    mod.make_lane(repo, "two")
    assert "holds 2 worktrees, the most it may" in refused(mod, mod.worktree_create, "three")
    assert mod.worktree_create("two").startswith("Reused")          # an existing one still opens
    listing = mod.worktree_list().splitlines()
    assert listing[0] == "2 worktree(s) in .agent/worktrees:" and listing[-1] == "... and 1 more folders"
    assert len(listing) == 3


def test_a_teammate_in_a_lane_binds_the_task_it_claims(mod, repo):
    mod.create_team("crew")
    mod.add_member("alice", "writes the code")
    mod.task_create("the parser")
    key = mod.agent_state().team["key"]
    alice = mod.AgentState(repo)
    with mod.acting_as(alice):
        mod.join_team("crew", "alice", key)
        lane, _ = mod.make_lane(repo, "agent-0000beef")
        mod.enter_lane(alice, lane, assigned=True)
        assert mod.claim_next("alice")["id"] == "1"
        assert "You work in a worktree made for you" in refused(mod, mod.worktree_closeout, lane["name"], "keep")
        mod.checkpoint_lane()                                    # nothing changed: nothing committed
    assert "#1 [in_progress, worktree: agent-0000beef, owner: alice] the parser" in mod.task_list()
    assert git(repo, "rev-parse", "agent/agent-0000beef") == git(repo, "rev-parse", "main")


def test_start_up_without_lanes_runs_no_git(mod, workspace, monkeypatch):
    monkeypatch.setattr(mod.subprocess, "run", lambda *a, **k: pytest.fail("git ran"))
    assert mod.clean_stale_worktrees() == []


# --- s12.3: isolated subagents ------------------------------------------------------------

def child_edits(body):
    """The child's first request: told where it is; it reads app.py (a path it must use here)."""
    task = json.dumps(body["messages"][0]["content"])
    assert "<worktree>" in task and "on branch agent/agent-" in task and "read each file again" in task
    assert "Working directory: " in json.dumps(body["system"]) and "/.agent/worktrees/agent-" in json.dumps(body["system"])
    return reply(tool("read_file", {"path": "app.py"}))


def test_an_isolated_subagent_edits_its_lane_and_the_parent_gets_the_branch_and_diffstat(mod, api, client, repo):
    main_before = (repo / "app.py").read_text()
    steps = [reply(tool("agent", {"prompt": f"Make parse strip spaces in {repo}/app.py; add a test.",
                                  "description": "strip spaces", "isolation": "worktree"})),
             child_edits,
             reply(tool("edit_file", {"path": "app.py", "old_string": "text.split(',')",
                                      "new_string": "[p.strip() for p in text.split(',')]"}),
                   tool("write_file", {"path": "test_app.py", "content": "from app import parse\n"})),
             reply("Scope: parse strips spaces; test_app.py added.")]
    run_turn(mod, api, client, steps)
    assert (repo / "app.py").read_text() == main_before and not (repo / "test_app.py").exists()
    (name,) = lanes(repo)
    lane = repo / ".agent" / "worktrees" / name
    assert git(repo, "status", "--porcelain") == ""                      # the main workspace untouched
    assert git(lane, "status", "--porcelain") == ""                      # the child's work committed
    assert git(repo, "show", "--name-only", "--format=%s", f"agent/{name}").splitlines() == [
        "strip spaces: changes from an isolated subagent", "", "app.py", "test_app.py"]
    report = results(message_bodies(api)[-1])[0]["content"]
    assert f"[worktree {name}: committed " in report and f"branch agent/{name} has 1 commit(s)" in report
    assert "2 files changed, 2 insertions(+), 1 deletion(-)" in report
    assert f"git merge agent/{name}" in report
    assert mod.agent_state().workdir == repo and mod.agent_state().worktree is None
    steps = [(e["event"], e["by"]) for e in events(repo)]
    assert steps == [("create", "main"), ("made_for", "main"), ("enter", "strip spaces"),
                     ("commit", "strip spaces"), ("leave", "strip spaces")]


def test_a_child_that_changes_nothing_leaves_no_lane(mod, api, client, repo):
    steps = [reply(tool("agent", {"prompt": "Read app.py and say what parse returns.", "isolation": "worktree"})),
             reply(tool("read_file", {"path": "app.py"})),
             reply("It returns a list.")]
    run_turn(mod, api, client, steps)
    report = results(message_bodies(api)[-1])[0]["content"]
    assert "It returns a list." in report and ": no changes; removed]" in report
    assert lanes(repo) == [] and branches(repo) == ["main"]
    assert [e["event"] for e in events(repo)][-2:] == ["leave", "remove"]


def test_the_manager_commits_without_hooks_and_leaves_out_agent_and_links(mod, api, client, repo, tmp_path):
    """The child plants hooks where git would run them; the manager's commit runs none,
    and its .agent folder and the linked node_modules stay out of the commit."""
    marker = tmp_path / "hook-ran"
    hooks = repo / ".husky"
    hooks.mkdir()
    for hook in ("pre-commit", "commit-msg", "post-commit"):
        (hooks / hook).write_text(f"#!/bin/sh\necho {hook} >> {marker}\n")
        (hooks / hook).chmod(0o755)
    (repo / "node_modules").mkdir()
    (repo / ".agent").mkdir()
    (repo / ".agent" / "config.yaml").write_text("worktree: {symlink_directories: [node_modules]}\n")
    git(repo, "add", ".husky")
    git(repo, "commit", "-q", "--no-verify", "-m", "hooks")
    git(repo, "config", "core.hooksPath", ".husky")
    steps = [reply(tool("agent", {"prompt": "Write notes.", "isolation": "worktree"})),
             reply(tool("write_file", {"path": "notes.md", "content": "notes\n"}),
                   tool("write_file", {"path": ".agent/memory/x.md", "content": "mine\n"}),
                   tool("bash", {"command": "printf '#!/bin/sh\\necho planted >> %s\\n' > .husky/pre-commit"
                                            % marker})),
             reply("Done.")]
    run_turn(mod, api, client, steps)
    (name,) = lanes(repo)
    files = git(repo, "show", "--name-only", "--format=", f"agent/{name}").splitlines()
    assert sorted(files) == [".husky/pre-commit", "notes.md"]             # not .agent/, not node_modules
    assert not marker.exists()                                           # no hook ran, planted or not


def test_a_sandboxed_child_cannot_commit_or_touch_the_main_checkout_the_manager_commits(mod, api, client, repo):
    ok, why = mod.sandbox_available()
    if not ok:
        pytest.skip(f"the OS sandbox does not work here: {why}")
    mod.agent_state().permissions["sandbox"]["enabled"] = True   # the test default turns it off
    command = (f"echo notes > notes.md; git add -A && git commit -qm mine 2>&1 | tail -1; "
               f"echo planted >> {repo}/app.py 2>&1; printf 'gitdir: ../evil\\n' > .git 2>&1; true")
    steps = [reply(tool("agent", {"prompt": "Write notes.", "isolation": "worktree"})),
             reply(tool("bash", {"command": command})), reply("Done.")]
    run_turn(mod, api, client, steps)
    out = results(message_bodies(api)[2])[0]["content"]
    assert ".git: Read-only file system" in out                          # the lane's pointer is bound read-only
    (name,) = lanes(repo)
    assert (repo / "app.py").read_text() == APP and git(repo, "status", "--porcelain") == ""
    assert git(repo, "log", "--format=%s", f"main..agent/{name}") == "Write notes.: changes from an isolated subagent"
    assert git(repo, "show", "--name-only", "--format=", f"agent/{name}") == "notes.md"


def test_a_redirected_git_pointer_is_put_back_and_never_obeyed(mod, api, client, repo, tmp_path):
    """Without the sandbox the child's bash points its lane's .git at a repository
    whose config runs a program: the manager's git stays pinned, and puts it back."""
    evil, marker = fsmonitor_trap(tmp_path)
    steps = [reply(tool("agent", {"prompt": "Write notes.", "isolation": "worktree"})),
             reply(tool("write_file", {"path": "notes.md", "content": "notes\n"}),
                   tool("bash", {"command": f"printf 'gitdir: {evil}/.git\\n' > .git"})),
             reply("Done.")]
    run_turn(mod, api, client, steps)
    (name,) = lanes(repo)
    lane = repo / ".agent" / "worktrees" / name
    assert (lane / ".git").read_text() == f"gitdir: {repo}/.git/worktrees/{name}\n"
    assert git(repo, "show", "--name-only", "--format=", f"agent/{name}") == "notes.md"
    assert not marker.exists() and "pointer_restored" in [e["event"] for e in events(repo)]


def test_a_fork_in_a_lane_is_told_its_inherited_paths_point_to_the_parent(mod, api, client, repo):
    def fork_told(body):
        last = json.dumps(body["messages"][-1]["content"])
        assert "<fork_boilerplate>" in last and "The conversation above is the other agent's" in last
        assert f"Paths you were given that point into {repo} mean the same files here" in last
        return reply(tool("edit_file", {"path": "app.py", "old_string": "split", "new_string": "rsplit"}))
    steps = [reply(tool("read_file", {"path": "app.py"})),
             reply(tool("agent", {"prompt": "Use rsplit.", "fork": True, "isolation": "worktree"})),
             fork_told, reply("Scope: edit refused until read."), ]
    run_turn(mod, api, client, steps)
    bodies = message_bodies(api)
    assert "Read app.py with read_file before changing it." in json.dumps(bodies[3]["messages"][-1])
    assert lanes(repo) == []                                             # it changed nothing: removed


def test_an_agent_definition_with_isolation_worktree_runs_in_a_lane(mod, api, client, repo):
    folder = repo / ".agent" / "agents"
    folder.mkdir(parents=True)
    (folder / "fixer.md").write_text("---\nname: fixer\ndescription: Fixes code apart.\n"
                                     "isolation: worktree\n---\nYou fix code.\n")
    (folder / "odd.md").write_text("---\nname: odd\ndescription: Bad.\nisolation: container\n---\n")
    assert mod.load_agents()["fixer"]["isolation"] == "worktree" and "odd" not in mod.load_agents()
    steps = [reply(tool("agent", {"prompt": "Add a docstring.", "agent_type": "fixer"})),
             reply(tool("write_file", {"path": "doc.txt", "content": "doc\n"})), reply("Done.")]
    run_turn(mod, api, client, steps)
    (name,) = lanes(repo)
    assert git(repo, "show", "--name-only", "--format=", f"agent/{name}") == "doc.txt"
    assert "Working directory: " + str(repo / ".agent" / "worktrees" / name) in json.dumps(message_bodies(api)[1]["system"])


def test_isolation_other_than_worktree_or_without_a_repository_is_an_error(mod, api, client, workspace):
    steps = [reply(tool("agent", {"prompt": "x", "isolation": "container"}),
                   tool("agent", {"prompt": "x", "isolation": "worktree"}))]
    run_turn(mod, api, client, steps)
    first, second = results(message_bodies(api)[-1])
    assert first["is_error"] and 'isolation must be "worktree"' in first["content"]
    assert second["is_error"] and "need a git repository" in second["content"]


def test_an_isolated_child_cannot_open_or_close_lanes(mod, api, client, repo):
    steps = [reply(tool("agent", {"prompt": "x", "isolation": "worktree"})),
             reply(tool("worktree_create", {"name": "mine"}),
                   tool("worktree_closeout", {"name": "x", "action": "keep"})),
             reply("Done.")]
    run_turn(mod, api, client, steps)
    child_results = results(message_bodies(api)[2])
    assert all(r["is_error"] and "made for you" in r["content"] for r in child_results)
    assert lanes(repo) == []


def test_a_background_isolated_agent_reports_its_branch_in_its_notification(mod, api, client, repo):
    from test_s10_agents import Two, ended, record_of
    def notified(body):
        note = json.dumps(body["messages"][-1]["content"])
        assert "<task-notification>" in note and "[worktree agent-" in note and "1 file changed" in note
        return reply("Its branch has a.txt.")
    waiting = threading.Event()

    def parent_waits(body):                  # the parent's second call is out before the child works,
        waiting.set()                        # so the child's news cannot join it
        return reply("Waiting.")

    def child_writes(body):
        assert waiting.wait(30)
        return reply(tool("write_file", {"path": "a.txt", "content": "a\n"}))
    two = Two(parent=[reply(tool("agent", {"prompt": "Write a.txt", "run_in_background": True,
                                           "isolation": "worktree"})), parent_waits, notified],
              child=[child_writes, reply("Wrote a.txt.")])
    two.install(api)
    history = [{"role": "user", "content": "go"}]
    assert mod.agent_loop(client, history) == "end_turn"
    ended(record_of(mod.agent_state()))                            # its lane is closed in its thread
    mod.add_user_text(history, "any news?")
    assert mod.agent_loop(client, history) == "end_turn"
    assert two.used_up() and not (repo / "a.txt").exists()
    (name,) = lanes(repo)
    assert git(repo, "show", "--name-only", "--format=", f"agent/{name}") == "a.txt"


# --- s12.3: lanes for whole sessions and teammates (subprocesses) --------------------------

@pytest.mark.e2e("s12")
def test_a_session_started_with_worktree_works_in_the_lane(mod, api, repo):
    stale = make_agent_lane(mod, repo, age=mod.STALE_WORKTREE_AGE + 60)
    api.script([reply(tool("bash", {"command": "pwd && echo hi > here.txt"})), reply("Done.")])
    r = run_chapter(mod.__name__, "--worktree", "fix", "say where you are", api=api, cwd=repo)
    lane = repo / ".agent" / "worktrees" / "fix"
    assert r.returncode == 0, r.stderr
    assert f"[removed 1 stale worktree(s) with nothing in them: {stale['name']}]" in r.stderr
    assert "[worktree fix: created, on branch agent/fix" in r.stderr
    assert str(lane) in json.dumps(api.requests[-1]["body"]["messages"])        # pwd: the lane
    assert (lane / "here.txt").exists() and not (repo / "here.txt").exists()
    assert lanes(repo) == ["fix"]                                                # a named lane stays
    r = run_chapter(mod.__name__, "--worktree", api=api, cwd=repo)
    assert r.returncode == 2 and r.stderr.splitlines()[-1] == "--worktree needs a name, e.g. --worktree fix-parser"
    r = run_chapter(mod.__name__, "--worktree", "../x", "hi", api=api, cwd=repo)
    assert r.returncode == 2 and "not a worktree name" in r.stderr and "Traceback" not in r.stderr


@pytest.mark.e2e("s12")
def test_a_teammate_in_a_lane_commits_each_turn_and_the_lead_gets_the_branch(mod, api, repo):
    """alice writes a file in her lane: committed after her turn, the lead told the
    branch and diffstat. bob changes nothing: his lane is gone when he stops."""
    from test_s11_teams import routed, start_lead, statuses, teammate_pids, wait_for
    told = {}

    def lead_reads(body):
        told["news"] = json.dumps(body["messages"])
        return reply("Alice's work is on her branch.")
    spawn = [tool("spawn_teammate", {"name": n, "role": f"{n}'s part", "prompt": f"{n}: do your part.",
                                     "isolation": "worktree"}) for n in ("alice", "bob")]
    scripts = {"lead": [reply(*spawn), reply("Both are on it."), lead_reads],
               "alice": [reply(tool("write_file", {"path": "notes.txt", "content": "from alice\n"})),
                         reply("Wrote notes.txt.")],
               "bob": [reply("Nothing for me to change.")]}
    api.script(routed(scripts))
    lead = start_lead(mod, api, repo)
    try:
        lead.stdin.write("start alice and bob\n")
        lead.stdin.flush()
        wait_for(lambda: statuses(repo).get("alice") == statuses(repo).get("bob") == "idle", lead,
                 "both teammates' first turn")
        assert len(lanes(repo)) == 2
        wait_for(lambda: any("committed" in r.get("content", "") for r in lead_inbox(repo)), lead,
                 "alice's commit news")
        lead.stdin.write("what did alice do?\n")
        lead.stdin.flush()
        wait_for(lambda: not any(scripts.values()), lead, "the lead to read it")
        out, err = lead.communicate("", timeout=60)
    finally:
        lead.kill()
    assert lead.returncode == 0, err
    (name,) = lanes(repo)                                               # bob's: removed when he stopped
    assert not (repo / "notes.txt").exists() and git(repo, "status", "--porcelain") == ""
    assert git(repo, "show", "--name-only", "--format=", f"agent/{name}") == "notes.txt"
    assert git(repo, "log", "-1", "--format=%s", f"agent/{name}") == "alice: work from a teammate's turn"
    assert "committed " in told["news"] and f"on branch agent/{name}" in told["news"]
    assert "1 file changed" in told["news"]
    made = {e["agent"]: e["name"] for e in events(repo) if e["event"] == "made_for"}
    assert made["teammate alice"] == name and [e["why"] for e in events(repo) if e["event"] == "remove"] == [
        "its agent changed nothing"]
    assert ("enter", "bob") in [(e["event"], e["by"]) for e in events(repo)]
    team = json.loads(next((repo / ".agent" / "team").glob("*/config.json")).read_text())["team"]
    assert teammate_pids(team) == []


def lead_inbox(workspace):
    """Every record delivered to the lead so far (its inbox may be drained: the log keeps them)."""
    logs = list((workspace / ".agent" / "team").glob("*/messages.jsonl")) if (workspace / ".agent" / "team").exists() else []
    return [json.loads(line) for log in logs for line in log.read_text().splitlines()
            if json.loads(line).get("to") == "lead"] if logs else []


def test_the_managers_git_obeys_no_commondir_a_command_beside_it_planted(mod, repo, tmp_path):
    """A sandboxed command running beside the manager (a background one) may write
    .git/commondir before the audit after it puts it back. The manager's git names
    its common folder itself, so the config that commondir leads to (a clean filter,
    which GIT_QUIET cannot name) never runs (rule 1: the agent's own git reads no
    config the sandbox could write)."""
    evil, marker = tmp_path / "evil", tmp_path / "pwned"
    git(tmp_path, "init", "-q", "--bare", str(evil))
    (evil / "config").write_text(f'[core]\n\tbare = true\n[filter "x"]\n\tclean = "touch {marker}; cat"\n')
    (repo / ".gitattributes").write_text("* filter=x\n")
    (repo / ".git" / "commondir").write_text(f"{evil}\n")
    (repo / "new.txt").write_text("new\n")
    subprocess.run(["git", "add", "new.txt"], cwd=repo, capture_output=True)  # git obeys it: the trap works
    assert marker.exists()
    marker.unlink()
    mod.git(repo, "add", "new.txt")
    assert not marker.exists()
