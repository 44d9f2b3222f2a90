"""s09: a resumed session sends, request for request, what the live session would have sent.

The resume equality test runs one scripted session twice against the scripted API:
once in one process (a REPL, its four prompts piped in), once split over four
processes, each after the first started with --continue. The session is scenario L
in small: distinct 14 KB files read over four prompts, so old results are cleared
in batches; the model asks for a compaction in the third prompt (the summary call,
the re-attached files); a plan with open items draws a reminder every few rounds;
an edit in a later process changes a file read in an earlier one (the file-read
records). A long answer ends prompts 1 and 3, so the first request after each
of those resumes is over the working budget: after prompt 1 it clears a batch
(the sent marks decide which results may go), after prompt 3 it has too little
to clear and goes on (the size anchor says so, with no count_tokens call). With
the auto memory off, the requests the API receives (path and body, the body's
JSON text with its key order, as the SDK wrote it) must be equal, in order, once
the stamps in STAMPS are normalised. Before the session file recorded the
context state, the second process re-sent every stored result in full and the
runs parted at its first request.

The in-process tests below pin each piece of that state on its own, and that a
session file from before these records resumes as it did.
"""
import json
import re
import shutil
import time

import pytest

from conftest import chapters_from, run_chapter
from fake_api import reply, tool

pytestmark = pytest.mark.parametrize("mod", chapters_from("s09"), indirect=True)

FILE_BYTES = 14 * 1024      # scenario L's file size
FILES = 37                  # files the session reads, f000.txt to f036.txt
CLEARED = "[old tool result cleared"
REATTACHED = "Re-read after compaction"
# What may differ between the two runs, and why; nothing else may. Session ids reach
# no request here (plan mode would name its plan file by one).
STAMPS = [
    # the system prompt's environment section: the day each process started
    (re.compile(r"Date: \d{4}-\d{2}-\d{2}"), "Date: <day>"),
    # the summary names the transcript the compaction saved, by the clock at that moment
    (re.compile(r"transcript-\d{8}-\d{6}-\d{9}\.jsonl"), "transcript-<time>.jsonl"),
]


def make_files(ws, n):
    for i in range(n):
        rows, size, k = [f"BEGIN-{i:03d}"], 0, 0
        while size < FILE_BYTES - 80:
            k += 1
            rows.append(f"f{i:03d} row {k:03d}: " + "lorem ipsum dolor sit amet " * 2)
            size += len(rows[-1]) + 1
        (ws / f"f{i:03d}.txt").write_text("\n".join(rows + [f"END-{i:03d}"]) + "\n")


def read(i):
    return reply(tool("read_file", {"path": f"f{i:03d}.txt"}, id=f"toolu_read{i:03d}"))


def edit(i):
    return reply(tool("edit_file", {"path": f"f{i:03d}.txt", "old_string": f"BEGIN-{i:03d}\n",
                                    "new_string": f"BEGIN-{i:03d} (edited)\n"}, id=f"toolu_edit{i:03d}"))


REPORT = "".join(f"- f{i:03d}.txt: rows of lorem ipsum, between its BEGIN and END lines\n" for i in range(900))
PLAN = [{"content": "Read the files", "status": "in_progress"},
        {"content": "Edit the first ones", "status": "pending"}, {"content": "Report", "status": "pending"}]
PROMPTS = ["prompt 1: plan, then read the first files", "prompt 2: edit f000, read on",
           "prompt 3: read on, compact, read on", "prompt 4: edit f026, read the rest"]
SCRIPT = [  # the replies of each prompt, ids pinned: both runs get the same script
    [reply(tool("todo_write", {"items": PLAN}, id="toolu_plan"))] + [read(i) for i in range(0, 13)]
    + [reply("Done 1. What each file holds:\n" + REPORT)],
    [edit(0)] + [read(i) for i in range(13, 21)] + [reply("Done 2.")],
    [read(i) for i in range(21, 25)] + [reply(tool("compact", {"focus": "the files read"}, id="toolu_compact")),
                                        reply("<summary>Read f000-f024; edited f000.</summary>")]
    + [read(i) for i in range(25, 29)] + [reply("Done 3. What each file holds:\n" + REPORT)],
    [edit(26)] + [read(i) for i in range(29, 37)] + [reply("Done 4.")],
]


def normalised(requests):
    """(path, body as JSON) per request, the stamps replaced."""
    out = []
    for r in requests:
        text = json.dumps(r["body"], ensure_ascii=False)
        for pattern, stand_in in STAMPS:
            text = pattern.sub(stand_in, text)
        out.append((r["path"].split("?")[0], text))
    return out


def run_session(mod, api, ws, split):
    """The scripted session in ws: one REPL process, or one process per prompt (-c after the
    first). Returns the requests the API received, in order."""
    api.reset()
    api.script([step for steps in SCRIPT for step in steps])
    env = {"HOME": str(ws.parent / "home")}
    if split:
        for k, prompt in enumerate(PROMPTS):
            r = run_chapter(mod.__name__, *(["--continue"] if k else []), prompt, api=api, cwd=ws, env=env)
            assert r.returncode == 0, r.stderr[-3000:]
    else:
        r = run_chapter(mod.__name__, api=api, cwd=ws, env=env, input="".join(p + "\n" for p in PROMPTS))
        assert r.returncode == 0, r.stderr[-3000:]
    assert api.remaining() == 0 and api.exhausted == 0, "the session did not follow the script"
    return api.requests


@pytest.mark.e2e("s09")
def test_a_session_split_over_four_processes_sends_what_one_process_sends(mod, api, workspace):
    home = workspace.parent / "home"
    (home / ".agent").mkdir(parents=True, exist_ok=True)  # a user config: no sandbox trial at start
    (home / ".agent" / "config.yaml").write_text("sandbox: {enabled: false}\n")
    make_files(workspace, FILES)
    whole = normalised(run_session(mod, api, workspace, split=False))
    shutil.move(workspace, workspace.with_name("one-process"))  # the same path for the second run
    workspace.mkdir()
    make_files(workspace, FILES)
    split = normalised(run_session(mod, api, workspace, split=True))
    bodies = [body for _, body in whole]
    assert any(CLEARED in b for b in bodies) and any(REATTACHED in b for b in bodies)  # it proves something
    assert sum('"tool_choice": {"type": "none"}' in b for b in bodies) == 1  # one summary call
    assert any("Current plan:" in b for b in bodies)  # the plan's reminder came
    assert not any("before changing it" in b or "changed on disk since" in b for b in bodies)  # the edits ran
    for n, (a, b) in enumerate(zip(whole, split)):
        assert a == b, f"request {n} differs:\n{first_difference(a, b)}"
    assert len(whole) == len(split)


def first_difference(a, b):
    """Where two (path, body) requests part, with some text around it."""
    (path, a), (other, b) = a, b
    at = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
    return (f"one process: {path} ...{a[max(0, at - 200):at + 300]}\n"
            f"split:       {other} ...{b[max(0, at - 200):at + 300]}")


# --- each piece in-process --------------------------------------------------------------

def recording(mod):
    """A session file for the running agent, as main() starts one."""
    state = mod.agent_state()
    state.record = mod.new_session(state)
    while state.record["path"].exists():
        state.record = mod.new_session(state)
    return state.record["path"]


def fresh_agent(mod, workspace):
    """A new agent on the same workspace (a new process, as far as the state goes)."""
    state = mod.AgentState(workspace)
    state.mode = "bypassPermissions"
    state.permissions["sandbox"]["enabled"] = False
    return mod.acting_as(state)


def small_files(ws, n, size=4_000):
    for i in range(n):
        (ws / f"f{i:03d}.txt").write_text("".join(f"f{i:03d} line {k:04d} lorem ipsum\n" for k in range(size // 28)))


def records_of(path, kind):
    return [r for r in map(json.loads, path.read_text().splitlines()) if r["type"] == kind]


def test_the_file_gives_back_the_marks_the_live_history_has(mod, api, client, workspace, monkeypatch):
    """Cleared, sent and size anchors after batch clears, and a compaction's tail, which
    keeps its sent marks but not its anchors."""
    monkeypatch.setattr(mod, "WORKING_BUDGET", 6_000)
    path = recording(mod)
    small_files(workspace, 8)
    api.script([read(i) for i in range(8)] + [reply("Done.")])
    history = [{"role": "user", "content": "read them"}]
    assert mod.agent_loop(client, history) == "end_turn"
    assert [b for b in mod.tool_results(history) if b.get("_cleared")]      # a batch cleared some
    assert mod.read_session(path)[0] == history                            # the marks came back as they are
    api.add(reply("<summary>Read f000-f007.</summary>"))
    mod.compact_now(client, history)
    assert mod.last_usage(history) is None and any(b.get("_sent") for b in mod.tool_results(history))
    assert mod.read_session(path)[0] == history


def test_a_resumed_agent_has_the_state_the_session_left(mod, workspace):
    state = mod.agent_state()
    path = recording(mod)
    (workspace / "a.txt").write_text("one\n")
    mod.read_file("a.txt")
    mod.todo_write(PLAN)
    state.plan["rounds_since_update"] = 2          # the reminder comes at the next round
    state.compaction["failures"] = 2               # one more failure opens the breaker
    state.denials = 2
    state.hooks["fired"].add(("hooks.yaml", "greet"))
    state.hook_notes = [{"type": "text", "text": "<system-reminder>\npost_tool_use hook: late\n</system-reminder>"}]
    state.memory["attached"].add(str(workspace / ".agent" / "memory" / "build.md"))
    if hasattr(state, "discovered"):               # s12: deferred tools found with tool_search
        state.discovered += ["mcp__docs__search", "mcp__docs__fetch"]
    history = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": [{"type": "text", "text": "hello"}]}]
    mod.sync_session(history)
    with fresh_agent(mod, workspace) as fresh:
        assert mod.resume(None, path) == history
        for key in ("plan", "compaction", "denials", "files") + ("discovered",) * hasattr(state, "discovered"):
            assert getattr(fresh, key) == getattr(state, key), key
        assert fresh.hooks["fired"] == state.hooks["fired"] and fresh.memory["attached"] == state.memory["attached"]
        assert fresh.hook_notes == state.hook_notes
        mod.edit_file("a.txt", "one", "two")      # read in the session, unchanged since: no new read
        assert (workspace / "a.txt").read_text() == "two\n"
    with fresh_agent(mod, workspace):
        mod.resume(None, path)                     # read as "one", and it changed since
        with pytest.raises(mod.ToolError, match="changed on disk since you read it"):
            mod.edit_file("a.txt", "two", "three")


def test_a_value_back_to_a_new_agents_after_a_boundary_is_recorded(mod, workspace):
    """The state holds across a boundary (a compaction writes the history again, not
    the state): a value that goes back to a new agent's afterwards is still recorded."""
    state = mod.agent_state()
    path = recording(mod)
    history = [{"role": "user", "content": "hi"}]
    state.denials = 2
    mod.sync_session(history)
    mod.session_boundary(history)
    state.denials = 0
    mod.sync_session(history)
    with fresh_agent(mod, workspace) as fresh:
        fresh.denials = 5
        mod.resume(None, path)
        assert fresh.denials == 0
    assert [r["state"] for r in records_of(path, "state")] == [{"denials": 2}, {"denials": 0}]


def test_a_session_file_without_these_records_resumes_as_before(mod, api, client, workspace, monkeypatch):
    path = recording(mod)
    small_files(workspace, 3)
    api.script([read(i) for i in range(3)] + [reply("Done.")])
    history = [{"role": "user", "content": "read them"}]
    assert mod.agent_loop(client, history) == "end_turn"
    mod.todo_write(PLAN)
    mod.sync_session(history)
    assert records_of(path, "context") and records_of(path, "state") and records_of(path, "files")
    lines = [line for line in path.read_text().splitlines()
             if json.loads(line)["type"] not in ("context", "state", "files")]
    old = path.with_name("20240101-000000-0ld0.jsonl")
    old.write_text("".join(line + "\n" for line in lines))
    monkeypatch.setattr(mod, "AUTO_COMPACT_AT", 100)  # both are "over the threshold"
    api.reset()
    with fresh_agent(mod, workspace) as fresh:
        resumed = mod.resume(None, old)
        assert '"_' not in json.dumps(resumed) and fresh.files == {} and fresh.plan["items"] == []
        api.add(reply("<summary>Read three files.</summary>"))
        assert "Read three files." in json.dumps(mod.resume(client, old))  # compacted at once, as before
    with fresh_agent(mod, workspace):
        assert mod.resume(client, path) == history  # it has anchors: the next request decides, as live
    assert api.remaining() == 0 and len(api.requests) == 1


def test_records_a_session_file_cannot_hold_are_left_alone(mod, workspace):
    path = workspace / ".agent" / "sessions" / "20240101-000000-junk.jsonl"
    path.parent.mkdir(parents=True)
    good = {"role": "user", "content": [{"type": "text", "text": "hi"}]}
    lines = [{"type": "message", "i": 0, "message": good},
             {"type": "context", "usage": [[0, {"tokens": "x"}], "y", [-1, {"tokens": 1, "at": 1, "estimate": 1}]],
              "cleared": [5, {}], "sent": "3"},
             {"type": "state", "state": {"plan": {"items": "x", "rounds_since_update": 1}, "denials": "2",
                                         "compaction": {"failures": "many", "extra": 1}, "once_hooks": "x",
                                         "memories": 7, "discovered": [["x"], 5],
                                         "hook_notes": [{"type": "image"}, "x", {"type": "text", "text": 1}]}},
             {"type": "state", "state": "not a dict"},
             {"type": "files", "files": {"a": "x", "b": [1], "c": ["1", 2]}}]
    path.write_text("".join(json.dumps(r | {"ts": time.time()}) + "\n" for r in lines))
    with fresh_agent(mod, workspace) as fresh:
        blank = mod.AgentState(workspace)
        assert mod.resume(None, path) == [good]
        for key in ("plan", "compaction", "denials", "files") + ("discovered",) * hasattr(blank, "discovered"):
            assert getattr(fresh, key) == getattr(blank, key), key
        assert fresh.hooks["fired"] == set() and fresh.memory["attached"] == set() and fresh.hook_notes == []


def test_a_call_id_that_is_not_text_is_an_unreadable_line(mod, workspace):
    """A planted file (a clone can ship .agent/sessions) whose call or result id is a list
    broke /resume's listing for every session, and --resume with a traceback: the ids are
    set members when the marks go back on and when the history is cut to its answered calls."""
    path = workspace / ".agent" / "sessions" / "20240101-000000-ids.jsonl"
    path.parent.mkdir(parents=True)
    good = {"role": "user", "content": [{"type": "text", "text": "hi"}]}
    lines = [{"type": "message", "i": 0, "message": good},
             {"type": "message", "i": 1, "message": {"role": "assistant", "content": [
                 {"type": "tool_use", "id": ["x"], "name": "bash", "input": {}}]}},
             {"type": "message", "i": 1, "message": {"role": "assistant", "content": [
                 {"type": "tool_use", "id": "toolu_1", "name": "bash", "input": {}}]}},
             {"type": "message", "i": 2, "message": {"role": "user", "content": [
                 {"type": "tool_result", "tool_use_id": {"x": 1}, "content": "y"}]}},
             {"type": "context", "cleared": ["toolu_1"]}]
    path.write_text("".join(json.dumps(r | {"ts": time.time()}) + "\n" for r in lines))
    assert mod.session_summary(path) == ("hi", 2)
    with fresh_agent(mod, workspace):
        assert mod.resume(None, path) == [good]   # the call never answered: dropped, as any unfinished turn
