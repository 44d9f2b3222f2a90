"""s10: background subagents, and per-agent state when agents run at once.

A background child runs in its own thread while its parent's loop goes on, so
the two agents' requests reach the scripted server in no fixed order. Two(...)
answers each request from the queue of the agent that sent it; steps that are
callables hold a reply until the other agent has reached a given point, which
makes the overlap real (both loops are in flight at once) without any sleep.
Every wait has a timeout: a hang guard, never a timing assertion.
"""
import contextvars
import json
import os
import threading
import time
from types import SimpleNamespace

import pytest

from conftest import chapters_from, message_bodies, strip_cache
from fake_api import error, reply, tool

pytestmark = pytest.mark.parametrize("mod", chapters_from("s10"), indirect=True)

WAIT = 10            # seconds: the longest any step waits for the other agent (a hang guard)
CANNOT_ASK = "a background agent cannot ask the user"


class Two:
    """Scripted replies for a parent and its background child, whose requests
    arrive in any order: a request from the child (a subagent's system prompt,
    or a fork's boilerplate) takes the child's next step, any other the
    parent's. Steps are as in fake_api: replies, or callables of the body."""

    def __init__(self, parent, child):
        self.queues = {"parent": list(parent), "child": list(child)}
        self.bodies = {"parent": [], "child": []}
        self.exhausted = []
        self.lock = threading.Lock()

    @staticmethod
    def sender(body):
        system = json.dumps(body.get("system"))
        fork = "<fork_boilerplate>" in json.dumps(body["messages"])  # the parent's never has it
        return "child" if "You are a subagent" in system or fork else "parent"

    def __call__(self, body):
        who = self.sender(body)
        with self.lock:
            self.bodies[who].append(body)
            step = self.queues[who].pop(0) if self.queues[who] else None
        if step is None:
            self.exhausted.append(who)
            return reply("(script exhausted)")
        return step(body) if callable(step) else step

    def install(self, api):
        api.script([self] * sum(map(len, self.queues.values())))
        return self

    def used_up(self):
        return not self.exhausted and not any(self.queues.values())


def wait(event):
    assert event.wait(WAIT), "the other agent never got there"


def results(body):
    """The tool_results of a request's newest message, in call order, by content."""
    return [b for b in body["messages"][-1]["content"] if b.get("type") == "tool_result"]


def notes(body):
    """The <task-notification> blocks of a request's newest message."""
    return [b["text"] for b in body["messages"][-1]["content"]
            if b.get("type") == "text" and b["text"].startswith("<task-notification>")]


def record_of(state, kind="agent"):
    (record,) = [r for r in state.background.values() if r["kind"] == kind]
    return record


def ended(record):
    record["_thread"].join(WAIT)
    assert not record["_thread"].is_alive(), "the background agent never ended"
    return record


def started(out):
    assert out.startswith("Started agent a"), out
    return out.split()[2]


def agent(prompt, **extra):
    return tool("agent", {"prompt": prompt, **extra})


@pytest.fixture
def agents(mod):
    """The chapter, and after the test no background agent or command still running."""
    yield mod
    for record in list(mod.agent_state().background.values()):
        mod.stop_background(record)


def as_parent(mod, client, history=None):
    """The agent tool outside a loop: the state a running loop would have."""
    state = mod.agent_state()
    state.client, state.messages = client, history if history is not None else []
    return state


def spy_states(mod, monkeypatch, tool_name):
    """Which AgentState ran each call of a tool, by label ("" for the parent)."""
    seen, real = {}, mod.TOOL_HANDLERS[tool_name]

    def spy(**args):
        seen[mod.agent_state().label] = mod.agent_state()
        return real(**args)
    monkeypatch.setitem(mod.TOOL_HANDLERS, tool_name, spy)
    return seen


# --- isolation ---------------------------------------------------------------------------

def test_a_parent_and_a_background_child_work_at_once_each_on_its_own_state(
        agents, api, client, workspace, monkeypatch):
    """The issue's must-show. Both loops are in flight together (each waits for the
    other at its marked points); each reads, plans and edits its own files."""
    mod = agents
    for name in ("p.txt", "c.txt", "shared.txt"):
        (workspace / name).write_text(f"{name} one\n")
    plans = spy_states(mod, monkeypatch, "todo_write")
    went_on, parent_read, child_edited, parent_checked = (threading.Event() for _ in range(4))
    parent, seen = mod.agent_state(), {}
    mine, theirs = {"input_tokens": 1000, "output_tokens": 100}, {"input_tokens": 7, "output_tokens": 1}

    def p2(body):  # the parent's next call: the child runs, its first call not answered yet
        seen["p2"] = record_of(parent)["status"], len(script.bodies["child"]), record_of(parent)["_usage"]["calls"]
        went_on.set()
        return reply(tool("read_file", {"path": "p.txt"}), tool("read_file", {"path": "shared.txt"}),
                     tool("todo_write", {"items": [{"content": "parent step", "status": "in_progress"}]}),
                     usage=mine)

    def p3(body):  # the parent has read; it waits for the child's edits before its own
        parent_read.set()
        wait(child_edited)
        return reply(tool("edit_file", {"path": "p.txt", "old_string": "one", "new_string": "by parent"}),
                     tool("edit_file", {"path": "c.txt", "old_string": "one", "new_string": "by parent"}),
                     tool("edit_file", {"path": "shared.txt", "old_string": "one", "new_string": "by parent"}),
                     usage=mine)

    def p4(body):  # the parent's edits were judged by its own records; then the child may end
        seen["p4"] = [r["content"] for r in results(body)], notes(body)
        parent_checked.set()
        ended(record_of(parent))
        return reply(tool("read_file", {"path": "shared.txt"}), usage=mine)

    def p5(body):  # the first request after the child ended
        seen["p5"] = body["messages"][-1]["content"]
        return reply(tool("edit_file", {"path": "shared.txt", "old_string": "two", "new_string": "by parent"}),
                     usage=mine)

    def p6(body):
        seen["p6"] = [r["content"] for r in results(body)]
        return reply("Finished.", usage=mine)

    def c1(body):
        wait(went_on)
        seen["c1"] = body
        return reply(tool("read_file", {"path": "c.txt"}), tool("read_file", {"path": "shared.txt"}),
                     tool("todo_write", {"items": [{"content": "child step", "status": "in_progress"}]}),
                     usage=theirs)

    def c2(body):  # the child edits once the parent has read shared.txt
        wait(parent_read)
        return reply(tool("edit_file", {"path": "c.txt", "old_string": "one", "new_string": "by child"}),
                     tool("edit_file", {"path": "shared.txt", "old_string": "one", "new_string": "two"}),
                     tool("edit_file", {"path": "p.txt", "old_string": "one", "new_string": "by child"}),
                     usage=theirs)

    def c3(body):
        seen["c3"] = [r["content"] for r in results(body)]
        child_edited.set()
        wait(parent_checked)
        return reply("Scope: edited c.txt and shared.txt.", usage=theirs)

    script = Two([reply(agent("Edit c.txt and shared.txt.", description="child work", run_in_background=True),
                        usage=mine), p2, p3, p4, p5, p6], [c1, c2, c3]).install(api)
    history = [{"role": "user", "content": "work beside a helper"}]
    assert mod.agent_loop(client, history) == "end_turn"
    assert script.used_up()

    # overlap: the parent's second call came while the child ran, before its first reply
    assert seen["p2"][0] == "running" and seen["p2"][1] <= 1 and seen["p2"][2] == 0
    # the child's own requests: only its task, no agent tool, no background tools
    assert strip_cache(seen["c1"]["messages"]) == [{"role": "user", "content": [{"type": "text", "text": "Edit c.txt and shared.txt."}]}]
    assert not {"agent", "background_run", "background_stop"} & {t["name"] for t in seen["c1"]["tools"]}
    # file-read records: the child edited what it read, not the parent's file
    assert seen["c3"][0].startswith("Edited c.txt") and seen["c3"][1].startswith("Edited shared.txt")
    assert seen["c3"][2] == "Read p.txt with read_file before changing it."
    # ...and the parent's rule still holds: not the child's file; re-read what the child changed
    p4_results, p4_notes = seen["p4"]
    assert p4_results[0].startswith("Edited p.txt") and not p4_notes
    assert p4_results[1] == "Read c.txt with read_file before changing it."
    assert p4_results[2] == "shared.txt changed on disk since you read it; read it again first."
    assert seen["p6"][0].startswith("Edited shared.txt")
    assert (workspace / "p.txt").read_text() == "p.txt by parent\n"
    assert (workspace / "c.txt").read_text() == "c.txt by child\n"
    assert (workspace / "shared.txt").read_text() == "shared.txt by parent\n"
    child = plans["child work"]
    assert child is not parent and plans[""] is parent
    assert set(parent.files) == {str(workspace / "p.txt"), str(workspace / "shared.txt")}
    assert set(child.files) == {str(workspace / "c.txt"), str(workspace / "shared.txt")}
    # plans: each its own
    assert [i["content"] for i in parent.plan["items"]] == ["parent step"]
    assert [i["content"] for i in child.plan["items"]] == ["child step"]
    # usage: the child's report counts its own three calls only
    (note,) = [b["text"] for b in seen["p5"] if b.get("type") == "text" and "task-notification" in b["text"]]
    assert "[subagent child work: 3 model calls, 21 input + 3 output tokens]" in note
    assert "Scope: edited c.txt and shared.txt." in note and "<status>completed</status>" in note
    assert [b["type"] for b in seen["p5"]][0] == "tool_result"        # results first, then the news
    child_dump = json.dumps(script.bodies["child"])
    assert "work beside a helper" not in child_dump and "parent step" not in child_dump
    assert "child step" not in json.dumps(script.bodies["parent"])


def test_agents_charging_at_once_lose_nothing_from_the_session_bill(mod):
    """charge() from many agents' threads at once adds every call. The total is read
    slowly here, so that without USAGE_LOCK the threads interleave inside `+=` (on
    CPython's GIL a plain dict's += happens not to switch threads, so nothing would
    show a missing lock)."""
    class SlowTotal(dict):
        def __getitem__(self, key):
            value = super().__getitem__(key)
            time.sleep(0.0002)  # another thread runs between reading the total and writing it back
            return value

    state = mod.agent_state()
    state.session = SlowTotal(cost=0.0)
    call = SimpleNamespace(usage=SimpleNamespace(input_tokens=1_000_000, output_tokens=0,
                                                 cache_read_input_tokens=0, cache_creation_input_tokens=0))
    threads_n, calls_n = 8, 25
    barrier = threading.Barrier(threads_n, timeout=WAIT)

    def one_agent(n):
        with mod.acting_as(mod.child_state(False, f"agent {n}")):  # its own state, the session's bill
            barrier.wait()
            for _ in range(calls_n):
                mod.charge(call)
    threads = [threading.Thread(target=contextvars.copy_context().run, args=(one_agent, n))
               for n in range(threads_n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(WAIT)
    assert state.session["cost"] == threads_n * calls_n * mod.PRICE_INPUT   # each call: 1M input tokens


# --- the agent tool in the background ---------------------------------------------------

def test_run_in_background_returns_at_once_and_the_report_comes_as_a_notification(
        agents, api, client, workspace, capsys):
    mod = agents
    parent, release, seen = mod.agent_state(), threading.Event(), {}

    def p2(body):  # the agent call's result is back, the child still waits for its first reply
        seen["started"] = results(body)[0]["content"]
        seen["running"] = record_of(parent)["status"]
        return reply(tool("bash", {"command": "echo parent works"}))

    def p3(body):  # sent while the child runs: no news yet; the child may finish now
        seen["p3"] = notes(body)
        release.set()
        ended(record_of(parent))
        return reply(tool("bash", {"command": "echo still working"}))

    def p4(body):
        seen["p4"] = body["messages"][-1]["content"]
        return reply("Finished.")

    def c1(body):
        wait(release)
        return reply("CHILD TEXT, streamed to its log. Scope: the answer is 42.")

    Two([reply(agent("Find the answer.", description="answer", run_in_background=True)), p2, p3, p4],
        [c1]).install(api)
    history = [{"role": "user", "content": "start a helper"}]
    assert mod.agent_loop(client, history) == "end_turn"
    id = started(seen["started"])
    assert seen["running"] == "running" and seen["p3"] == []
    kinds = [b["type"] for b in seen["p4"]]
    assert kinds == ["tool_result", "text"]                           # the news after the results
    note = seen["p4"][1]["text"]
    assert note.startswith("<task-notification>") and f"<task-id>{id}</task-id>" in note
    assert "<status>completed</status>" in note and "<exit-code>" not in note
    assert "Scope: the answer is 42." in note and "[subagent answer: 1 model calls" in note
    assert f"<output-file>.agent/runtime-tasks/{id}.log</output-file>" in note
    assert "<command>agent general-purpose: answer</command>" in note
    log = (workspace / ".agent" / "runtime-tasks" / f"{id}.log").read_text()
    assert "CHILD TEXT" in log and "[completed] [subagent answer: 1 model calls" in log
    status = json.loads((workspace / ".agent" / "runtime-tasks" / f"{id}.json").read_text())
    assert status["status"] == "completed" and status["kind"] == "agent"
    out, err = capsys.readouterr()
    assert "CHILD TEXT" not in out and "CHILD TEXT" not in err        # its text: only in its log
    assert "[answer] [context" not in err and "[answer] [context" in log  # its progress lines too
    assert f"[background agent {id} started: general-purpose: answer]" in err
    assert mod.drain_notifications() == []                             # reported once


def test_a_fork_runs_in_the_background_with_the_parents_history(agents, api, client, workspace):
    mod = agents
    (workspace / "a.txt").write_text("alpha\n")
    parent, child_may_go, seen = mod.agent_state(), threading.Event(), {}
    fork_call = agent("Check a.txt and fix the typo.", fork=True, run_in_background=True)

    def p3(body):  # sent before the fork has done anything; it ends before this reply
        seen["p3"] = notes(body), results(body)[0]["content"]
        child_may_go.set()
        ended(record_of(parent))
        return reply(tool("edit_file", {"path": "a.txt", "old_string": "alpha", "new_string": "beta"}))

    def p4(body):
        seen["p4"] = notes(body), [r["content"] for r in results(body)]
        return reply("Finished.")

    def c1(body):
        wait(child_may_go)
        seen["c1"] = body
        return reply(tool("edit_file", {"path": "a.txt", "old_string": "alpha", "new_string": "alpha!"}))

    script = Two([reply(tool("read_file", {"path": "a.txt"})), reply(fork_call), p3, p4],
                 [c1, reply("Scope: fixed a.txt.")]).install(api)
    history = [{"role": "user", "content": "PARENT PROMPT"}]
    assert mod.agent_loop(client, history) == "end_turn"
    assert script.used_up()
    fork = seen["c1"]
    assert fork["messages"][0]["content"][0]["text"] == "PARENT PROMPT"   # it inherits the history
    (placeholder,) = [b for b in fork["messages"][-1]["content"] if b.get("tool_use_id") == fork_call["id"]]
    assert placeholder["content"] == mod.FORK_PLACEHOLDER
    assert "<fork_boilerplate>" in fork["messages"][-1]["content"][-1]["text"]
    assert json.dumps(fork["system"]) == json.dumps(message_bodies(api)[0]["system"])
    assert not {"agent", "background_run", "background_stop"} & {t["name"] for t in fork["tools"]}
    no_news, started_text = seen["p3"]
    assert no_news == [] and started_text.startswith("Started agent a")
    (note,), (edit,) = seen["p4"]
    assert "<status>completed</status>" in note and "Scope: fixed a.txt." in note
    assert edit == "a.txt changed on disk since you read it; read it again first."  # the fork's change
    assert (workspace / "a.txt").read_text() == "alpha!\n"


@pytest.mark.permissions
def test_a_background_child_is_denied_where_a_foreground_child_would_ask(agents, api, client, workspace,
                                                                           monkeypatch, tmp_path):
    mod = agents
    state = as_parent(mod, client)
    state.permissions["sandbox"]["enabled"] = False
    state.permissions["rules"] = [mod.parse_rule("read_file(secret.txt)") | {"effect": "ask", "file": "x"}]
    (workspace / "secret.txt").write_text("s\n")
    (tmp_path / "outside.txt").write_text("o\n")
    asked = []
    monkeypatch.setattr(mod, "ask_human", lambda q: asked.append(q) or "y")
    calls = [tool("bash", {"command": "echo hi"}),                              # the mode's question
             tool("read_file", {"path": str(tmp_path / "outside.txt")}),        # outside the workspace
             tool("read_file", {"path": "secret.txt"})]                         # an ask rule
    seen = {}
    api.script([reply(*calls), lambda body: seen.update(denied=results(body)) or reply("Scope: blocked.")])
    record = ended(state.background[started(mod.run_subagent("try", "bg", run_in_background=True))])
    assert asked == [] and record["status"] == "completed"
    layers = ["(mode)", "(path sandbox)", "(rule)"]
    for result, layer in zip(seen["denied"], layers):
        assert result["is_error"] and result["content"].startswith(f"Permission denied {layer}")
        assert CANNOT_ASK in result["content"] and "say in your report what needs approval" in result["content"]
        assert "or ask the user" not in result["content"]
    # the same calls in a foreground child still ask the human, and run
    api.script([reply(*calls), lambda body: seen.update(allowed=results(body)) or reply("done")])
    mod.run_subagent("try", "fg")
    assert len(asked) == 3 and all(q.startswith("[fg] Allow ") for q in asked)
    assert [r.get("is_error") for r in seen["allowed"]] == [None, None, None]


def test_a_background_agent_never_reads_the_terminal(mod, monkeypatch):
    """ask_human itself refuses (exit_plan_mode, a project skill's commands), stdin untouched."""
    monkeypatch.setattr("builtins.input", lambda *a: pytest.fail("a background agent read stdin"))
    child = mod.child_state(False, "bg")
    child.cancel = threading.Event()
    with mod.acting_as(child), pytest.raises(mod.ToolError, match=CANNOT_ASK):
        mod.ask_human("Approve the plan? ")
    child.mode = "plan"
    with mod.acting_as(child), pytest.raises(mod.ToolError, match=CANNOT_ASK):
        mod.exit_plan_mode("the plan")


# --- check, stop, the session's end ---------------------------------------------------

SLEEPER = "echo $$ > sleeper.pid; exec sleep 30"   # $$: its process group (the agent reaps it)


def start_sleeper(mod, client, workspace, api, description="sleeper"):
    """A background child whose first call is a long bash command; returns its record once it runs."""
    state = as_parent(mod, client)
    api.script([reply(tool("bash", {"command": SLEEPER})), reply("never asked for")])
    id = started(mod.run_subagent("sleep a while", description, run_in_background=True))
    deadline = time.monotonic() + WAIT
    while not (workspace / "sleeper.pid").exists() or not (workspace / "sleeper.pid").read_text().strip():
        assert time.monotonic() < deadline, "the child's command never started"
        time.sleep(0.01)
    return state.background[id], int((workspace / "sleeper.pid").read_text())


def gone(pgid):
    deadline = time.monotonic() + WAIT
    while time.monotonic() < deadline:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.02)
    return False


def test_background_check_lists_a_running_child_and_background_stop_cancels_it(
        agents, api, client, workspace, monkeypatch):
    mod = agents
    record, pgid = start_sleeper(mod, client, workspace, api)
    id = record["id"]
    assert mod.background_check() == f"{id} [running] agent general-purpose: sleeper"
    shown = mod.background_check(id)
    assert shown.startswith(f"{id} [running] agent general-purpose: sleeper (1 model calls so far")
    monkeypatch.setattr(mod, "MAX_BACKGROUND_AGENTS", 1)
    with pytest.raises(mod.ToolError, match="the most at once"):
        mod.run_subagent("another", run_in_background=True)
    out = mod.background_stop(id)
    assert out.startswith(f"Cancelled agent {id}: it has stopped")
    assert record["status"] == "stopped" and not record["_thread"].is_alive()
    assert len(message_bodies(api)) == 1 and api.remaining() == 1      # no model call after the stop
    assert gone(pgid)                                                   # its command was killed
    assert mod.drain_notifications() == []                              # the model asked: no news
    assert "is not running: stopped" in mod.background_stop(id)
    assert mod.background_check() == f"{id} [stopped] agent general-purpose: sleeper"


def test_the_session_end_cancels_running_children_with_one_line(agents, api, client, workspace, capsys):
    mod = agents
    with mod.background_session():
        record, pgid = start_sleeper(mod, client, workspace, api)
    lines = [x for x in capsys.readouterr().err.splitlines() if "cancelling" in x]
    assert lines == [f"[cancelling 1 background agent(s): {record['id']} [running] agent general-purpose: sleeper]"]
    assert record["status"] == "stopped" and len(message_bodies(api)) == 1
    assert gone(pgid)


@pytest.mark.memory
def test_a_background_child_leaves_the_session_file_and_memory_alone(agents, api, client, workspace):
    """It writes no session record (its compaction neither), attaches no project
    context and starts no memory extraction: those are the main agent's."""
    mod = agents
    (workspace / "AGENTS.md").write_text("PROJECT RULES\n")
    state = as_parent(mod, client, [{"role": "user", "content": "the parent's prompt"}])
    state.record = mod.new_session(state)
    mod.sync_session(state.messages)
    api.script([reply(tool("compact", {})), reply("<summary>CHILD SUMMARY</summary>"), reply("CHILD-ONLY report")])
    ended(state.background[started(mod.run_subagent("report", "quiet", run_in_background=True))])
    bodies = message_bodies(api)
    assert len(bodies) == 3 and "CHILD SUMMARY" in json.dumps(bodies[2]["messages"][0])  # it compacted
    assert "PROJECT RULES" not in json.dumps(bodies)
    saved = [json.loads(line) for line in state.record["path"].read_text().splitlines()]
    assert [r["type"] for r in saved] == ["mode", "message"]              # the parent's prompt only
    assert state.messages == [{"role": "user", "content": "the parent's prompt"}]
    assert not state.compaction["requested"] and state.memory["jobs"] == []
    assert not (workspace / ".agent" / "memory.log").exists()


def test_a_definition_without_bash_gets_no_background_run_either(mod):
    names = {t["name"] for t in mod.child_tools({"name": "x", "disallowed_tools": ["bash"]})}
    assert "bash" not in names and "background_run" not in names      # the same shell, by another name
    assert "background_run" in {t["name"] for t in mod.child_tools({"name": "y"})}


def test_denials_in_a_row_tell_a_background_agent_to_report_not_to_ask(mod):
    state = mod.agent_state()
    state.denials = mod.MAX_DENIALS
    assert "Ask the user" in mod.denial_reminder()[0]["text"]            # a foreground agent may ask
    state.cancel = threading.Event()                                     # as a background agent runs
    text = mod.denial_reminder()[0]["text"]
    assert "cannot ask the user" in text and "Ask the user" not in text


def test_a_stop_is_a_stop_during_retries_and_during_the_final_reply(agents, api, client, monkeypatch):
    """background_stop promises no further model call and no notification: not while
    the child backs off after an overloaded error (the stop lands in the back-off, once
    the child has said it will retry, so the check must come after it too), nor while
    its last reply streams (~2.5 s; the stop goes out ~10 ms after the request)."""
    mod = agents
    monkeypatch.setattr(mod, "RETRY_BASE_DELAY", 2)   # a back-off of 1.5-2 s: the stop surely lands in it
    monkeypatch.setattr(mod, "RETRY_MAX_DELAY", 2)
    as_parent(mod, client)

    def backing_off(record):                    # its line just before the back-off's sleep
        return "retry 1/" in (record["_folder"] / f"{record['id']}.log").read_text()

    for first, ready in (([error(529, "Overloaded")] * 4 + [reply("done")], backing_off),
                         ([reply("all done", delay=0.5)], lambda record: True)):
        api.script(first)
        before = len(message_bodies(api))
        id = started(mod.run_subagent("work", "stoppable", run_in_background=True))
        record = mod.agent_state().background[id]
        deadline = time.monotonic() + WAIT
        while len(message_bodies(api)) == before or not ready(record):  # its first call is out
            assert time.monotonic() < deadline, "the child never called the model"
            time.sleep(0.01)
        mod.background_stop(id)
        record["_thread"].join(timeout=WAIT)
        assert record["status"] == "stopped", record["status"]
        assert len(message_bodies(api)) == before + 1                  # no retry went out
        assert mod.drain_notifications() == []                          # and no news follows
        api.script([])


def test_a_childs_background_check_leaves_the_parents_news(agents, client):
    """Only the main agent seeing an ended command counts as its news: a child's
    check would swallow the notification the parent's model waits for."""
    mod = agents
    parent = as_parent(mod, client)
    id = mod.background_run("echo RESULT").split()[1]
    parent.background[id]["_thread"].join(timeout=WAIT)                 # its end is recorded
    with mod.acting_as(mod.child_state(False, "peek")):
        assert "RESULT" in mod.background_check(id)
    assert [r["id"] for r in mod.drain_notifications()] == [id]


def test_a_linked_dot_agent_gets_no_folder_made_through_it(mod, workspace, tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    (workspace / ".agent").symlink_to(outside)
    with pytest.raises(mod.ToolError, match="symbolic link"):
        mod.background_run("echo hi")
    assert list(outside.iterdir()) == []
