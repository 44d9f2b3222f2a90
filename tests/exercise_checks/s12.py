"""Checks for exercises/s12.md. Each point: (what must hold, a hint, fn(x)).
s12.1 runs real git in the workspace; s12.2 starts the tiny MCP server of the
demos (tests/mcp_tiny_server.py), one process per point, stopped after it."""
import contextlib
import io
import os
import re
import subprocess
import sys
from pathlib import Path

from fake_api import reply, tool

TINY = str(Path(__file__).resolve().parents[1] / "mcp_tiny_server.py")
GIT_ID = ("-c", "user.name=learner", "-c", "user.email=learner@example.com", "-c", "core.hooksPath=/dev/null")


def turn(x, steps, prompt="do the work"):
    """x.turn with the agent's output kept (x.err: what it printed on stderr), not shown."""
    out, err = io.StringIO(), io.StringIO()
    x.patch(sys, "stdin", io.StringIO(""))  # a question nobody answers reads end of input: no
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        history = x.turn(steps, prompt)
    x.err = getattr(x, "err", "") + err.getvalue()
    return history


def step(name, args):
    return reply(tool(name, args))


# s12.1: worktree_closeout merge --------------------------------------------------------
APP = "def parse(text):\n    return text.split(',')\n"


def git(where, *args):
    """git as the human runs it (no hooks of theirs run for the checker's own commits)."""
    p = subprocess.run(["git", *GIT_ID, *args], cwd=where, capture_output=True, text=True)
    assert p.returncode == 0, f"git {args[0]} failed: {p.stderr.strip()}"
    return p.stdout.strip()


def repo(x):
    """The workspace as a repository on main with one commit (app.py; .agent/ ignored),
    and hooks in .git/hooks that leave a mark whenever git runs them."""
    git(x.ws, "init", "-q")
    git(x.ws, "symbolic-ref", "HEAD", "refs/heads/main")
    git(x.ws, "config", "user.name", "learner")  # a merge commit could be made: only a fast-forward may be
    git(x.ws, "config", "user.email", "learner@example.com")
    (x.ws / "app.py").write_text(APP)
    (x.ws / ".gitignore").write_text(".agent/\n")
    git(x.ws, "add", "-A")
    git(x.ws, "commit", "-q", "-m", "first")
    marker = x.ws.parent / "hooks-ran.txt"
    for hook in ("post-merge", "post-commit", "pre-commit", "reference-transaction", "post-checkout"):
        path = x.ws / ".git" / "hooks" / hook
        path.write_text(f"#!/bin/sh\necho {hook} >> '{marker}'\n")
        path.chmod(0o755)
    return git(x.ws, "rev-parse", "HEAD")


def lane_dir(x, name="feat"):
    return x.ws / ".agent" / "worktrees" / name


def branches(x):
    return git(x.ws, "branch", "--format=%(refname:short)").split()


FEATURE = "def shout(text):\n    return text.upper()\n"


def work_in_lane(x, then_action):
    """The agent makes lane feat, writes feature.py there, and closes out with then_action.
    Returns the closeout's tool result."""
    history = turn(x, [step("worktree_create", {"name": "feat"}),
                       step("write_file", {"path": "feature.py", "content": FEATURE}),
                       step("worktree_closeout", {"name": "feat", "action": then_action})])
    results = x.tool_results(history)
    for r in results[:2]:
        assert not r.get("is_error"), f"the lane could not be made or written: {r['content'][:300]!r}"
    return results[2]


def merged_into_main(x):
    first = repo(x)
    result = work_in_lane(x, "merge")
    assert not result.get("is_error"), f"worktree_closeout merge failed: {result['content'][:300]!r}"
    assert git(x.ws, "rev-parse", "HEAD") != first, "the main checkout's HEAD did not move"
    assert "feature.py" in git(x.ws, "show", "--name-only", "--format=", "HEAD").split(), \
        "the main branch's new commit does not hold feature.py"
    assert (x.ws / "feature.py").read_text() == FEATURE, "feature.py is not in the main checkout"
    assert not git(x.ws, "status", "--porcelain", "--untracked-files=no"), "the main checkout is left dirty"


def lane_gone_agent_back(x):
    repo(x)
    result = work_in_lane(x, "merge")
    assert not result.get("is_error"), f"worktree_closeout merge failed: {result['content'][:300]!r}"
    assert not lane_dir(x).exists(), "the merged lane's folder is still there"
    assert "agent/feat" not in branches(x), "the merged lane's branch agent/feat is still there"
    assert x.state.workdir == x.ws.resolve() and not x.state.worktree, \
        f"after the merge the agent works in {x.state.workdir}, not the main workspace"


def merge_now(x):
    """worktree_closeout merge of lane feat, from the main workspace: its tool result."""
    return x.tool_results(turn(x, [step("worktree_closeout", {"name": "feat", "action": "merge"})]))[0]


def refused_when_main_is_dirty(x):
    first = repo(x)
    (x.ws / "app.py").write_text(APP + "# the human's own edit\n")
    result = work_in_lane(x, "merge")
    assert result.get("is_error"), f"merge went ahead over the human's uncommitted edit: {result['content'][:300]!r}"
    assert (x.ws / "app.py").read_text().endswith("# the human's own edit\n"), "the human's edit is lost"
    assert git(x.ws, "rev-parse", "HEAD") == first, "the main branch moved although the merge was refused"
    assert (lane_dir(x) / "feature.py").exists(), "the refused lane lost the agent's work"
    git(x.ws, "stash", "-q")  # the human puts their edit aside: now it may go ahead
    result = merge_now(x)
    assert not result.get("is_error") and (x.ws / "feature.py").exists(), \
        f"once the main checkout was clean the merge still failed: {result['content'][:300]!r}"


def refused_when_main_moved_or_busy(x):
    repo(x)
    result = work_in_lane(x, "keep")
    assert not result.get("is_error"), f"worktree_closeout keep failed: {result['content'][:300]!r}"
    (x.ws / "NOTES.md").write_text("the human went on\n")
    git(x.ws, "add", "NOTES.md")
    git(x.ws, "commit", "-q", "-m", "the human's commit")
    moved = git(x.ws, "rev-parse", "HEAD")
    result = merge_now(x)
    assert result.get("is_error"), f"merge went ahead although main moved on (no fast-forward): {result['content'][:300]!r}"
    assert git(x.ws, "rev-parse", "HEAD") == moved and lane_dir(x).exists(), \
        "a refused merge changed main or removed the lane"
    git(x.ws, "reset", "-q", "--hard", "HEAD~1")  # main back where the lane forked: a fast-forward again
    busy = x.mod.lock_lane(x.mod.find_lane(x.ws, "feat"), shared=True)  # another agent works in it
    try:
        result = merge_now(x)
    finally:
        if busy is not None:
            os.close(busy)
    assert result.get("is_error") and lane_dir(x).exists(), \
        f"a lane another agent works in was merged and removed: {result['content'][:300]!r}"
    result = merge_now(x)
    assert not result.get("is_error") and (x.ws / "feature.py").exists(), \
        f"with main back and the lane free, the merge from the main workspace failed: {result['content'][:300]!r}"


def hooks_never_run(x):
    repo(x)
    result = work_in_lane(x, "merge")
    assert not result.get("is_error"), f"worktree_closeout merge failed: {result['content'][:300]!r}"
    marker = x.ws.parent / "hooks-ran.txt"
    assert not marker.exists(), f"git ran the repository's hooks: {marker.read_text().split()}"


# s12.2: a per-server tool list -------------------------------------------------------------
def start_tiny(x, **settings):
    """Connect the tiny server as the user's own config would (settings added to its entry)."""
    config = {"tiny": {"command": sys.executable, "args": [TINY], **settings}}
    x.state.permissions["mcp_servers"] = [("user", "~/.agent/config.yaml", config)]
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        x.mod.start_mcp(wait=20)
    x.err = getattr(x, "err", "") + err.getvalue()
    return x.mod.MCP_SERVERS


@contextlib.contextmanager
def tiny(x, **settings):
    try:
        yield start_tiny(x, **settings)
    finally:
        with contextlib.redirect_stderr(io.StringIO()):
            x.mod.close_mcp()


def sent_tools(x):
    turn(x, [], prompt="hello")
    return [t["name"] for t in x.bodies()[-1]["tools"] if t["name"].startswith("mcp__tiny__")]


def only_listed_tools(x):
    with tiny(x, tools=["word_count", "shout"]) as servers:
        assert servers.get("tiny", {}).get("state") == "connected", f"the server did not start: {x.err[-300:]}"
        names = sent_tools(x)
    assert sorted(names) == ["mcp__tiny__shout", "mcp__tiny__word_count"], \
        f"with tools: [word_count, shout] the model was offered {names}"


def unlisted_tool_not_called(x):
    with tiny(x, tools=["shout"]):
        history = turn(x, [step("mcp__tiny__shout", {"text": "hi"}), step("mcp__tiny__env", {"name": "HOME"})])
    listed, left_out = x.tool_results(history)
    assert listed["content"] == "HI", f"the listed tool shout did not work: {listed['content'][:200]!r}"
    assert left_out.get("is_error") and str(Path.home()) not in left_out["content"], \
        f"a tool left out of the list was called on the server: {left_out['content'][:200]!r}"


def no_list_every_tool(x):
    with tiny(x):
        names = sent_tools(x)
    assert sorted(names) == ["mcp__tiny__env", "mcp__tiny__shout", "mcp__tiny__word_count"], \
        f"without a tools list the model was offered {names}"


def empty_list_and_bad_list(x):
    with tiny(x, tools=[]) as servers:
        state = servers.get("tiny", {}).get("state")
        names = sent_tools(x)
    assert state == "connected" and names == [], \
        f"with tools: [] the server should start and offer nothing; it is {state!r}, offering {names}"
    x.err = ""
    with tiny(x, tools="shout") as servers:
        started = "tiny" in servers
    assert not started, "a server whose tools setting is not a list was started"
    lines = [line for line in x.err.splitlines() if re.search(r"\btools?\b", line, re.I)]
    assert lines, f"no line said what is wrong with tools: {x.err[-300:]!r}"


def missing_name_warned(x):
    with tiny(x, tools=["shout", "nope"]):
        names = sent_tools(x)
    assert names == ["mcp__tiny__shout"], f"with tools: [shout, nope] the model was offered {names}"
    assert any("nope" in line for line in x.err.splitlines()), \
        f"nothing said that the server has no tool nope: {x.err[-300:]!r}"


EXERCISES = {
    1: ("worktree_closeout merge: bring a lane's work home", [
        ("merge commits the lane's work and fast-forwards the main checkout to it",
         "commit_lane() commits the lane; git merge --ff-only with the lane's HEAD, run in the "
         "project (project_dir, or the lane's origin), brings it home.",
         merged_into_main),
        ("then the lane and its branch are removed, and the agent is back in the main workspace",
         "After the merge it is remove's work: leave_lane() when inside it, then remove_lane().",
         lane_gone_agent_back),
        ("refused while the main checkout has uncommitted changes, nothing lost; done once it is clean",
         "git merges over uncommitted changes whenever they are not in its way: what can you ask "
         "git before anything is committed or merged?",
         refused_when_main_is_dirty),
        ("refused when main moved on (no fast-forward) or another agent works in the lane; else done",
         "git merge-base --is-ancestor HEAD <lane head> says whether a fast-forward is possible. "
         "Which actions take the lane's lock in worktree_closeout()?",
         refused_when_main_moved_or_busy),
        ("no hook of the repository runs",
         "How does the manager run its own git commands, and why? Run yours the same way.",
         hooks_never_run),
    ]),
    2: ("a per-server list of the tools it may offer", [
        ("tools: [word_count, shout] registers those two and no other",
         "Add tools to MCP_KEYS and to the spec parse_server() returns, then follow the spec to "
         "where the server's tools are registered.",
         only_listed_tools),
        ("a listed tool works; a tool left out cannot be called",
         "A tool that is never registered is an unknown tool: run_tool() refuses it before any server sees it.",
         unlisted_tool_not_called),
        ("without tools every tool is registered, as before",
         "No list means no filter.",
         no_list_every_tool),
        ("tools: [] offers no tool; tools that is not a list: not started, one line says why",
         "What does your filter do with `[]`? And how does parse_server() refuse a bad entry today "
         "(look for the check of another list setting)?",
         empty_list_and_bad_list),
        ("a listed name the server lacks gets one line, and the rest still work",
         "Compare the list with the names the server sent, and warn_once() about the ones it lacks.",
         missing_name_warned),
    ]),
}
