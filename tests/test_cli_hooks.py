"""agent_full's Claude Code hooks, held against the real Claude Code CLI (full.3).

One workspace layout and one .claude/settings.json: every hook keeps the JSON it
gets on stdin, and a Stop hook written the way Claude Code's loop plugins write
theirs (grep and jq over transcript_path for the last assistant message, a state
file counting the iterations, a block with a reason) sends the model back until it
prints <promise>DONE</promise>. One scripted session (a Read, a Write that creates
a file, a Write that replaces one, an Edit, a Bash, then three final texts, the
loop's three iterations) runs once through the CLI bundled with claude-agent-sdk,
offline against the scripted API (as tests/test_cli_corpus.py runs it), and once
through `agent_full.py -p`. Then, event by event, a hook must have got the same
top-level keys, the same tool_response shapes, and a transcript_path in the CLI's
line format. INTENDED is every difference left, with its reason; the Claude Code
compatibility section of docs/agent_full.md lists them too.
"""
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import ROOT, once_per_run
from fake_api import ScriptedAPI, reply, tool
from test_cli_corpus import cli_binary, cli_env

# Top-level keys the CLI sends that agent_full does not, and why.
INTENDED = {"effort": "agent_full sends no effort level with its requests (the API's default applies), "
                      "so it has none to report"}
# Keys of a tool's input the CLI's hooks see that ours do not, and why.
INPUT_INTENDED = {"description": "our bash tool takes no description input (the model says what a "
                                 "command is for in its text)"}
EVENTS = ["SessionStart", "UserPromptSubmit", "PreToolUse", "PostToolUse", "Stop", "SessionEnd"]
DUMP = 'cat > "$CLAUDE_PROJECT_DIR/dumps/{event}.$(date +%s%N).json"; ' \
       'printf "%s\\n" "$CLAUDE_PROJECT_DIR" >> "$CLAUDE_PROJECT_DIR/dumps/project-dir.txt"'
# The loop hook, written from the protocol: the Stop event on stdin; the transcript's
# last assistant line read with grep and jq; a block is JSON with decision and reason.
LOOP = r"""#!/bin/bash
set -euo pipefail
input=$(cat)
state="$CLAUDE_PROJECT_DIR/loop-state"
transcript=$(printf '%s' "$input" | jq -r '.transcript_path')
last=$(grep '"role":"assistant"' "$transcript" | tail -n 1 |
       jq -r '.message.content | map(select(.type == "text")) | map(.text) | join("\n")')
n=$(cat "$state" 2>/dev/null || echo 1)
if printf '%s' "$last" | grep -q '<promise>DONE</promise>' || [ "$n" -ge 5 ]; then
  echo "done after $n" > "$CLAUDE_PROJECT_DIR/loop-result"
  rm -f "$state"
  exit 0
fi
echo $((n + 1)) > "$state"
jq -n --arg reason "Iteration $((n + 1)): the last answer was \"$last\"; keep going until DONE." \
  '{decision: "block", reason: $reason}'
"""
TEXTS = ["All done.", "Iteration 2 done.", "Iteration 3 done. <promise>DONE</promise>"]


def settings():
    hooks = {e: [{"matcher": "*", "hooks": [{"type": "command", "command": DUMP.format(event=e)}]}]
             if "Tool" in e else [{"hooks": [{"type": "command", "command": DUMP.format(event=e)}]}]
             for e in EVENTS}
    hooks["Stop"][0]["hooks"].append({"type": "command", "command": 'bash "$CLAUDE_PROJECT_DIR/.claude/hooks/loop.sh"'})
    return {"hooks": hooks}


def script(work, claude):
    """The session in the CLI's tool names and inputs (claude) or ours."""
    f = lambda name: str(work / name)
    if claude:
        calls = [tool("Read", {"file_path": f("notes.txt")}),
                 tool("Write", {"file_path": f("out.txt"), "content": "one\ntwo\n"}),
                 tool("Write", {"file_path": f("notes.txt"), "content": "alpha\ngamma\n"}),
                 tool("Edit", {"file_path": f("notes.txt"), "old_string": "gamma", "new_string": "delta"}),
                 tool("Bash", {"command": "echo hi", "description": "Say hi"})]
    else:
        calls = [tool("read_file", {"path": "notes.txt"}),
                 tool("write_file", {"path": "out.txt", "content": "one\ntwo\n"}),
                 tool("write_file", {"path": "notes.txt", "content": "alpha\ngamma\n"}),
                 tool("edit_file", {"path": "notes.txt", "old_string": "gamma", "new_string": "delta"}),
                 tool("bash", {"command": "echo hi"})]
    return [reply(c) for c in calls] + [reply(t) for t in TEXTS]


def layout(root):
    home, work = root / "home", root / "work"
    (work / "dumps").mkdir(parents=True)
    (work / ".claude" / "hooks").mkdir(parents=True)
    home.mkdir()
    (work / "notes.txt").write_text("alpha\nbeta\n")
    (work / ".claude" / "settings.json").write_text(json.dumps(settings(), indent=2))
    (work / ".claude" / "hooks" / "loop.sh").write_text(LOOP)
    return home, work


def collect(api, proc, home, work):
    dumps = sorted((work / "dumps").glob("*.json"), key=lambda p: int(p.name.split(".")[1]))
    events = [(p.name.split(".")[0], json.loads(p.read_text())) for p in dumps]
    transcript = next((e["transcript_path"] for _, e in events if e["hook_event_name"] == "Stop"), None)
    lines = [json.loads(line) for line in Path(transcript).read_text().splitlines()] if transcript else []
    return {"returncode": proc.returncode, "stdout": proc.stdout, "stderr": proc.stderr[-3000:],
            "events": events, "transcript": lines, "home": str(home), "cwd": str(work),
            "remaining": api.remaining(), "exhausted": api.exhausted,
            "requests": [r["body"] for r in api.requests if r["path"].startswith("/v1/messages")],
            "project_dirs": sorted(set((work / "dumps" / "project-dir.txt").read_text().split())),
            "loop_result": (work / "loop-result").read_text().strip() if (work / "loop-result").exists() else None}


def run_cli(binary, api, root):
    home, work = layout(root / "cli")
    api.reset(full=True)
    api.script(script(work, claude=True))
    proc = subprocess.run([str(binary), "-p", "do it", "--output-format", "json",
                           "--permission-mode", "bypassPermissions"],
                          cwd=work, env=cli_env(api, home), capture_output=True, text=True, timeout=120)
    api.settle()
    return collect(api, proc, home, work)


def run_full(api, root):
    home, work = layout(root / "full")
    api.reset(full=True)
    api.script(script(work, claude=False))
    env = {k: v for k, v in os.environ.items() if k in ("PATH", "LANG")}
    env |= {"HOME": str(home), "ANTHROPIC_API_KEY": "test", "ANTHROPIC_BASE_URL": api.url, "AGENT_AUTO_MEMORY": "0"}
    proc = subprocess.run([sys.executable, str(ROOT / "agent_full.py"), "-p", "do it", "--output-format", "json",
                           "--permission-mode", "bypassPermissions", "--trust-workspace"],
                          cwd=work, env=env, capture_output=True, text=True, timeout=120)
    api.settle()
    return collect(api, proc, home, work)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """The session run once by the CLI (when it can run here) and once by agent_full,
    once per test run, shared by the workers (once_per_run)."""
    def both(root):
        binary, why = cli_binary()
        with ScriptedAPI() as api:
            return {"cli": run_cli(binary, api, root) if binary else {"skip": why}, "full": run_full(api, root)}
    return once_per_run(tmp_path_factory, "cli-hooks", both)


def cli(runs):
    if "skip" in runs["cli"]:
        pytest.skip(runs["cli"]["skip"])
    run = runs["cli"]
    assert run["returncode"] == 0, run["stderr"] + run["stdout"][-2000:]
    return run


def by_event(run):
    """[(event, tool_name or None, payload)] in the order they ran, tools by call order."""
    order = {}
    for event, payload in run["events"]:
        if "tool_use_id" in payload:
            order.setdefault(payload["tool_use_id"], len(order))
    return [(e, p.get("tool_name"), order.get(p.get("tool_use_id")), p) for e, p in run["events"]]


def shape(run, event, n=None):
    return [p for e, _, i, p in by_event(run) if e == event and (n is None or i == n)]


def plain(obj, run):
    """obj with the run's own folders as placeholders."""
    text = json.dumps(obj)
    for real, mark in ((run["cwd"], "<CWD>"), (run["home"], "<HOME>")):
        text = text.replace(real, mark)
    return json.loads(text)


# --- the tests ------------------------------------------------------------------------

def test_agent_full_runs_the_session_and_the_loop_three_times(runs):
    full = runs["full"]
    assert full["returncode"] == 0, full["stderr"]
    assert full["remaining"] == 0 and full["exhausted"] == 0        # 5 calls, then exactly 3 iterations
    assert json.loads(full["stdout"])["result"] == TEXTS[-1]
    assert full["loop_result"] == "done after 3"
    assert [p["stop_hook_active"] for p in shape(full, "Stop")] == [False, True, True]
    reasons = ["".join(b.get("text", "") for b in body["messages"][-1]["content"]) for body in full["requests"][-2:]]
    assert 'Iteration 2: the last answer was "All done."' in reasons[0]      # read from the transcript
    assert 'Iteration 3: the last answer was "Iteration 2 done."' in reasons[1]
    assert full["project_dirs"] == [full["cwd"]]                   # CLAUDE_PROJECT_DIR, every hook


def test_the_cli_runs_the_same_loop(runs):
    run = cli(runs)
    assert run["remaining"] == 0 and run["exhausted"] == 0 and run["loop_result"] == "done after 3"
    assert [p["stop_hook_active"] for p in shape(run, "Stop")] == [False, True, True]
    assert run["project_dirs"] == [run["cwd"]]


def test_each_event_has_the_clis_top_level_keys(runs):
    run, full = cli(runs), runs["full"]
    for event in EVENTS:
        theirs, ours = shape(run, event), shape(full, event)
        assert len(theirs) == len(ours) > 0, event
        for a, b in zip(theirs, ours):
            assert set(a) - set(INTENDED) == set(b), f"{event} {a.get('tool_name', '')}"
    left = {k for _, p in runs["cli"]["events"] for k in p} - {k for _, p in full["events"] for k in p}
    assert left == set(INTENDED)                                    # nothing listed that is not a difference


def test_tool_inputs_and_responses_have_the_clis_shapes(runs):
    run, full = cli(runs), runs["full"]
    for n in range(5):
        (a,), (b,) = shape(run, "PostToolUse", n), shape(full, "PostToolUse", n)
        assert a["tool_name"] == b["tool_name"]
        assert set(a["tool_input"]) - set(INPUT_INTENDED) == set(b["tool_input"])
        assert plain(a["tool_response"], run) == plain(b["tool_response"], full), a["tool_name"]
    for event in ("PreToolUse", "Stop"):
        a = [(p.get("tool_name"), p.get("background_tasks"), p.get("session_crons")) for p in shape(run, event)]
        assert a == [(p.get("tool_name"), p.get("background_tasks"), p.get("session_crons"))
                     for p in shape(full, event)]


def test_transcript_path_is_in_the_clis_line_format(runs):
    run, full = cli(runs), runs["full"]
    convo = lambda lines: [line for line in lines if line.get("type") in ("user", "assistant")]
    theirs, ours = convo(run["transcript"]), convo(full["transcript"])
    keys = {k for line in theirs for k in line}
    message_keys = {k for line in theirs for k in line["message"]}
    core = {"type", "message", "uuid", "parentUuid", "sessionId", "timestamp", "cwd", "isSidechain"}
    assert core <= keys
    for line in ours:
        assert core <= set(line) <= keys and set(line["message"]) <= message_keys == message_keys | {"role", "content"}
        assert line["sessionId"] == shape(full, "Stop")[0]["session_id"] and line["cwd"] == full["cwd"]
    blocks = lambda lines, role: [[b["type"] for b in line["message"]["content"]] if isinstance(
        line["message"]["content"], list) else "text" for line in lines if line["type"] == role]
    assert blocks(ours, "assistant") == blocks(theirs, "assistant") == [["tool_use"]] * 5 + [["text"]] * 3
    results = lambda lines: sum(b == ["tool_result"] for b in blocks(lines, "user"))
    assert results(ours) == results(theirs) == 5
    chain = [line for line in full["transcript"]]
    assert all(b["parentUuid"] == a["uuid"] for a, b in zip(chain, chain[1:]))
    assert re.fullmatch(r".*/\.agent/transcripts/[\w-]+\.claude\.jsonl", shape(full, "Stop")[0]["transcript_path"])
