"""Checks for exercises/s11.md. Each point: (what must hold, a hint, fn(x)).
The team lives in this process: the point's agent is the lead, its teammates are
roster records with inboxes (no teammate processes are started)."""
import contextlib
import io
import json
import re
import sys

from fake_api import reply, tool


def turn(x, steps, prompt="do the work"):
    """x.turn with the agent's output kept (x.err: what it printed on stderr), not shown."""
    out, err = io.StringIO(), io.StringIO()
    x.patch(sys, "stdin", io.StringIO(""))  # a question nobody answers reads end of input: no
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        history = x.turn(steps, prompt)
    x.err = getattr(x, "err", "") + err.getvalue()
    return history


def call(x, name, args):
    history = turn(x, [reply(tool(name, args))])
    return x.tool_results(history)[0]


ROLES = {"alice": "writes the parser", "bob": "writes the tests", "carol": "reviews the code"}


def team(x, statuses):
    """The point's agent leads team t; statuses: {member: working | idle | stopped}."""
    m = x.mod
    m.create_team("t")
    for name, status in statuses.items():
        m.add_member(name, ROLES[name])
        m.set_member(name, status=status)
    return x.state.team["dir"]


def inbox(folder, name):
    path = folder / "inbox" / f"{name}.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


# s11.1: a broadcast that skips idle members ---------------------------------------
def says_idle(text):
    """Idle in any case, or the obvious other words for a member with no turn running."""
    return bool(re.search(r"\bidl(e|ing)\b|\binactive\b|\basleep\b|\bsleeping\b|not working", text, re.I))


def skips_idle(x):
    folder = team(x, {"alice": "working", "bob": "idle", "carol": "stopped"})
    result = call(x, "send_message", {"to": "*", "content": "the API changed: pull first"})
    assert not result.get("is_error"), f"the broadcast was refused: {result['content'][:300]!r}"
    assert [r["content"] for r in inbox(folder, "alice")] == ["the API changed: pull first"], \
        "alice (working) did not get the broadcast"
    assert not inbox(folder, "bob"), "bob is idle, and the broadcast woke him"
    assert not inbox(folder, "carol"), "carol has stopped, and the broadcast reached her inbox"


def names_the_skipped(x):
    team(x, {"alice": "working", "bob": "idle"})
    result = call(x, "send_message", {"to": "*", "content": "the API changed: pull first"})
    text = result["content"]
    assert re.search(r"\bbob\b", text, re.I) and says_idle(text), \
        f"the result does not say bob was skipped as idle: {text[:300]!r}"


def include_idle_reaches_them(x):
    folder = team(x, {"alice": "working", "bob": "idle", "carol": "stopped"})
    turn(x, [], prompt="hello")
    props = next(t for t in x.bodies()[0]["tools"] if t["name"] == "send_message")["input_schema"]["properties"]
    assert props.get("include_idle", {}).get("type") == "boolean", "send_message has no boolean include_idle"
    result = call(x, "send_message", {"to": "*", "content": "stand-up in 5", "include_idle": True})
    assert not result.get("is_error"), f"include_idle true was refused: {result['content'][:300]!r}"
    assert inbox(folder, "alice") and inbox(folder, "bob"), "with include_idle true not both alice and bob got it"
    assert not inbox(folder, "carol"), "a stopped member got a broadcast"


def direct_messages_unchanged(x):
    folder = team(x, {"alice": "working", "bob": "idle"})
    result = call(x, "send_message", {"to": "bob", "content": "please take task 3"})
    assert not result.get("is_error") and inbox(folder, "bob"), \
        f"a message to bob by name did not reach him: {result['content'][:300]!r}"
    log = (folder / "messages.jsonl").read_text().splitlines()
    assert len(log) == 1, f"the team's log holds {len(log)} records for one delivered message"


def all_idle_is_an_error(x):
    folder = team(x, {"alice": "idle", "bob": "idle"})
    result = call(x, "send_message", {"to": "*", "content": "anyone there?"})
    assert result.get("is_error"), f"a broadcast that reached nobody was not an error: {result['content'][:300]!r}"
    assert says_idle(result["content"]), f"the error does not say they are idle: {result['content'][:300]!r}"
    assert not inbox(folder, "alice") and not inbox(folder, "bob"), "an idle member got the broadcast"
    assert not (folder / "messages.jsonl").exists() or not (folder / "messages.jsonl").read_text().strip(), \
        "the team's log records a broadcast nobody got"


# s11.2: a team_status tool -------------------------------------------------------------
def busy_team(x):
    """alice working with 3 unread messages and task #1; bob idle, nothing; carol stopped."""
    folder = team(x, {"alice": "working", "bob": "idle", "carol": "stopped"})
    for n in range(3):
        x.mod.post("alice", "message", f"note {n}")
    x.mod.task_create("parse the csv")
    x.mod.task_update("1", owner="alice", status="in_progress")
    return folder


def status_text(x):
    result = call(x, "team_status", {})
    assert not result.get("is_error"), f"team_status failed: {result['content'][:300]!r}"
    return result["content"]


def member_lines(text, name):
    return [line for line in text.splitlines() if re.search(rf"\b{name}\b", line, re.I)]


STATUS_WORDS = {  # a status in the roster's word, in any case, or an obvious other word for it
    "working": r"working|busy|active|running",
    "idle": r"idle|idling|inactive|free|available",
    "stopped": r"stopped|ended|exited|gone|offline|finished",
}


def shows(line, status, role):
    return bool(re.search(rf"\b({STATUS_WORDS[status]})\b", line, re.I)) and role.lower() in line.lower()


def offered(x):
    turn(x, [], prompt="hello")
    tools = {t["name"]: t for t in x.bodies()[0]["tools"]}
    assert "team_status" in tools, "the model is not offered a team_status tool"
    schema = tools["team_status"]["input_schema"]
    assert schema.get("type") == "object" and not schema.get("required"), \
        f"team_status's schema must be an object with nothing required: {schema}"


def members_roles_statuses(x):
    busy_team(x)
    text = status_text(x)
    for name, status in (("alice", "working"), ("bob", "idle"), ("carol", "stopped")):
        assert any(shows(line, status, ROLES[name]) for line in member_lines(text, name)), \
            f"no line names {name} with its role ({ROLES[name]!r}) and status {status!r}: {text[:500]!r}"


def unread_counted_not_taken(x):
    folder = busy_team(x)
    text = status_text(x)
    assert any(re.search(r"\b3\b", line) for line in member_lines(text, "alice")), \
        f"alice's line does not count her 3 unread messages: {member_lines(text, 'alice')}"
    assert not any(re.search(r"\b3\b", line) for line in member_lines(text, "bob")), \
        f"bob has no unread message, and his line says 3: {member_lines(text, 'bob')}"
    assert len(inbox(folder, "alice")) == 3, "team_status took alice's messages out of her inbox"


def open_tasks_shown(x):
    busy_team(x)
    text = status_text(x)
    assert any("#1" in line for line in member_lines(text, "alice")), \
        f"alice's line does not show her open task #1: {member_lines(text, 'alice')}"
    assert not any("#1" in line for line in member_lines(text, "bob")), "bob's line shows alice's task"


def outside_a_team(x):
    result = call(x, "team_status", {})
    assert result.get("is_error") and re.search(r"\bteams?\b", result["content"], re.I) \
        and not result["content"].startswith(("Unknown tool", "team_status failed")), \
        f"team_status outside a team gave {result['content'][:200]!r}, not an error that says so"


EXERCISES = {
    1: ("a broadcast that skips idle members", [
        ("a broadcast reaches the working members, not the idle or stopped ones",
         "everyone_else() picks who a * message goes to: leave out the idle ones there (or in "
         "deliver_to_all()).",
         skips_idle),
        ("its result names who was skipped as idle",
         "What does a broadcast already report about members it did not reach? Follow it through "
         "deliver_to_all() and send_message().",
         names_the_skipped),
        ("include_idle true reaches idle members too (never stopped ones)",
         "Add include_idle to send_message's schema and pass it down through post() and deliver() "
         "to deliver_to_all().",
         include_idle_reaches_them),
        ("a message to one member by name is delivered as before, and logged once",
         "Only a broadcast skips: a message to a name goes to that member, idle or not.",
         direct_messages_unchanged),
        ("a broadcast that reaches nobody is an error that says they are idle, and is not logged",
         "check_reached() refuses a broadcast with nothing sent: the reasons it gives come from missed.",
         all_idle_is_an_error),
    ]),
    2: ("a team_status tool", [
        ("the model is offered team_status, with no required input",
         "register() it beside send_message, with params([]), read-only and concurrency-safe.",
         offered),
        ("one line per member: name, role and status",
         "read_roster() of the running agent's team (my_team()) has every member's record.",
         members_roles_statuses),
        ("each member's unread messages are counted, and none is taken",
         "Read the function you count with: are the messages still in the inbox after it?",
         unread_counted_not_taken),
        ("each member's open tasks are shown",
         "open_tasks_by_owner() reads the board once for every member.",
         open_tasks_shown),
        ("outside a team it is an error that says so",
         "my_team() raises the ToolError for you.",
         outside_a_team),
    ]),
}
