"""s12's worktree half, after a hostile review: what a child can leave in its lane
(a nested repository), what a lane may expose (secrets the main checkout hides),
where the project's own data lives while an agent works in a lane, work that
outlives its lane, names and bases, half-made lanes, the manager's git, and tests
for code paths the first tests could not tell apart from broken ones.

Like test_s12_worktrees.py, every test runs real git on a real repository (`repo`).
One test is the carried s07 sandbox fix, on s07 and every later file.
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from conftest import chapters_from, message_bodies, run_turn
from fake_api import reply, tool

S12 = chapters_from("s12")
in_s12 = pytest.mark.parametrize("mod", S12, indirect=True)

from test_s12_worktrees import APP, events, git, lanes, refused, results  # noqa: E402
from test_s12_worktrees import repo  # noqa: E402,F401 (a fixture: pytest finds it by name)


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


# --- 1. a nested repository in a lane ----------------------------------------------------------

def monitor_script(tmp_path):
    """A program a repository's core.fsmonitor may name: it leaves a marker when git runs it."""
    marker, script = tmp_path / "monitor-ran", tmp_path / "monitor.sh"
    script.write_text(f"#!/bin/sh\ntouch {marker}\n")
    script.chmod(0o755)
    return script, marker


def nested_repo(name, script, stage=False):
    """A bash line that makes a nested repository with a commit, then sets its fsmonitor."""
    commit = f"git init -q {name} && echo v > {name}/f && git -C {name} add f && " \
             f"git -C {name} -c user.name=c -c user.email=c@e commit -qm v"
    return commit + (f" && git add {name}" if stage else "") + f" && git -C {name} config core.fsmonitor {script}"


@in_s12
def test_a_nested_repository_is_never_committed_and_the_parent_is_told(mod, api, client, repo, tmp_path):
    """One nested repository left as the child made it, one the child's own git staged
    (no sandbox here): neither becomes a gitlink, so the human's git status in the lane
    never runs the program their config names."""
    script, marker = monitor_script(tmp_path)
    steps = [reply(tool("agent", {"prompt": "Vendor the libraries.", "isolation": "worktree"})),
             reply(tool("write_file", {"path": "notes.md", "content": "notes\n"}),
                   tool("bash", {"command": nested_repo("vendor", script) + " && "
                                 + nested_repo("lib/deep", script, stage=True)
                                 + " && git init -q fresh && echo x > fresh/f"})),   # no commit yet
             reply("Done.")]
    run_turn(mod, api, client, steps)
    (name,) = lanes(repo)
    lane = repo / ".agent" / "worktrees" / name
    assert "160000" not in git(repo, "ls-tree", "-r", f"agent/{name}")
    assert git(repo, "show", "--name-only", "--format=", f"agent/{name}") == "notes.md"
    report = results(message_bodies(api)[-1])[0]["content"]
    assert "left out nested repository vendor (a .git inside the lane)" in report
    assert "left out nested repository lib/deep (a .git inside the lane)" in report
    assert "left out nested repository fresh (a .git inside the lane)" in report
    marker.unlink(missing_ok=True)
    git(lane, "status", "--short")                               # the human looks at the lane
    assert not marker.exists()
    assert "nested repositories (never committed): fresh, lib/deep, vendor" in mod.worktree_list()


@in_s12
def test_a_lane_whose_only_change_is_a_nested_repository_is_kept_not_removed(mod, api, client, repo, tmp_path):
    script, _ = monitor_script(tmp_path)
    steps = [reply(tool("agent", {"prompt": "Clone the tool.", "isolation": "worktree"})),
             reply(tool("bash", {"command": nested_repo("tool", script)})),
             reply("Done.")]
    run_turn(mod, api, client, steps)
    (name,) = lanes(repo)
    report = results(message_bodies(api)[-1])[0]["content"]
    assert "left out nested repository tool (a .git inside the lane); nothing committed; kept at" in report
    assert (repo / ".agent" / "worktrees" / name / "tool" / "f").exists()
    assert git(repo, "rev-parse", f"agent/{name}") == git(repo, "rev-parse", "main")


# --- 2. what a lane may expose ---------------------------------------------------------------

@in_s12
def test_include_copies_neither_the_agents_own_env_nor_a_file_a_deny_rule_hides(mod, repo, monkeypatch):
    (repo / ".env").write_text("ANTHROPIC_API_KEY=sk-ant-secret\n")
    monkeypatch.setattr(mod, "find_dotenv", lambda *a, **k: str(repo / ".env"))   # the agent's own
    (repo / "secrets").mkdir()
    (repo / "secrets" / "prod.key").write_text("PROD\n")
    (repo / "dev.key").write_text("DEV\n")
    (repo / ".gitignore").write_text(".agent/\n.env\nsecrets/\n*.key\n")
    (repo / ".worktreeinclude").write_text(".env\n*.key\n")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "include")
    deny_read(mod, "./secrets/**")
    out = mod.worktree_create("fix")
    lane = repo / ".agent" / "worktrees" / "fix"
    assert "copied 1 ignored file(s)" in out and (lane / "dev.key").read_text() == "DEV\n"
    assert not (lane / ".env").exists() and not (lane / "secrets").exists()


@in_s12
def test_a_folder_holding_a_denied_file_is_not_linked(mod, repo, monkeypatch):
    (repo / ".agent").mkdir()
    (repo / ".agent" / "config.yaml").write_text(
        "worktree: {symlink_directories: [secrets, node_modules, .venv, vendor]}\n")
    for folder, files in (("secrets", ["prod.key"]), ("node_modules", ["a.js", "b/c.pem"]),
                          (".venv", ["bin/python"]), ("vendor", ["lib.py"])):
        for f in files:
            (repo / folder / f).parent.mkdir(parents=True, exist_ok=True)
            (repo / folder / f).write_text("x\n")
    deny_read(mod, "./secrets/prod.key")       # a path into one folder
    deny_read(mod, "**/*.pem")                 # anywhere: node_modules holds one
    deny_read(mod, "./config/*.yaml")          # anchored elsewhere: rules nothing out
    walked = []
    real_walk = os.walk
    monkeypatch.setattr(mod.os, "walk", lambda top, *a, **k: walked.append(Path(top)) or real_walk(top, *a, **k))
    out = mod.worktree_create("fix")
    lane = repo / ".agent" / "worktrees" / "fix"
    assert "did not link secrets: a read-deny rule hides secrets/prod.key" in out
    assert "did not link node_modules: a read-deny rule hides node_modules/b/c.pem" in out
    assert "linked .venv, vendor" in out
    assert not os.path.lexists(lane / "secrets") and not os.path.lexists(lane / "node_modules")
    assert (lane / ".venv").is_symlink() and (lane / "vendor").is_symlink()
    # only **/*.pem could match in .venv and vendor: walked; nothing walks for a rule anchored elsewhere
    assert sorted(p.name for p in walked if p.parent == repo) == [".venv", "node_modules", "secrets", "vendor"]
    mod.worktree_closeout("fix", "remove")
    walked.clear()
    state = mod.agent_state()
    state.permissions["rules"] = [r for r in state.permissions["rules"] if r["pattern"] == "./config/*.yaml"]
    mod.worktree_create("fix")
    assert walked == []                         # the one rule left is anchored in config/: no walk at all


@in_s12
def test_past_the_walk_bound_a_folder_is_not_linked(mod, repo, monkeypatch):
    monkeypatch.setattr(mod, "MASK_SCAN_LIMIT", 3)
    (repo / ".agent").mkdir()
    (repo / ".agent" / "config.yaml").write_text("worktree: {symlink_directories: [node_modules]}\n")
    for n in range(5):
        (repo / "node_modules" / f"{n}.js").parent.mkdir(parents=True, exist_ok=True)
        (repo / "node_modules" / f"{n}.js").write_text("x\n")
    deny_read(mod, "**/id_rsa")
    out = mod.worktree_create("fix")
    assert "did not link node_modules: more than 3 entries to check against the read-deny rules" in out
    assert not os.path.lexists(repo / ".agent" / "worktrees" / "fix" / "node_modules")


@in_s12
def test_read_deny_rules_are_judged_in_the_project_from_a_lane_and_for_every_lane(mod, repo):
    """Read(./secrets/**) is the project's rule: from a lane, the project's secrets/ is
    masked for bash too; from the main checkout, a lane's copy of a denied file is."""
    (repo / "config").mkdir()
    (repo / "config" / "prod.yaml").write_text("password: hunter2\n")     # tracked: every lane has it
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "config")
    (repo / "secrets").mkdir()
    (repo / "secrets" / "prod.key").write_text("PROD\n")                 # untracked: the project's only
    deny_read(mod, "./secrets/**")
    deny_read(mod, "./config/prod.yaml")
    state = mod.agent_state()
    mod.worktree_create("fix")
    masked = mod.masked_paths(state)
    assert str(repo / "secrets") in masked and str(repo / ".agent/worktrees/fix/config/prod.yaml") in masked
    mod.worktree_closeout("fix", "keep")
    assert mod.read_denied(".agent/worktrees/fix/config/prod.yaml", state)
    assert mod.grep("hunter2", ".agent/worktrees/fix").startswith("No matches")         # grep drops it
    assert str(repo / ".agent/worktrees/fix/config/prod.yaml") in mod.masked_paths(state)


@in_s12
def test_from_a_lane_its_own_checkout_is_looked_at_first_for_files_to_mask(mod, repo, monkeypatch):
    """The walk is bounded: a big main checkout must not use it up before the lane."""
    (repo / "config").mkdir()
    (repo / "config" / "prod.yaml").write_text("password: hunter2\n")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "config")
    for n in range(60):
        (repo / "a-junk" / f"{n}.txt").parent.mkdir(exist_ok=True)
        (repo / "a-junk" / f"{n}.txt").write_text("j\n")
    deny_read(mod, "./config/prod.yaml")
    mod.worktree_create("fix")
    monkeypatch.setattr(mod, "MASK_SCAN_LIMIT", 12)
    assert str(repo / ".agent" / "worktrees" / "fix" / "config" / "prod.yaml") in mod.masked_paths(mod.agent_state())


@pytest.fixture
def root_fs_repo(mod, workspace, monkeypatch):
    """A repository outside /tmp, which the sandbox replaces with a private one: there
    a command in a lane could reach the main checkout through its real path."""
    base = Path("/var/tmp")
    if not (base.is_dir() and os.access(base, os.W_OK)):
        pytest.skip("/var/tmp is not writable here")
    ws = Path(tempfile.mkdtemp(prefix="s12-lane-", dir=base)).resolve()
    monkeypatch.chdir(ws)
    git(ws, "init", "-q", "-b", "main")
    (ws / "app.py").write_text(APP)
    (ws / ".gitignore").write_text(".agent/\nsecrets/\n")
    git(ws, "add", "-A")
    git(ws, "commit", "-q", "-m", "first")
    state = mod.AgentState(ws)
    state.mode = "bypassPermissions"
    try:
        with mod.acting_as(state):
            yield ws
    finally:
        shutil.rmtree(ws, ignore_errors=True)


@in_s12
def test_a_sandboxed_agent_in_a_lane_cannot_cat_the_projects_denied_file(sandboxed, root_fs_repo):
    mod, repo = sandboxed, root_fs_repo
    (repo / "secrets").mkdir()
    (repo / "secrets" / "prod.key").write_text("PROD-KEY\n")
    deny_read(mod, "./secrets/**")
    assert mod.sandboxed(mod.agent_state())
    mod.worktree_create("fix")
    out = mod.run_bash(f"cat {repo}/secrets/prod.key 2>&1; cat ../../../secrets/prod.key 2>&1; cat ../../../app.py")
    assert "PROD-KEY" not in out and "def parse" in out             # the main checkout is there, its secret not


# --- 3. the project's data stays with the project ---------------------------------------------

@in_s12
def test_in_a_lane_the_projects_memory_schedules_agents_skills_and_logs_are_the_projects(mod, repo, monkeypatch):
    """--worktree NAME, or worktree_create: the agent recalls the project's memories,
    fires its durable jobs, finds its agents and skills; nothing of them is in the lane,
    so nothing of them goes when the lane is removed."""
    agents, skills = repo / ".agent" / "agents", repo / ".agent" / "skills" / "deploy"
    agents.mkdir(parents=True)
    (agents / "fixer.md").write_text("---\nname: fixer\ndescription: Fixes code.\n---\nYou fix code.\n")
    skills.mkdir(parents=True)
    (skills / "SKILL.md").write_text("---\nname: deploy\ndescription: Deploys.\n---\nRun make deploy.\n")
    mod.schedule_create("0 9 * * *", "daily report", True, True)
    state = mod.agent_state()
    mod.worktree_create("fix")
    assert mod.memory_dirs(state)["project"] == repo / ".agent" / "memory"
    assert mod.schedules_path() == repo / ".agent" / "schedules.json"
    assert [j["prompt"] for j in mod.durable_jobs().values()] == ["daily report"]
    assert mod.runtime_dir() == repo / ".agent" / "runtime-tasks"
    assert "fixer" in mod.load_agents() and "deploy" in mod.discover_skills()
    assert mod.lock_path(state) == repo / ".agent" / "memory" / ".consolidate-lock"
    op = {"op": "write", "type": "project", "name": "build-cmd", "description": "how to build", "body": "make"}
    mod.write_memory(op, state)
    mod.schedule_create("0 10 * * *", "made in the lane", True, True)
    out = mod.background_run("echo built")
    assert f"Log: {repo}/.agent/runtime-tasks/" in out               # a path that leads there from the lane
    for record in list(state.background.values()):
        record["_thread"].join(5)
    assert mod.worktree_closeout("fix", "remove").startswith("Removed")   # nothing of the project's is lost
    assert (repo / ".agent" / "memory" / "build-cmd.md").exists()
    assert sorted(j["prompt"] for j in mod.durable_jobs().values()) == ["daily report", "made in the lane"]
    assert any(p.suffix == ".log" for p in (repo / ".agent" / "runtime-tasks").iterdir())


@in_s12
def test_a_project_skills_trust_is_the_projects_in_a_lane_too(mod, repo, monkeypatch):
    skill = repo / ".agent" / "skills" / "stamp"
    skill.mkdir(parents=True)
    (skill / "SKILL.md").write_text("---\nname: stamp\ndescription: Stamps.\n---\nNow: !`echo stamped`\n")
    asked = []
    monkeypatch.setattr(mod, "ask_human", lambda q: asked.append(q) or "y")
    found = mod.discover_skills()["stamp"]
    assert mod.may_run(found) and len(asked) == 1                # asked once, in the main checkout
    mod.worktree_create("fix")
    assert mod.may_run(mod.discover_skills()["stamp"]) and len(asked) == 1   # the same yes holds


@in_s12
def test_removing_a_lane_counts_what_only_its_own_agent_folder_holds(mod, repo, monkeypatch):
    mod.worktree_create("fix")
    mod.write_file(".agent/plans/mine.md", "the plan\n")        # lane-local: no commit takes it
    asked = []
    monkeypatch.setattr(mod, "ask_human", lambda q: asked.append(q) or "n")
    out = refused(mod, mod.worktree_closeout, "fix", "remove")
    assert "1 file(s) under its own .agent (plans, saved output)" in asked[0] and "did not confirm" in out
    assert lanes(repo) == ["fix"] and mod.agent_state().worktree["name"] == "fix"
    assert mod.agent_state().worktree["lock"] is not None          # still in it, and holding it
    monkeypatch.setattr(mod, "ask_human", lambda q: "y")
    assert mod.worktree_closeout("fix", "remove").startswith("Removed")


# --- 4. work that outlives its lane ----------------------------------------------------------

@in_s12
def test_a_childs_background_command_is_waited_for_before_its_lane_is_committed(mod, api, client, repo):
    steps = [reply(tool("agent", {"prompt": "Build it.", "isolation": "worktree"})),
             reply(tool("background_run", {"command": "sleep 0.3; echo built > result.txt"})),
             reply("Started the build.")]
    run_turn(mod, api, client, steps)
    (name,) = lanes(repo)
    assert git(repo, "show", "--name-only", "--format=", f"agent/{name}") == "result.txt"
    report = results(message_bodies(api)[-1])[0]["content"]
    assert f"[worktree {name}: waited for b" in report and " to end; committed " in report


@in_s12
def test_a_childs_background_command_still_running_is_stopped_before_its_lane_goes(mod, api, client, repo,
                                                                                 monkeypatch):
    monkeypatch.setattr(mod, "LANE_SETTLE_WAIT", 0.2)
    steps = [reply(tool("agent", {"prompt": "Serve it.", "isolation": "worktree"})),
             reply(tool("background_run", {"command": "sleep 30"})),
             reply("Started the server.")]
    run_turn(mod, api, client, steps)
    report = results(message_bodies(api)[-1])[0]["content"]
    assert ", still running after 0.2 s; no changes; removed]" in report and "stopped b" in report
    (record,) = mod.agent_state().background.values()
    assert record["status"] == "stopped" and lanes(repo) == []


@in_s12
def test_an_agent_cannot_close_its_lane_while_its_background_work_runs_there(mod, repo):
    mod.worktree_create("fix")
    out = mod.background_run("sleep 30")
    bid = out.split()[1]
    assert f"{bid} still running in worktree fix" in refused(mod, mod.worktree_closeout, "fix", "keep")
    assert mod.agent_state().worktree["name"] == "fix"
    mod.background_stop(bid)
    assert mod.worktree_closeout("fix", "keep").startswith("Kept worktree fix")


@in_s12
def test_a_background_child_in_its_parents_lane_holds_it_shared(mod, repo, tmp_path):
    """Its share keeps the lane in use: its parent cannot close it, another agent
    cannot enter or remove it, stale cleanup in another process leaves it."""
    mod.worktree_create("fix")
    parent = mod.agent_state()
    child = mod.child_state(False, "bg helper")
    mod.join_lane(child)
    assert child.worktree["lock"] is not None
    assert "A subagent still works in worktree fix" in refused(mod, mod.worktree_closeout, "fix", "remove")
    assert parent.worktree["name"] == "fix" and parent.worktree["lock"] is not None   # still in, still held
    lock = repo / ".agent" / "worktrees" / "fix.lock"
    probe = [sys.executable, "-c", "import fcntl, os, sys; fd = os.open(sys.argv[1], os.O_RDWR); "
             "fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)", str(lock)]
    assert subprocess.run(probe, capture_output=True).returncode != 0         # in use, seen from outside
    mod.close_child_lane(child)                                              # it ends: its share let go
    assert child.worktree["lock"] is None
    assert mod.worktree_closeout("fix", "keep").startswith("Kept")
    assert subprocess.run(probe, capture_output=True).returncode == 0        # nobody in it now


# --- 5. subagents and worktree_create -----------------------------------------------------------

@in_s12
def test_a_subagent_may_not_open_or_close_a_lane_but_a_teammate_may(mod, api, client, repo):
    steps = [reply(tool("agent", {"prompt": "Work apart."})),
             reply(tool("worktree_create", {"name": "mine"}),
                   tool("worktree_closeout", {"name": "mine", "action": "keep"})),
             reply("Done.")]
    run_turn(mod, api, client, steps)
    for r in results(message_bodies(api)[2]):
        assert r["is_error"] and "A subagent cannot open or close worktrees" in r["content"]
        assert 'isolation "worktree" on its agent call' in r["content"]
    assert lanes(repo) == [] and mod.agent_state().worktree is None
    teammate = mod.AgentState(repo)                 # a teammate: the main agent of its own process
    teammate.team = {"member": "alice", "name": "crew"}
    with mod.acting_as(teammate):
        assert mod.worktree_create("mine").startswith("Created worktree mine")
        assert mod.worktree_closeout("mine", "keep").startswith("Kept")


# --- 6. names the event log needs --------------------------------------------------------------

@in_s12
@pytest.mark.parametrize("name", ["events", "Events", "events.jsonl", "x.jsonl", "fix.lock"])
def test_names_of_the_lanes_locks_and_log_are_reserved(mod, repo, name):
    out = refused(mod, mod.worktree_create, name)
    assert "is not a worktree name" in out and "kept for the lanes' locks and their log" in out
    mod.worktree_create("fix")                                 # the log still works
    assert [e["event"] for e in events(repo)] == ["create", "enter"]


# --- 7. the manager's git beside other gits -------------------------------------------------

@in_s12
def test_the_managers_commit_retries_once_when_another_git_holds_index_lock(mod, repo, monkeypatch):
    lane, _ = mod.make_lane(repo, "fix")
    (lane["path"] / "new.py").write_text("x = 1\n")
    held = lane["admin"] / "index.lock"
    waits = []

    real_sleep = time.sleep

    def other_git_done(seconds):          # the retry's pause: the other git finishes meanwhile
        if seconds != mod.GIT_LOCK_RETRY:
            return real_sleep(seconds)
        waits.append(seconds)
        held.unlink(missing_ok=True)
    monkeypatch.setattr(mod.time, "sleep", other_git_done)
    held.write_text("")                   # another git (say `git status` of the human) holds it now
    lane, commit = mod.commit_lane(lane, "work")
    assert commit and waits == [mod.GIT_LOCK_RETRY]
    assert git(repo, "show", "--name-only", "--format=", "agent/fix") == "new.py"


@in_s12
def test_the_managers_git_names_the_command_that_failed_and_takes_no_optional_locks(mod, repo):
    out = refused(mod, mod.git, repo, *mod.MANAGER_IDENTITY, "no-such-command")
    assert out.startswith("git no-such-command failed")
    assert mod.git_env()["GIT_OPTIONAL_LOCKS"] == "0"
    assert mod.git_subcommand(["-c", "user.name=x", "--literal-pathspecs", "add", "-A"]) == "add"


# --- 8. a half-made lane -------------------------------------------------------------------------

def half_make(mod, repo, name, reason="initializing"):
    """A lane as a kill leaves it: git's lock file still there, no ready marker."""
    lane, _ = mod.make_lane(repo, name)
    (lane["admin"] / mod.LANE_READY).unlink()
    (lane["admin"] / "locked").write_text(reason)
    return lane


@in_s12
def test_a_half_made_named_lane_is_refused_with_how_to_remove_it(mod, repo):
    half_make(mod, repo, "fix")
    out = refused(mod, mod.worktree_create, "fix")
    assert "was left half made" in out and "git worktree remove --force --force .agent/worktrees/fix" in out
    assert "was left half made" in refused(mod, mod.worktree_closeout, "fix", "remove")
    assert "fix  [half made" in mod.worktree_list()
    assert mod.agent_state().worktree is None


@in_s12
def test_a_half_made_agent_lane_is_made_again(mod, repo):
    lane = half_make(mod, repo, "agent-0000abcd", reason=mod.LANE_MAKING)   # killed during the set-up
    (lane["path"] / "app.py").unlink()                                    # the checkout half done
    again, made = mod.make_lane(repo, "agent-0000abcd")
    assert made and again["ready"] and (again["path"] / "app.py").read_text() == APP
    assert not (again["admin"] / "locked").exists() and (again["admin"] / mod.LANE_READY).exists()
    assert [e["event"] for e in events(repo)] == ["create", "remove", "create"]


@in_s12
def test_a_lane_made_before_the_ready_marker_is_still_used(mod, repo):
    lane, _ = mod.make_lane(repo, "old")
    (lane["admin"] / mod.LANE_READY).unlink()                   # as lanes were made before
    assert mod.worktree_create("old").startswith("Reused worktree old")


# --- 9. a base for a lane or branch that exists --------------------------------------------

@in_s12
def test_a_base_other_than_where_a_kept_branch_or_lane_is_is_refused(mod, repo):
    git(repo, "checkout", "-q", "-b", "v2")
    (repo / "app.py").write_text("v2\n")
    git(repo, "commit", "-qam", "v2")
    git(repo, "checkout", "-q", "main")
    mod.worktree_create("fix")
    mod.worktree_closeout("fix", "keep")
    out = refused(mod, mod.worktree_create, "fix", base="v2")       # the lane is at main
    assert "Worktree fix exists already" in out and "not at base 'v2'" in out
    assert mod.agent_state().worktree is None
    git(repo, "worktree", "remove", "--force", str(repo / ".agent" / "worktrees" / "fix"))  # by hand
    out = refused(mod, mod.worktree_create, "fix", base="v2")       # branch agent/fix is kept, at main
    assert "Branch agent/fix is left from an earlier worktree fix" in out and "leave base out" in out
    assert mod.worktree_create("fix", base="main").startswith("Created worktree fix")   # where it is: fine
    assert (repo / ".agent" / "worktrees" / "fix" / "app.py").read_text() == APP


# --- 10. tests that can fail: each guard, and the broken version it stops ------------------------

def aged_agent_lane(mod, repo, days=2):
    lane, _ = mod.make_lane(repo, f"agent-{os.urandom(4).hex()}")
    old = time.time() - days * mod.STALE_WORKTREE_AGE
    os.utime(lane["path"], (old, old))
    return lane


@in_s12
def test_stale_cleanup_leaves_a_lane_another_process_holds(mod, repo):
    lane = aged_agent_lane(mod, repo)
    lock = mod.lane_lock_file(lane)
    holder = subprocess.Popen([sys.executable, "-c", "import fcntl, os, sys; fd = os.open(sys.argv[1], "
                               "os.O_RDWR | os.O_CREAT); fcntl.flock(fd, fcntl.LOCK_SH); print('held', "
                               "flush=True); sys.stdin.read()", str(lock)],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline() == "held\n"
        old = time.time() - 2 * mod.STALE_WORKTREE_AGE
        os.utime(lock, (old, old))                      # held, yet unused for two days by its time
        assert mod.clean_stale_worktrees() == [] and lanes(repo) == [lane["name"]]
    finally:
        holder.communicate("")
    assert mod.clean_stale_worktrees() == [lane["name"]] and lanes(repo) == []


@in_s12
def test_the_managers_commit_leaves_out_agent_even_when_git_does_not_ignore_it(mod, repo):
    (repo / ".gitignore").write_text("node_modules/\n")
    git(repo, "commit", "-qam", "no .agent in .gitignore")
    (repo / ".agent").mkdir()
    (repo / ".agent" / "config.local.yaml").write_text("{}\n")        # copied into the lane too
    lane, _ = mod.make_lane(repo, "fix")
    (lane["path"] / ".agent" / "notes.md").write_text("the agent's own\n")
    (lane["path"] / "work.py").write_text("w\n")
    assert mod.lane_changes(lane) == ["work.py"]
    mod.commit_lane(lane, "work")
    assert git(repo, "show", "--name-only", "--format=", "agent/fix") == "work.py"


@in_s12
def test_a_pointer_to_an_admin_folder_outside_the_repositorys_worktrees_is_refused(mod, repo, tmp_path):
    """A planted lane whose .git names a folder elsewhere that names it back, and
    whose commondir leads to the real repository: every check but the folder's place holds."""
    mod.make_lane(repo, "real")
    fake = tmp_path / "fake-admin"
    fake.mkdir()
    planted = repo / ".agent" / "worktrees" / "planted"
    planted.mkdir()
    (planted / ".git").write_text(f"gitdir: {fake}\n")
    (fake / "gitdir").write_text(f"{planted / '.git'}\n")
    (fake / "commondir").write_text(f"{repo / '.git'}\n")
    (fake / "HEAD").write_text(git(repo, "rev-parse", "HEAD") + "\n")
    (fake / mod.LANE_READY).write_text("")
    assert git(planted, "rev-parse", "HEAD") == git(repo, "rev-parse", "HEAD")   # git itself takes it
    assert "not a worktree of this repository" in refused(mod, mod.find_lane, repo, "planted")


@in_s12
def test_leaving_a_lane_drops_its_file_read_records(mod, repo):
    mod.worktree_create("fix")
    mod.read_file("app.py")
    assert list(mod.agent_state().files) == [str(repo / ".agent" / "worktrees" / "fix" / "app.py")]
    mod.worktree_closeout("fix", "keep")
    assert mod.agent_state().files == {}


@in_s12
def test_a_shared_folder_that_is_a_link_or_leads_outside_is_not_linked(mod, repo, tmp_path):
    outside = tmp_path / "outside"
    (outside / "lib").mkdir(parents=True)
    (outside / "lib" / "secret.txt").write_text("s\n")
    (repo / "node_modules").symlink_to(outside)                   # a link itself
    (repo / "vendor").symlink_to(outside)                         # vendor/lib: a real folder, outside
    (repo / "tools").symlink_to(repo / ".git")                    # a link inside: to the repository
    (repo / ".venv").mkdir()
    (repo / ".agent").mkdir()
    (repo / ".agent" / "config.yaml").write_text("worktree: {symlink_directories: [node_modules, vendor/lib, tools, .venv]}\n")
    out = mod.worktree_create("fix")
    lane = repo / ".agent" / "worktrees" / "fix"
    assert "linked .venv." in out
    assert not {"node_modules", "vendor", "tools"} & {p.name for p in lane.iterdir()}


@in_s12
def test_git_variables_of_the_users_shell_never_steer_the_managers_git(mod, repo, tmp_path, monkeypatch):
    other = tmp_path / "other"
    git(tmp_path, "init", "-q", "-b", "main", str(other))
    git(other, "commit", "-q", "--allow-empty", "-m", "other")
    monkeypatch.setenv("GIT_DIR", str(other / ".git"))
    monkeypatch.setenv("GIT_WORK_TREE", str(other))
    out = mod.worktree_create("fix")
    monkeypatch.delenv("GIT_DIR")
    monkeypatch.delenv("GIT_WORK_TREE")
    assert out.startswith("Created worktree fix")
    assert "agent/fix" in git(repo, "branch") and "agent/fix" not in git(other, "branch")


@in_s12
def test_the_managers_git_stays_pinned_to_the_lane_whatever_its_pointer_says(mod, repo, tmp_path):
    lane, _ = mod.make_lane(repo, "fix")
    other = tmp_path / "other"
    git(tmp_path, "init", "-q", "-b", "main", str(other))
    git(other, "commit", "-q", "--allow-empty", "-m", "other")
    (lane["path"] / ".git").write_text(f"gitdir: {other / '.git'}\n")   # redirected after find_lane
    assert mod.refresh(lane)["head"] == lane["head"] and mod.lane_changes(lane) == []


@in_s12
def test_a_commit_a_remote_branch_has_is_not_unmerged(mod, repo):
    lane, _ = mod.make_lane(repo, "fix")
    (lane["path"] / "new.py").write_text("x\n")
    lane, commit = mod.commit_lane(lane, "new")
    assert mod.unmerged(lane) == 1
    git(repo, "update-ref", "refs/remotes/origin/fix", commit)     # pushed: a remote has it
    assert mod.unmerged(lane) == 0


@in_s12
def test_a_childs_diffstat_counts_from_its_base_not_from_the_projects_head(mod, api, client, repo):
    """The parent works in a lane with a commit of its own; its isolated child starts
    from that commit: the child's diffstat is its own file only."""
    mod.worktree_create("fix")
    state = mod.agent_state()
    mod.write_file("parent.py", "p\n")
    state.worktree, _ = mod.commit_lane(state.worktree, "the parent's work")
    steps = [reply(tool("agent", {"prompt": "Add child.py.", "isolation": "worktree"})),
             reply(tool("write_file", {"path": "child.py", "content": "c\n"})),
             reply("Done.")]
    run_turn(mod, api, client, steps)
    report = results(message_bodies(api)[-1])[0]["content"]
    assert "child.py" in report and "parent.py" not in report and "1 file changed" in report


# --- 11-14: the smaller ones ---------------------------------------------------------------

@in_s12
def test_without_the_sandbox_a_lane_is_said_to_be_apart_by_directory_only(mod, api, client, repo):
    assert not mod.sandboxed(mod.agent_state())                    # the test default: off
    out = mod.worktree_create("fix")
    assert "apart by directory only" in out and "cannot commit there" not in out
    mod.worktree_closeout("fix", "keep")
    assert "cannot disturb this workspace" not in json.dumps(mod.TOOLS)

    def told(body):
        assert "apart by directory only: keep every command inside it" in json.dumps(body["messages"][0])
        return reply("Nothing to do.")
    run_turn(mod, api, client, [reply(tool("agent", {"prompt": "Look.", "isolation": "worktree"})), told])


@in_s12
def test_a_lane_said_to_be_apart_with_the_sandbox_on(sandboxed, repo):
    out = sandboxed.worktree_create("fix")
    assert "Your bash cannot commit there or write the main workspace." in out
    assert "apart by directory only" not in out


@in_s12
def test_carrying_the_hooks_path_says_it_turned_on_worktree_config(mod, repo):
    (repo / ".husky").mkdir()
    git(repo, "config", "core.hooksPath", ".husky")
    out = mod.worktree_create("fix")
    assert "extensions.worktreeConfig = true" in out and git(repo, "config", "extensions.worktreeConfig") == "true"


@in_s12
def test_a_file_over_the_byte_budget_is_skipped_and_the_next_one_copied(mod, repo, monkeypatch):
    monkeypatch.setattr(mod, "INCLUDE_MAX_BYTES", 100)
    (repo / "cache").mkdir()
    (repo / "cache" / "a-big.env").write_text("x" * 200)
    (repo / "cache" / "b-small.env").write_text("y\n")
    (repo / ".gitignore").write_text(".agent/\ncache/\n")
    (repo / ".worktreeinclude").write_text("cache/*.env\n")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "cache")
    out = mod.worktree_create("fix")
    lane = repo / ".agent" / "worktrees" / "fix"
    assert "copied 1 ignored file(s)" in out and "1 more not copied" in out
    assert (lane / "cache" / "b-small.env").exists() and not (lane / "cache" / "a-big.env").exists()


@in_s12
def test_a_lane_refused_as_in_use_logs_no_reuse(mod, repo):
    other = mod.AgentState(repo)
    with mod.acting_as(other):
        mod.worktree_create("busy")
    assert "in use by another agent" in refused(mod, mod.worktree_create, "busy")
    assert [e["event"] for e in events(repo)] == ["create", "enter"]
    with mod.acting_as(other):
        mod.worktree_closeout("busy", "keep")
    mod.worktree_create("busy")
    assert [e["event"] for e in events(repo)][-2:] == ["reuse", "enter"]
