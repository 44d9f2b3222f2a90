"""s12 demo: a subagent edits code in a git worktree of its own; an MCP server's tool, deferred, is found with tool_search.

The workspace is a git repository with one commit: csv_tools.py, whose split_row
keeps the spaces around each field, and a .mcp.json (Claude Code's format) that
runs the bundled tiny MCP server words_server.py over stdio, with defer: true
(its tools stay out of the requests until the model searches for them), and
--trace (the server writes each JSON-RPC message to its stderr). Watch stderr,
and .agent/worktrees/ and .agent/mcp/ with --keep:
  1. At start-up .mcp.json is a project file, so it is asked about first: the
     question shows the server's command line. The piped y trusts it; the server
     connects (the initialize handshake, tools/list) and its three tools are
     registered as mcp__words__<tool>, deferred. Its stderr goes to
     .agent/mcp/words.log, which the demo prints at the end: the exchange,
     initialize, notifications/initialized, tools/list and tools/call.
     In --show-requests the first request carries tool_search but no
     mcp__words__ tool, and a <system-reminder> names the deferred ones.
  2. The model hands the fix to a subagent with isolation "worktree". The
     manager runs `git worktree add -b agent/agent-<8 hex>` into
     .agent/worktrees/agent-<8 hex>, from the last commit, and sets it up
     (here: the git-ignored .env, which .worktreeinclude selects, is copied).
  3. The child's workdir is that folder; the process never changes directory.
     Its task begins with a <worktree> block: where it is, and that the paths it
     was given point into the main checkout and must be read again there.
  4. The child reads csv_tools.py in its lane, fixes it and adds a test. Its
     edits land in the lane only: the main workspace's file is unchanged.
  5. When it ends, the manager (not the child) commits its work on its branch,
     with no git hooks and without .agent/, and the parent's tool result gets
     the branch name and a diffstat. The lane stays for review, because its
     branch has a commit no other branch has.
  6. The parent drafts a release note. To count its words it calls tool_search
     ("count"): the result holds word_count's full definition, and from
     the next request on the tools list ends with mcp__words__word_count.
     It calls it. An MCP tool asks by default (the server's readOnlyHint only
     lets such calls run in parallel), so the second piped y allows it; the
     call goes to the server as tools/call and its text comes back as the tool
     result.
  7. The parent answers with the branch to review and the note; every worktree
     step is in .agent/worktrees/events.jsonl.
"""
import json
import shutil
import subprocess
import sys
from pathlib import Path

from fake_api import reply, text, tool

PROMPT = ("split_row in csv_tools.py keeps the spaces around fields. Have a subagent fix it in "
          "a worktree of its own, with a test, so this checkout stays as it is until I review. "
          "Then give me a release note under 20 words; count them with the words server.")
ENV = {"AGENT_PERMISSION_MODE": "acceptEdits",   # the child's edits need no question
       "AGENT_AUTO_MEMORY": "0"}                 # no memory side calls (s09 shows those)
INPUT = "y\ny\n"  # the human: trust .mcp.json at start-up, then allow the one MCP tool call
FAKED = ("The git identity: the scratch HOME has no ~/.gitconfig, so the workspace's first "
         "commit is made with a fixed test name, and the manager's commit uses its own "
         "(agent worktree manager). The MCP server is real but tiny: tests/mcp_tiny_server.py, "
         "standard library only, copied into the workspace as words_server.py.")

CODE = 'def split_row(line):\n    """The fields of one CSV line."""\n    return line.split(",")\n'
FIXED = 'return [field.strip() for field in line.split(",")]'
TEST = ('from csv_tools import split_row\n\n'
        'assert split_row("a, b ,c") == ["a", "b", "c"]\nprint("ok")\n')
IDENTITY = ["-c", "user.name=demo", "-c", "user.email=demo@example.com"]
NOTE = "csv_tools: split_row now strips the spaces around each field; a test checks it."
PYTHON = "python3" if shutil.which("python3") else sys.executable  # the server needs only the stdlib
MCP_JSON = {"mcpServers": {"words": {"type": "stdio", "command": PYTHON, "args": ["words_server.py", "--trace"],
                                     "defer": True}}}


def git(workspace, *args):
    return subprocess.run(["git", *IDENTITY, *args], cwd=workspace, capture_output=True,
                          text=True, check=True).stdout.strip()


def SETUP(workspace):
    """a git repository on main with one commit (csv_tools.py, a .gitignore of .agent/
    and .env, a .worktreeinclude naming .env, and a .mcp.json that runs words_server.py,
    the bundled tiny MCP server), plus the git-ignored .env."""
    (workspace / "csv_tools.py").write_text(CODE)
    shutil.copy(Path(__file__).resolve().parent.parent / "mcp_tiny_server.py", workspace / "words_server.py")
    (workspace / ".mcp.json").write_text(json.dumps(MCP_JSON, indent=2) + "\n")
    (workspace / ".gitignore").write_text(".agent/\n.env\n")
    (workspace / ".worktreeinclude").write_text(".env\n")
    (workspace / ".env").write_text("CSV_DIALECT=excel\n")
    git(workspace, "init", "-q", "-b", "main")
    git(workspace, "add", "-A")
    git(workspace, "commit", "-q", "-m", "csv_tools: split_row")


def first_text(body):
    content = body["messages"][0]["content"]
    return content if isinstance(content, str) else " ".join(b.get("text", "") for b in content)


def results(body):
    return [b["content"] for b in body["messages"][-1]["content"]
            if isinstance(b, dict) and b.get("type") == "tool_result"]


def child_starts(body):
    """The child's first request: its task opens with the <worktree> block."""
    task = first_text(body)
    if "<worktree>" not in task or "on branch agent/agent-" not in task:
        return reply(f"(demo: expected the task to say which worktree, got {task[:200]!r})")
    return reply(text("I work in my own checkout; reading the file there."),
                 tool("read_file", {"path": "csv_tools.py"}))


def child_fixes(body):
    return reply(tool("edit_file", {"path": "csv_tools.py", "old_string": 'return line.split(",")',
                                    "new_string": FIXED}),
                 tool("write_file", {"path": "test_csv_tools.py", "content": TEST}))


def tool_names(body):
    return [t["name"] for t in body.get("tools", [])]


def parent_starts(body):
    """The first request: tool_search, no words tool, and the reminder naming the deferred ones."""
    first = first_text(body)
    if "tool_search" not in tool_names(body) or any(n.startswith("mcp__words__") for n in tool_names(body)):
        return reply(f"(demo: expected tool_search and no words tool, got {tool_names(body)})")
    if "# Deferred tools" not in first or "- mcp__words__word_count: " not in first:
        return reply("(demo: expected the deferred tools named in a reminder)")
    return reply(text("A subagent in its own worktree will fix it."),
                 tool("agent", {"description": "strip CSV fields", "isolation": "worktree",
                                "prompt": "In csv_tools.py, make split_row strip the spaces around each "
                                          "field, and add test_csv_tools.py checking it. Report what you "
                                          "changed."}))


def parent_reviews(body):
    """The parent's tool result: the child's report, its branch and the diffstat. Then
    a search for the deferred tool that counts words."""
    report = results(body)[0] if results(body) else ""
    if "[worktree agent-" not in report or "2 files changed" not in report:
        return reply(f"(demo: expected the branch and a diffstat, got {report[-400:]!r})")
    return reply(text("The fix is on its branch. Now the note; the words server's tools are deferred."),
                 tool("tool_search", {"query": "count"}))


def parent_counts(body):
    """tool_search loaded word_count: its definition in the result, the tool at the end of the list."""
    found = results(body)[0] if results(body) else ""
    if not found.startswith("Loaded 1 tool definition(s)") or '"name": "mcp__words__word_count"' not in found:
        return reply(f"(demo: expected word_count's definition, got {found[:200]!r})")
    if tool_names(body)[-1:] != ["mcp__words__word_count"]:
        return reply(f"(demo: expected the found tool at the end of the list, got {tool_names(body)[-3:]})")
    return reply(tool("mcp__words__word_count", {"text": NOTE}))


def branch_of(body):
    """The lane's branch, from the agent call's result earlier in the conversation."""
    for message in body["messages"]:
        for block in message["content"] if isinstance(message["content"], list) else []:
            if block.get("type") == "tool_result" and "branch agent/" in str(block.get("content")):
                return str(block["content"]).split("branch ", 1)[1].split()[0]
    return "(no branch)"


def parent_answers(body):
    """The count from the server reaches the model as the tool result."""
    counted = results(body)[0] if results(body) else ""
    words = len(NOTE.split())
    if counted != f"{words} words":
        return reply(f"(demo: expected the server's count, '{words} words', got {counted!r})")
    branch = branch_of(body)
    return reply(f"The fix is on branch {branch} (csv_tools.py and a new test_csv_tools.py); this "
                 f"checkout is unchanged. Review it with `git diff main {branch}` and merge with "
                 f"`git merge {branch}`; then the worktree can be removed.\n\n"
                 f"Release note ({counted}): {NOTE}")


STEPS = [
    parent_starts,
    child_starts,
    child_fixes,
    reply("Scope: split_row now strips each field; test_csv_tools.py checks it."),
    parent_reviews,
    parent_counts,
    parent_answers,
]


FULL_RESULTS = ("tool_search",)   # the definition it loads, in full in --show-requests


def SENDER(body):
    """The main agent, or the subagent in its worktree (its task opens with <worktree>)."""
    return "subagent in its worktree" if "<worktree>" in first_text(body) else "main agent"


def lane_names(workspace):
    folder = workspace / ".agent" / "worktrees"
    return sorted(p.name for p in folder.iterdir() if p.is_dir()) if folder.exists() else []


def CHECK(workspace, stdout):
    """the main checkout unchanged (csv_tools.py as committed, no test file, git status
    clean); one lane, .agent/worktrees/agent-<hex>, whose branch has one commit holding
    exactly csv_tools.py (fixed) and test_csv_tools.py, and nothing left uncommitted
    in it; the lane got the ignored .env; the event log has create, made_for, enter,
    commit and leave; the answer names the branch and the word count the MCP server gave;
    the server's stderr, .agent/mcp/words.log, holds the JSON-RPC exchange: initialize,
    notifications/initialized, tools/list, and tools/call of word_count."""
    assert (workspace / "csv_tools.py").read_text() == CODE, "the main checkout's file changed"
    assert not (workspace / "test_csv_tools.py").exists(), "the test landed in the main checkout"
    assert git(workspace, "status", "--porcelain") == "", "the main checkout is not clean"
    names = lane_names(workspace)
    assert len(names) == 1 and names[0].startswith("agent-"), f"expected one agent lane, got {names}"
    branch, lane = f"agent/{names[0]}", workspace / ".agent" / "worktrees" / names[0]
    files = git(workspace, "show", "--name-only", "--format=", branch).splitlines()
    assert sorted(files) == ["csv_tools.py", "test_csv_tools.py"], f"the commit holds {files}"
    assert FIXED in git(workspace, "show", f"{branch}:csv_tools.py"), "the fix is not on the branch"
    assert git(lane, "status", "--porcelain") == "", "work left uncommitted in the lane"
    assert (lane / ".env").read_text() == "CSV_DIALECT=excel\n", ".worktreeinclude's .env not copied"
    assert f"Release note ({len(NOTE.split())} words)" in stdout, "the server's count is not in the answer"
    assert "tiny: started" in (workspace / ".agent" / "mcp" / "words.log").read_text(), \
        "the server's stderr is not in .agent/mcp/words.log"
    sent = [m.get("method") for arrow, m in exchange(workspace) if arrow == "<-"]
    assert sent[:3] == ["initialize", "notifications/initialized", "tools/list"] and \
        sent.count("tools/call") == 1, f"the client sent: {sent}"
    call = next(m for arrow, m in exchange(workspace) if m.get("method") == "tools/call")
    assert call["params"] == {"name": "word_count", "arguments": {"text": NOTE}}, f"tools/call: {call}"
    log = [json.loads(line)["event"] for line in
           (workspace / ".agent" / "worktrees" / "events.jsonl").read_text().splitlines()]
    assert log == ["create", "made_for", "enter", "commit", "leave"], f"events: {log}"
    assert f"branch {branch}" in stdout, "the answer does not name the branch"


def exchange(workspace):
    """(arrow, message) for each JSON-RPC line the server traced in .agent/mcp/words.log."""
    found = []
    for line in (workspace / ".agent" / "mcp" / "words.log").read_text().splitlines():
        if line[:3] in ("<- ", "-> "):
            found.append((line[:2], json.loads(line[3:])))
    return found


def SHOW(workspace):
    """the MCP exchange as the server traced it in .agent/mcp/words.log (<- what the agent
    sent, -> the server's answer), the lane's branch as git shows it (git log --stat), and
    the event log .agent/worktrees/events.jsonl, one line per life-cycle step."""
    lines = ["The MCP exchange (.agent/mcp/words.log, the server's --trace): JSON-RPC 2.0, one line each."]
    for arrow, m in exchange(workspace):
        what = m.get("method") or ("result" if "result" in m else "error")
        line = json.dumps(m, ensure_ascii=False)
        lines.append(f"  {arrow} {what:<26} {line[:120] + '...' * (len(line) > 120)}")
    return "\n".join(lines) + "\n\n" + SHOW_LANE(workspace)


def SHOW_LANE(workspace):
    names = lane_names(workspace)
    if not names:
        return "(no worktree was made)"
    lines = [f"git log --stat main..agent/{names[0]}:"]
    lines += ["  " + line for line in git(workspace, "log", "--stat", "--format=%h %an: %s",
                                          f"main..agent/{names[0]}").splitlines()]
    lines += ["", "The event log (.agent/worktrees/events.jsonl):"]
    for line in (workspace / ".agent" / "worktrees" / "events.jsonl").read_text().splitlines():
        e = json.loads(line)
        extra = {k: v for k, v in e.items() if k not in ("time", "event", "name", "by", "pid")}
        lines.append(f"  {e['event']:<8} {e['name']}  by {e['by']}  " + json.dumps(extra)[:110])
    return "\n".join(lines)
