"""Checks for exercises/s10.md. Each point: (what must hold, a hint, fn(x))."""
import contextlib
import datetime
import io
import json
import re
import sys
import time

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
    """One tool call in a turn of its own; its tool_result."""
    history = turn(x, [reply(tool(name, args))])
    return x.tool_results(history)[0]


# s10.1: task priorities --------------------------------------------------------------
def create(x, *tasks):
    """task_create for each (subject, priority or None, more fields), in one turn; the results."""
    steps = [reply(tool("task_create", {"subject": subject} | ({"priority": p} if p else {}) | more))
             for subject, p, *rest in tasks for more in [rest[0] if rest else {}]]
    results = x.tool_results(turn(x, steps))
    for r in results:
        assert not r.get("is_error"), f"task_create was refused: {r['content'][:300]!r}"
    return results


def listed(x):
    """The task ids in task_list's order."""
    result = call(x, "task_list", {})
    assert not result.get("is_error"), f"task_list failed: {result['content'][:300]!r}"
    return re.findall(r"^#(\d+) \[", result["content"], re.M)


def priority_offered(x):
    turn(x, [], prompt="hello")
    tools = {t["name"]: t for t in x.bodies()[0]["tools"]}
    for name in ("task_create", "task_update"):
        prop = tools[name]["input_schema"].get("properties", {}).get("priority")
        assert prop and prop.get("type") == "string" and set(prop.get("enum", [])) == {"high", "normal", "low"}, \
            f"{name} has no priority field with the values high, normal, low: {prop}"
        assert "priority" not in tools[name]["input_schema"].get("required", []), f"{name}'s priority must be optional"


def listed_by_priority(x):
    create(x, ("write the parser", None), ("tidy the docs", "low"), ("fix the crash", "high"),
           ("add the tests", "normal"), ("release", "high", {"blocked_by": ["1"]}))
    order = listed(x)
    assert order[:4] == ["3", "1", "4", "2"], \
        f"ready tasks #1 normal, #2 low, #3 high, #4 normal are listed as {order[:4]}, not 3, 1, 4, 2"
    assert order[4:] == ["5"], f"the blocked high task #5 must still come after the ready ones: {order}"


def update_and_get(x):
    create(x, ("write the parser", None), ("tidy the docs", None))
    result = call(x, "task_update", {"id": "2", "priority": "high"})
    assert not result.get("is_error"), f"task_update priority high was refused: {result['content'][:300]!r}"
    assert listed(x) == ["2", "1"], "after task_update priority high, #2 is not listed first"
    shown = call(x, "task_get", {"id": "2"})["content"]
    assert re.search(r"priority:? high", shown), f"task_get does not show priority: high: {shown[:300]!r}"
    shown = call(x, "task_get", {"id": "1"})["content"]
    assert re.search(r"priority:? normal", shown), f"a task made without one is not shown as normal: {shown[:300]!r}"


def bad_priority_refused(x):
    result = call(x, "task_create", {"subject": "ship it", "priority": "urgent"})
    assert result.get("is_error"), f"priority urgent was accepted: {result['content'][:200]!r}"
    assert "high" in result["content"], f"the refusal does not name the priorities there are: {result['content'][:200]!r}"
    assert not listed(x), "a task was created with priority urgent"
    create(x, ("write the parser", "low"))
    result = call(x, "task_update", {"id": "1", "priority": "urgent"})
    assert result.get("is_error"), f"task_update priority urgent was accepted: {result['content'][:200]!r}"
    assert re.search(r"priority:? low", call(x, "task_get", {"id": "1"})["content"]), \
        "a refused update changed the priority"


def files_without_or_with_a_bad_priority(x):
    folder = x.ws / ".agent" / "tasks"
    folder.mkdir(parents=True)
    for id, priority in (("1", None), ("2", 7)):  # one from before priorities, one a clone planted
        task = {"id": id, "subject": f"old task {id}", "description": "", "status": "pending", "owner": "",
                "blocked_by": [], "blocks": [], "created": "2030-01-01T00:00:00", "updated": "2030-01-01T00:00:00"}
        (folder / f"{id}.json").write_text(json.dumps(task | ({"priority": priority} if priority else {})))
    create(x, ("tidy the docs", "low"), ("fix the crash", "high"))
    order = listed(x)
    assert order == ["4", "1", "2", "3"], \
        f"#1 (no priority) and #2 (priority 7) must count as normal: listed {order}, not 4, 1, 2, 3"


# s10.2: cron macros ------------------------------------------------------------------
NOW = datetime.datetime(2030, 1, 2, 10, 15)  # a Wednesday
MACROS = {"@yearly": "0 0 1 1 *", "@annually": "0 0 1 1 *", "@monthly": "0 0 1 * *",
          "@weekly": "0 0 * * 0", "@daily": "0 0 * * *", "@midnight": "0 0 * * *", "@hourly": "0 * * * *"}


def at_now(x):
    x.patch(x.mod, "local_now", lambda: NOW)


def schedule(x, cron, **more):
    return call(x, "schedule_create", {"cron": cron, "prompt": "run the tests", **more})


def daily_is_accepted(x):
    at_now(x)
    result = schedule(x, "@daily")
    assert not result.get("is_error"), f"@daily was refused: {result['content'][:300]!r}"
    assert "2030-01-03 00:00" in result["content"], \
        f"@daily, created 2030-01-02 10:15, does not first run at 2030-01-03 00:00: {result['content'][:300]!r}"


def each_macro_is_its_fields(x):
    for when in (NOW, datetime.datetime(2030, 12, 31, 23, 59), datetime.datetime(2031, 2, 28, 0, 0)):
        for macro, fields in MACROS.items():
            try:
                got = x.mod.next_fire(macro, when)
            except ValueError as e:
                raise AssertionError(f"next_fire({macro!r}) refused it: {e}")
            want = x.mod.next_fire(fields, when)
            assert got == want, f"after {when:%Y-%m-%d %H:%M}, {macro} fires at {got}, {fields!r} at {want}"


def listed_with_next_run(x):
    at_now(x)
    assert not schedule(x, "@weekly").get("is_error"), "@weekly was refused"
    listing = call(x, "schedule_list", {})["content"]
    assert "@weekly" in listing and "next 2030-01-06 00:00" in listing, \
        f"schedule_list does not show the @weekly job with its next run, Sunday 00:00: {listing[:400]!r}"


def unknown_macros_refused(x):
    at_now(x)
    for bad in ("@often", "@reboot", "@daily 5", "@"):
        result = schedule(x, bad)
        assert result.get("is_error"), f"{bad!r} was accepted"
    assert "@hourly" in result["content"], f"the refusal does not list the macros there are: {result['content'][:300]!r}"


def five_fields_unchanged(x):
    at_now(x)
    result = schedule(x, "*/15 9-17 * * mon-fri")
    assert not result.get("is_error") and "2030-01-02 10:30" in result["content"], \
        f"'*/15 9-17 * * mon-fri' no longer works as before: {result['content'][:300]!r}"
    assert schedule(x, "0 0 * *").get("is_error"), "four fields were accepted"


# s10.3: a timeout for one background command -------------------------------------
WAIT = 5                    # seconds the checker waits for a background command to end


def started(x):
    return list(x.state.background.values())


def ended(x, record):
    """Wait until the watcher recorded the end; a command still running after WAIT
    seconds is stopped (so nothing outlives the point) and fails the point."""
    deadline = time.monotonic() + WAIT
    while record["status"] in ("running", "stopping") and time.monotonic() < deadline:
        time.sleep(0.05)
    late = [r for r in started(x) if r["status"] == "running"]
    for r in late:
        with contextlib.redirect_stderr(io.StringIO()):
            x.mod.stop_background(r)
    assert not late, f"{late[0]['command']!r} was still running after {WAIT} s"
    return record


def background(x, args):
    result = call(x, "background_run", args)
    assert not result.get("is_error"), f"background_run {args} was refused: {result['content'][:300]!r}"
    assert started(x), "background_run returned, but no background command was recorded"
    return ended(x, started(x)[-1])


def notification_text(x):
    """The <task-notification> a request carried: the one right after the call (a quick
    command may have ended by then), else the next turn's."""
    turn(x, [], prompt="what happened?")
    sent = json.dumps([b["messages"][-1] for b in x.bodies()], ensure_ascii=False)
    assert "<task-notification>" in sent, "no request carried a <task-notification>"
    return sent


def schema_offers_timeout(x):
    turn(x, [], prompt="hello")
    tools = {t["name"]: t for t in x.bodies()[0]["tools"]}
    prop = tools["background_run"]["input_schema"].get("properties", {}).get("timeout")
    assert prop, "background_run's schema has no timeout field"
    assert prop.get("type") == "number", f"timeout has type {prop.get('type')!r}, not number (0.5 s must be allowed)"
    assert "timeout" not in tools["background_run"]["input_schema"].get("required", []), "timeout must be optional"


def stopped_at_its_timeout(x):
    record = background(x, {"command": "sleep 30", "timeout": 0.5})
    assert record["status"] == "failed", f"after its 0.5 s timeout the command's status is {record['status']!r}"
    notes = re.findall(r"<note>(.*?)</note>", notification_text(x))
    assert any("timed out" in n and "0.5" in n for n in notes), \
        f"the notification's note does not say it timed out after its own 0.5 s: {notes}"


def ends_in_time(x):
    record = background(x, {"command": "echo hi", "timeout": 5})
    assert record["status"] == "completed" and record["exit_code"] == 0, \
        f"echo hi with a 5 s timeout ended {record['status']!r} (exit {record['exit_code']})"
    assert "<status>completed</status>" in notification_text(x), "its notification does not say completed"


def bad_timeouts_refused(x):
    for value in (0, -1, 100_000, True):
        result = call(x, "background_run", {"command": "echo hi", "timeout": value})
        assert result.get("is_error"), f"timeout {json.dumps(value)} was accepted: {result['content'][:200]!r}"
        assert not started(x), f"timeout {json.dumps(value)} was refused, but the command was started"


EXERCISES = {
    1: ("task priorities", [
        ("task_create and task_update take an optional priority: high, normal or low",
         "Add priority to both schemas, with an enum; the functions take it as a keyword.",
         priority_offered),
        ("task_list shows each kind high first, then normal, then low, by id within",
         "task_list() sorts by (kind, id): put the priority's rank between them.",
         listed_by_priority),
        ("task_update changes it; task_get shows it (normal when none was given)",
         "Keep it in the task's file like owner; task_get() prints one more fact.",
         update_and_get),
        ("an unknown priority is refused, and nothing is created or changed",
         "check_input() checks a field's type, not its enum: refuse the value yourself, before the change.",
         bad_priority_refused),
        ("a task file with no priority, or a bad one, counts as normal",
         "A clone may ship any file: read a task's priority with a default, never trust it.",
         files_without_or_with_a_bad_priority),
    ]),
    2: ("cron macros: @daily, @hourly and the others", [
        ("schedule_create accepts @daily; it first runs at the next midnight",
         "Let parse_cron() turn a macro into its five fields before it splits the expression.",
         daily_is_accepted),
        ("each macro fires exactly when its five fields do",
         "@yearly and @annually: 0 0 1 1 *; @monthly: 0 0 1 * *; @weekly: 0 0 * * 0; @daily and "
         "@midnight: 0 0 * * *; @hourly: 0 * * * *.",
         each_macro_is_its_fields),
        ("schedule_list shows a @weekly job with its next run",
         "The job keeps the cron as written; everything that reads it goes through parse_cron().",
         listed_with_next_run),
        ("an unknown macro (@often, @reboot, @daily 5) is refused, and the error lists the macros",
         "A word starting with @ that is not a known macro is a ValueError naming them.",
         unknown_macros_refused),
        ("five-field expressions work as before",
         "Expand only a whole expression that is one macro; leave the rest to the field parser.",
         five_fields_unchanged),
    ]),
    3: ("a timeout for one background command", [
        ("background_run offers an optional timeout, a number of seconds",
         "Add timeout to background_run's params() (type number) and to the function's arguments.",
         schema_offers_timeout),
        ("sleep 30 with timeout 0.5 is stopped; its notification says it timed out after 0.5 s",
         "The watcher passes BACKGROUND_TIMEOUT to watch_command(): keep the command's own on its "
         "record, use it there, and in the note watch_background() writes.",
         stopped_at_its_timeout),
        ("a command that ends in time completes as before",
         "Only the limit changes: the rest of watch_background() stays as it is.",
         ends_in_time),
        ("0, -1, more than the 30 minutes, and true are refused before anything starts",
         "Check the value first, as parse_hook() checks a hook's timeout (a bool is an int in Python).",
         bad_timeouts_refused),
    ]),
}
