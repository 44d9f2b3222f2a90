"""s11: the team at work: /team, a teammate's identity after a compaction, its agent
type applied, and its work, idle and claim loop.

Each member runs in-process as its own AgentState (as each teammate is in its own
process); a teammate's loop is driven in-process with the scripted model, with
IDLE_TIMEOUT and IDLE_POLL made small.
"""
import json
import os
import re
import types

import pytest

from test_s11_teams import make_crew, member  # noqa: F401
from conftest import chapters_from, message_bodies
from fake_api import reply, tool

pytestmark = pytest.mark.parametrize("mod", chapters_from("s11"), indirect=True)

SUMMARY = "<analysis>DRAFT</analysis>\n<summary>1. Primary request: SUMMARY-TEXT</summary>"


@pytest.fixture
def crew(mod, workspace):
    return make_crew(mod, bob_plans=False)


def inbox(workspace, name):
    path = workspace / ".agent" / "team" / "crew" / "inbox" / f"{name}.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def call(mod, name, args):
    """One tool call through run_tool, as the loop makes it."""
    return mod.run_tool(types.SimpleNamespace(id="toolu_1", name=name, input=args))


def team_rows(out):
    """/team's member rows by name, each split into its columns."""
    return {cols[0]: cols for cols in (re.split(r"\s{2,}", line.strip()) for line in out[2:])}


# --- /team --------------------------------------------------------------------------------

def test_team_shows_each_member_with_its_unread_inbox_and_open_tasks(crew, workspace, capsys, monkeypatch):
    mod = crew
    with mod.acting_as(member(mod, workspace, "alice")):
        mod.send_message("lead", "parser done")
        mod.send_message("lead", "tests next")
    mod.send_message("bob", "please review the parser")
    mod.set_member("alice", status="idle", pid=4242)
    for subject in ("parser", "tests", "docs", "old"):
        mod.task_create(subject)
    mod.claim_task("1", "alice")
    mod.task_update("2", owner="alice")                             # assigned, not started: open too
    mod.claim_task("4", "alice")
    mod.task_update("4", status="completed")                        # done: not shown
    locked, real_lock = [], mod.inbox_lock
    monkeypatch.setattr(mod, "inbox_lock", lambda box: locked.append(box.name) or real_lock(box))
    before = {n: inbox(workspace, n) for n in ("lead", "alice", "bob")}
    capsys.readouterr()
    ctx = {}
    assert mod.handle_slash("/team", ctx) is None and "error" not in ctx
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "team crew: 2 teammate(s)"
    assert re.split(r"\s{2,}", out[1].strip()) == ["name", "role", "status", "backend", "pid", "inbox",
                                                   "open tasks"]
    rows = team_rows(out)
    lead_bytes = (workspace / ".agent/team/crew/inbox/lead.jsonl").stat().st_size
    assert rows["lead"] == ["lead", "team lead", "working", "terminal", str(os.getpid()),
                            f"2 msg, {lead_bytes} B", "-"]
    assert rows["alice"] == ["alice", "writes the code", "idle", "detached", "4242", "0 msg, 0 B", "#1, #2"]
    assert rows["bob"][:5] == ["bob", "writes the tests", "working", "detached", "-"]
    assert rows["bob"][5].startswith("1 msg, ") and rows["bob"][6] == "-"
    assert {"lead.jsonl", "alice.jsonl", "bob.jsonl"} <= set(locked)    # counted under each inbox's lock
    assert {n: inbox(workspace, n) for n in before} == before         # and nothing was taken
    assert [r["content"] for r in mod.take_inbox(mod.inbox_path("lead"))] == ["parser done", "tests next"]


def test_team_without_a_team_says_so_in_one_line(mod, capsys):
    ctx = {}
    assert mod.handle_slash("/team", ctx) is None and "error" not in ctx
    out, err = capsys.readouterr()
    assert out.splitlines() == ["No team yet: spawn_teammate makes one with its first teammate."]
    assert err == ""


def test_team_with_a_roster_that_cannot_be_read_says_so_in_one_line(crew, workspace, capsys):
    mod = crew
    (workspace / ".agent" / "team" / "crew" / "config.json").write_text('{"members": "not a list"')
    capsys.readouterr()
    assert mod.run_slash_once(None, "/team") == 1
    out, err = capsys.readouterr()
    assert out == "" and len(err.splitlines()) == 1
    assert "cannot be read" in err and "Traceback" not in err and "failed" not in err


def test_team_shows_a_roles_control_characters_as_escapes(crew, capsys):
    """A role comes from the model: a cursor movement in it must not rewrite the terminal."""
    mod = crew
    mod.add_member("carol", "reviews\x1b[2J\x1b[Hok")
    capsys.readouterr()
    mod.handle_slash("/team", {})
    out = capsys.readouterr().out
    assert "\x1b" not in out and team_rows(out.splitlines())["carol"][1] == "reviews\\x1b[2J\\x1b[Hok"


def test_team_never_opens_an_inbox_that_is_not_a_plain_file(crew, workspace, capsys):
    """A FIFO would hang a plain open(); /team shows the inbox as unusable and goes on."""
    mod = crew
    os.mkfifo(workspace / ".agent" / "team" / "crew" / "inbox" / "bob.jsonl")
    capsys.readouterr()
    mod.handle_slash("/team", {})
    rows = team_rows(capsys.readouterr().out.splitlines())
    assert rows["bob"][5] == "unusable" and rows["alice"][5] == "0 msg, 0 B"


# --- identity after a compaction ----------------------------------------------------------

def first_message(body):
    return json.dumps(body["messages"][0], ensure_ascii=False)


def test_a_teammate_compacted_is_told_again_who_it_is(crew, api, client, workspace, monkeypatch):
    """Its first prompt carried teammate_intro; the compaction summarises that prompt
    away, and the new first message says it again: name, role, team, lead."""
    mod = crew
    monkeypatch.setattr(mod, "IDLE_TIMEOUT", 0)                     # one turn, then it stops
    alice = member(mod, workspace, "alice")
    mod.send_message("alice", "write parser.py")
    api.script([reply(tool("compact", {})), reply(SUMMARY), reply("done")])
    with mod.acting_as(alice):
        intro = mod.teammate_intro(mod.find_member(mod.read_roster(alice.team["dir"]), "alice"), alice.team)
        assert mod.teammate_loop(client, []) == 0
    assert "You are alice, a teammate in team crew; your role: writes the code. The lead is 'lead'" in intro
    first, _, after = message_bodies(api)
    assert intro in first_message(first)
    assert "SUMMARY-TEXT" in first_message(after) and intro in first_message(after)
    assert json.dumps(after["messages"]).count(intro) == 1          # once: the old prompt is summarised


@pytest.mark.parametrize("who", ["no team", "the lead"])
def test_an_agent_that_is_no_teammate_gets_no_identity_after_a_compaction(mod, api, client, workspace, who):
    if who == "the lead":
        mod.create_team("crew")
        mod.add_member("alice", "writes the code")
    api.script([reply(tool("compact", {})), reply(SUMMARY), reply("done")])
    assert mod.agent_loop(client, [{"role": "user", "content": "do the work"}]) == "end_turn"
    after = message_bodies(api)[-1]
    assert "SUMMARY-TEXT" in first_message(after) and "a teammate in team" not in json.dumps(after)
    assert mod.team_identity() == []


def test_a_teammates_subagent_gets_no_identity(crew, workspace):
    mod = crew
    with mod.acting_as(member(mod, workspace, "alice")):
        assert "You are alice" in mod.team_identity()[0]["text"]
        with mod.acting_as(mod.child_state(False, "look around")):
            assert mod.team_identity() == []
        with mod.acting_as(mod.child_state(True, "a fork")):
            assert mod.team_identity() == []


# --- agent_type and model -----------------------------------------------------------------

REVIEWER = """---
name: reviewer
description: Reviews code and reports problems.
tools: [read_file, grep]
disallowed_tools: [send_message, task_update, bash]
model: claude-reviewer-1
---
You review code. REVIEWER-RULES.
"""
BUILDER = """---
name: builder
description: Builds things.
disallowed_tools: [bash, agent, task_list]
---
"""


def define(workspace, name, text):
    folder = workspace / ".agent" / "agents"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{name}.md").write_text(text)


def never_started(mod, monkeypatch):
    def start(*args):
        raise AssertionError("a teammate process was started")
    monkeypatch.setattr(mod, "start_detached", start)
    monkeypatch.setattr(mod, "start_in_tmux", start)


def test_spawn_refuses_an_unknown_agent_type_before_anything_is_made(mod, workspace, monkeypatch):
    define(workspace, "reviewer", REVIEWER)
    never_started(mod, monkeypatch)
    with pytest.raises(mod.ToolError) as e:
        mod.spawn_teammate("alice", "writes the code", "write parser.py", agent_type="revewer")
    assert "Unknown agent_type 'revewer'" in str(e.value) and "explore, reviewer" in str(e.value)
    assert mod.agent_state().team == {} and not (workspace / ".agent" / "team").exists()  # no team made
    mod.create_team("crew")
    roster = (workspace / ".agent" / "team" / "crew" / "config.json").read_text()
    out = call(mod, "spawn_teammate", {"name": "alice", "role": "r", "prompt": "p", "agent_type": "nope"})
    assert out["is_error"] and "Use one of: explore, reviewer" in out["content"]
    assert (workspace / ".agent" / "team" / "crew" / "config.json").read_text() == roster   # nobody added
    assert inbox(workspace, "alice") == []                                                 # no prompt sent


def test_spawn_records_the_agent_type_and_its_model(mod, workspace, monkeypatch):
    define(workspace, "reviewer", REVIEWER)

    def fails(*args):
        raise OSError("no processes in this test")
    monkeypatch.setattr(mod, "start_detached", fails)
    monkeypatch.setattr(mod, "in_tmux", lambda: False)
    for name, kind in (("alice", "general-purpose"), ("bob", "explore"), ("carol", "reviewer")):
        with pytest.raises(mod.ToolError, match="could not be started"):   # got past the type check
            mod.spawn_teammate(name, "a role", "a prompt", agent_type=kind)
    members = {m["name"]: m for m in mod.read_roster(mod.my_team()["dir"])["members"]}
    assert [(members[n]["agent_type"], members[n]["model"]) for n in ("alice", "bob", "carol")] == [
        ("general-purpose", mod.model_id()), ("explore", mod.model_id()), ("reviewer", "claude-reviewer-1")]


def run_teammate(mod, api, client, workspace, name, monkeypatch, steps=(reply("Looked at it."),)):
    """One wake-up of `name`'s loop (its first prompt from the lead), then it idles out."""
    monkeypatch.setattr(mod, "IDLE_TIMEOUT", 0)
    state = member(mod, workspace, name)
    mod.send_message(name, "look at parser.py")
    api.script(list(steps))
    with mod.acting_as(state):
        code = mod.teammate_loop(client, [])
    return code, message_bodies(api)


def tool_names(body):
    return sorted(t["name"] for t in body["tools"])


def test_a_teammate_runs_with_its_definitions_tools_prompt_and_model(crew, api, client, workspace, monkeypatch):
    mod = crew
    define(workspace, "reviewer", REVIEWER)
    mod.add_member("carol", "reviews", agent_type="reviewer")             # roster model: the lead's
    code, bodies = run_teammate(mod, api, client, workspace, "carol", monkeypatch)
    assert code == 0 and len(bodies) == 1
    body = bodies[0]
    assert tool_names(body) == sorted(["read_file", "grep"] + list(mod.TEAMMATE_KEEPS))  # kept whatever it said
    system = json.dumps(body["system"])
    assert "REVIEWER-RULES" in system and "Your agent type, reviewer" in system
    assert mod.SYSTEM in system                                           # added to its own prompt
    assert body["model"] == "claude-reviewer-1"                           # the definition's model


def test_a_teammate_without_a_model_in_its_definition_uses_the_rosters(crew, api, client, workspace, monkeypatch):
    mod = crew
    define(workspace, "builder", BUILDER)
    mod.add_member("dave", "builds", agent_type="builder", model="claude-roster-2")
    code, bodies = run_teammate(mod, api, client, workspace, "dave", monkeypatch)
    names = tool_names(bodies[0])
    assert code == 0 and bodies[0]["model"] == "claude-roster-2"
    assert {"bash", "background_run", "agent", "spawn_teammate"}.isdisjoint(names)
    assert {"task_list", "send_message", "write_file", "edit_file", "read_file"} <= set(names)
    assert "Your agent type" not in json.dumps(bodies[0]["system"])    # a definition without a body adds none


def test_a_general_purpose_teammate_has_every_tool_but_spawn_teammate(crew, api, client, workspace, monkeypatch):
    mod = crew
    code, bodies = run_teammate(mod, api, client, workspace, "alice", monkeypatch)
    assert code == 0 and bodies[0]["model"] == mod.model_id()
    assert tool_names(bodies[0]) == sorted(t["name"] for t in mod.TOOLS  # s12's tool_search: sent only
                                           if t["name"] not in ("spawn_teammate", "tool_search"))  # with deferred tools
    mod.add_member("erin", "plans first", agent_type="reviewer", plan_mode_required=True)
    define(workspace, "reviewer", REVIEWER)
    record = mod.find_member(mod.read_roster(mod.my_team()["dir"]), "erin")
    assert "exit_plan_mode" in [t["name"] for t in mod.teammate_settings(record)["tools"]]  # it must ask


def test_a_teammate_whose_agent_type_is_gone_tells_the_lead_and_stops(crew, api, client, workspace, monkeypatch):
    mod = crew
    define(workspace, "reviewer", REVIEWER)
    mod.add_member("carol", "reviews", agent_type="reviewer")
    (workspace / ".agent" / "agents" / "reviewer.md").unlink()             # after the lead checked it
    code, bodies = run_teammate(mod, api, client, workspace, "carol", monkeypatch, steps=())
    assert code == 1 and bodies == []
    told = [r for r in inbox(workspace, "lead") if r["from"] == "carol"]
    assert len(told) == 1 and "Unknown agent_type 'reviewer'" in told[0]["content"]


# --- work, idle, claim --------------------------------------------------------------------

def board(workspace):
    return {p.stem: json.loads(p.read_text()) for p in (workspace / ".agent" / "tasks").glob("*.json")}


def claims_in(body):
    """The task ids the claim prompts in a request's history named, in order."""
    return re.findall(r"You claimed task #(\d+)", json.dumps(body["messages"]))


def test_a_task_says_which_role_it_is_for_and_the_board_shows_it(mod, workspace):
    for args in ({"subject": "write the tests", "role": "  Writes the\nTESTS "}, {"subject": "for anyone"},
                 {"subject": "blank role", "role": ""}):
        out = call(mod, "task_create", args)
        assert not out.get("is_error"), out
    tasks = board(workspace)
    assert tasks["1"]["role"] == "Writes the TESTS" and "role" not in tasks["2"] and "role" not in tasks["3"]
    assert "#1 [ready, for role: Writes the TESTS] write the tests" in mod.task_list()
    assert "[ready, for role: Writes the TESTS]" in mod.task_get("1")
    assert not call(mod, "task_update", {"id": "2", "role": "reviews"}).get("is_error")
    assert board(workspace)["2"]["role"] == "reviews"
    assert not call(mod, "task_update", {"id": "1", "role": ""}).get("is_error")   # for anyone again
    assert "role" not in board(workspace)["1"]
    out = call(mod, "task_create", {"subject": "x", "role": "r" * (mod.MAX_SUBJECT + 1)})
    assert out["is_error"] and "Shorten it" in out["content"]


def test_a_planted_task_whose_role_is_not_text_is_no_task(mod, workspace):
    mod.task_create("real")
    planted = board(workspace)["1"] | {"id": "2", "role": ["writes the code"]}
    (workspace / ".agent" / "tasks" / "2.json").write_text(json.dumps(planted))
    assert mod.claim_next("alice", role="writes the code")["id"] == "1"
    assert mod.claim_next("bob") is None                              # 2 is skipped, as a broken file is


def test_claim_next_takes_what_fits_the_role_or_was_assigned(mod, workspace):
    mod.task_create("tests", role="writes the tests")                # 1: bob's role
    mod.task_create("bob's, by name", role="writes the code")        # 2: assigned to bob, another role
    mod.task_update("2", owner="bob")
    mod.task_create("code", role="Writes  The Code")                 # 3: alice's, case and spacing aside
    mod.task_create("anything")                                      # 4: for anyone
    assert mod.claim_next("alice", role="writes the code")["id"] == "3"
    assert mod.claim_next("alice", role="writes the code")["id"] == "4"
    assert mod.claim_next("alice", role="writes the code") is None   # 1 is bob's role, 2 bob's task
    assert mod.claim_next("bob", role="writes the tests")["id"] == "1"
    assert mod.claim_next("bob", role="writes the tests")["id"] == "2"   # assigned: whatever its role
    assert {i: t["owner"] for i, t in board(workspace).items()} == {"1": "bob", "2": "bob", "3": "alice",
                                                                    "4": "alice"}


def test_an_idle_teammate_claims_only_the_ready_tasks_that_fit_its_role(crew, api, client, workspace, monkeypatch):
    """Alice writes the code: the task for testers is never hers; the one for nobody in
    particular and the one for her role are, in id order, one wake-up each."""
    mod = crew
    monkeypatch.setattr(mod, "IDLE_TIMEOUT", 0.05)
    monkeypatch.setattr(mod, "IDLE_POLL", 0.01)
    for args in ({"subject": "write the tests", "role": "Writes the TESTS"}, {"subject": "write the README"},
                 {"subject": "write parser.py", "role": "writes the code"}):
        assert not call(mod, "task_create", args).get("is_error")
    alice = member(mod, workspace, "alice")
    api.script([reply(tool("task_update", {"id": "2", "status": "completed"})), reply("README done."),
                reply(tool("task_update", {"id": "3", "status": "completed"})), reply("parser done.")])
    with mod.acting_as(alice):
        assert mod.teammate_loop(client, []) == 0
    bodies = message_bodies(api)
    assert api.remaining() == 0 and len(bodies) == 4
    assert [claims_in(b) for b in bodies] == [["2"], ["2"], ["2", "3"], ["2", "3"]]  # one wake-up each
    tasks = board(workspace)
    assert [(tasks[i]["owner"], tasks[i]["status"]) for i in "123"] == [
        ("", "pending"), ("alice", "completed"), ("alice", "completed")]
    with mod.acting_as(member(mod, workspace, "bob")):
        assert mod.claim_next("bob", "writes the tests")["id"] == "1"   # bob's role: it is his


def test_an_idle_teammate_tells_the_lead_and_stops_after_the_idle_timeout(crew, api, client, workspace, monkeypatch):
    mod = crew
    monkeypatch.setattr(mod, "IDLE_TIMEOUT", 0.2)
    monkeypatch.setattr(mod, "IDLE_POLL", 0.02)
    alice = member(mod, workspace, "alice")
    mod.send_message("alice", "say hello")
    api.script([reply("Hello.")])
    with mod.acting_as(alice):
        assert mod.teammate_loop(client, []) == 0
    assert len(message_bodies(api)) == 1                              # one wake-up, then only idle looks
    told = [r for r in inbox(workspace, "lead") if r["from"] == "alice"]
    assert len(told) == 1 and told[0]["type"] == "message"
    assert told[0]["content"] == "Idle for 0.2 s with nothing to do; stopping."
    assert mod.find_member(mod.read_roster(mod.my_team()["dir"]), "alice")["status"] == "stopped"
    assert "has stopped" in str(pytest.raises(mod.ToolError, mod.send_message, "alice", "still there?").value)
