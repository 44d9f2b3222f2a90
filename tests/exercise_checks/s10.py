"""Checks for exercises/s10.md. Each point: (what must hold, a hint, fn(x))."""
import contextlib
import contextvars
import datetime
import io
import json
import re
import sys
import threading
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


# s10.1: the work that unblocks the most comes first -----------------------------------
def create(x, *tasks):
    """task_create for each (subject, ids it is blocked by), in one turn; the results."""
    steps = [reply(tool("task_create", {"subject": subject} | ({"blocked_by": after} if after else {})))
             for subject, *rest in tasks for after in [rest[0] if rest else []]]
    results = x.tool_results(turn(x, steps))
    for r in results:
        assert not r.get("is_error"), f"task_create was refused: {r['content'][:300]!r}"
    return results


def listed(x):
    """The task ids in task_list's order."""
    result = call(x, "task_list", {})
    assert not result.get("is_error"), f"task_list failed: {result['content'][:300]!r}"
    return re.findall(r"^#(\d+) \[", result["content"], re.M)


def named(x, id):
    """The task ids task_get names, the task's own aside."""
    result = call(x, "task_get", {"id": id})
    assert not result.get("is_error"), f"task_get {id} failed: {result['content'][:300]!r}"
    return set(re.findall(r"#(\d+)", result["content"])) - {id}


def a_release(x):
    """#3 has three tasks waiting on it (#5, and #6 and #7 through #5), #2 one (#4),
    #1 and #8 none: ready 3, 2, 1, 8; blocked: 5 (two wait on it), then 4, 6, 7."""
    create(x, ("write the docs",), ("write the parser",), ("design the schema",),
           ("test the parser", ["2"]), ("migrate the data", ["3"]), ("backfill old rows", ["5"]),
           ("report the numbers", ["5"]), ("tidy the repo",))


def plant(x, id, blocks=(), blocked_by=()):
    """A task file as another process (or a clone) writes it, no tool asked."""
    folder = x.ws / ".agent" / "tasks"
    folder.mkdir(parents=True, exist_ok=True)
    task = {"id": id, "subject": f"task {id}", "description": "", "status": "pending", "owner": "",
            "blocked_by": list(blocked_by), "blocks": list(blocks),
            "created": "2030-01-01T00:00:00", "updated": "2030-01-01T00:00:00"}
    (folder / f"{id}.json").write_text(json.dumps(task))


def most_waiting_first(x):
    a_release(x)
    order = listed(x)
    assert order[:4] == ["3", "2", "1", "8"], (
        f"ready tasks listed {order[:4]}, not 3, 2, 1, 8: #3 has three tasks waiting on it (#5, and "
        f"#6 and #7 through #5), #2 one, #1 and #8 none (so by id)")
    assert order[4:] == ["5", "4", "6", "7"], (
        f"blocked tasks listed {order[4:]}, not 5, 4, 6, 7: the kinds keep their order, and within "
        f"the blocked ones #5 has two tasks waiting on it")


def each_counted_once(x):
    create(x, ("lay the pipes",), ("wire the kitchen", ["1"]), ("wire the bath", ["1"]),
           ("paint", ["2", "3"]), ("order the parts",), *[(f"fit part {n}", ["5"]) for n in range(4)])
    order = listed(x)
    assert order[:2] == ["5", "1"], (
        f"ready tasks listed {order[:2]}, not 5, 1: four tasks wait on #5; three on #1 (#2, #3 and "
        f"#4, which waits on both #2 and #3 and counts once)")


def get_names_them(x):
    a_release(x)
    assert {"5", "6", "7"} <= named(x, "3"), (
        f"task_get 3 names {sorted(named(x, '3'), key=int)}: #6 and #7 wait on it through #5, and are not named")
    assert not {"5", "6", "7"} & named(x, "2"), "task_get 2 names tasks that wait on #3, not on #2"


def planted_loop(x):
    plant(x, "1")
    plant(x, "2", blocks=["3", "4"], blocked_by=["3"])  # #2 and #3 wait on each other: no tool makes
    plant(x, "3", blocks=["2"], blocked_by=["2"])        # that, but the files can hold it
    plant(x, "4", blocked_by=["2"])
    answers = {}

    def read_board():  # in a thread of its own: a walk that never ends must not hang the checker
        try:
            answers["list"], answers["get"] = x.mod.task_list(), x.mod.task_get("2")
        except Exception as e:  # reported below, as the point's failure
            answers["error"] = f"{type(e).__name__}: {e}"
    worker = threading.Thread(target=contextvars.copy_context().run, args=(read_board,), daemon=True)
    worker.start()
    worker.join(timeout=10)
    assert not worker.is_alive(), ("task_list or task_get did not answer within 10 s on a board whose files "
                                   "hold a loop (#2 and #3 wait on each other): does your walk end?")
    assert "error" not in answers, (f"on a board whose files hold a loop (#2 and #3 wait on each other), "
                                    f"task_list or task_get raised {answers.get('error', '')[:200]}")
    shown = re.findall(r"^#(\d+) \[", answers["list"], re.M)
    assert sorted(shown) == ["1", "2", "3", "4"], f"task_list showed {shown} of a board with tasks 1-4"
    assert "#4" in answers["get"], f"task_get 2 does not name #4, which waits on it: {answers['get'][:300]!r}"


def follows_every_change(x):
    create(x, ("write the parser",), ("write the docs",))
    assert listed(x) == ["1", "2"], f"two tasks with nothing waiting are listed {listed(x)}, not by id"
    create(x, ("proofread the docs", ["2"]))
    assert listed(x)[:2] == ["2", "1"], f"after #3 came to wait on #2 the ready tasks are listed {listed(x)[:2]}"
    plant(x, "4", blocked_by=["1"])  # another process adds two tasks waiting on #1 (one side of the edge:
    plant(x, "5", blocked_by=["1"])  # the board mends the other)
    assert listed(x)[:2] == ["1", "2"], (f"after another process added two tasks waiting on #1, the ready "
                                         f"tasks are listed {listed(x)[:2]}, not 1, 2")


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


def says_timed_out(note):
    """Timed out, in the chapter's words or the obvious others: Timeout, time limit,
    ran longer than, exceeded."""
    return bool(re.search(r"time[ds]?[ _-]?out|time[ _-]?limit|too long|longer than|exceed", note, re.I))


def names_half_a_second(note):
    """0.5 s as people write it: 0.5s, .5 seconds, 0.50 s, 500 ms."""
    return bool(re.search(r"(?<![\d.])0?\.50*(?![\d.])|(?<![\d.])500\s*(ms|milli)", note, re.I))


def stopped_at_its_timeout(x):
    record = background(x, {"command": "sleep 30", "timeout": 0.5})
    assert record["status"] == "failed", f"after its 0.5 s timeout the command's status is {record['status']!r}"
    notes = re.findall(r"<note>(.*?)</note>", notification_text(x))
    assert any(says_timed_out(n) and names_half_a_second(n) for n in notes), \
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
    1: ("the work that unblocks the most comes first", [
        ("in each kind, task_list puts first the tasks the most others wait on, directly or through others",
         "Which tasks wait on #3? Follow the blocks edges past the first step. task_list() picks its "
         "order in one sort key.",
         most_waiting_first),
        ("a task that waits on another along two paths is counted once",
         "Draw it: #1 blocks #2 and #3, both block #4. How many times does your walk reach #4?",
         each_counted_once),
        ("task_get names every task waiting on it, through others too",
         "task_get() prints the direct edges (blocks:); the rest come from the walk your order uses.",
         get_names_them),
        ("a loop the board's files hold (no tool makes one) does not hang task_list or task_get",
         "The files are not only what the tools wrote. Read how blocks_path() keeps its walk finite.",
         planted_loop),
        ("the order follows every change: a task_create, and edges another process wrote to the files",
         "Is your count worked out from the edges each time the board is read, or kept somewhere a "
         "change can miss?",
         follows_every_change),
    ]),
    2: ("cron macros: @daily, @hourly and the others", [
        ("schedule_create accepts @daily; it first runs at the next midnight",
         "Which function do schedule_create(), next_fire() and the listing all call with the cron?",
         daily_is_accepted),
        ("each macro fires exactly when its five fields do",
         "@yearly and @annually: 0 0 1 1 *; @monthly: 0 0 1 * *; @weekly: 0 0 * * 0; @daily and "
         "@midnight: 0 0 * * *; @hourly: 0 * * * *.",
         each_macro_is_its_fields),
        ("schedule_list shows a @weekly job with its next run",
         "schedule_list shows the cron as the job keeps it: which function works out its next run?",
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
         "Where does the watcher thread get its limit, and where does it write the note? What does "
         "the thread get to work with?",
         stopped_at_its_timeout),
        ("a command that ends in time completes as before",
         "Only the limit changes: the rest of watch_background() stays as it is.",
         ends_in_time),
        ("0, -1, more than the 30 minutes, and true are refused before anything starts",
         "Read how parse_hook() checks a hook's timeout, then try `true` against your check.",
         bad_timeouts_refused),
    ]),
}
