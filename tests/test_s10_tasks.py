"""s10: the task graph on disk.

The handlers are called directly on the test's workspace; one test drives
them through the loop with a scripted model, and one starts four real
processes that change the same board at the same time.
"""
import contextlib
import contextvars
import datetime
import functools
import io
import json
import os
import random
import shlex
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from conftest import ROOT, chapters_from, message_bodies, run_turn
from fake_api import reply, tool

pytestmark = pytest.mark.parametrize("mod", chapters_from("s10"), indirect=True)


def board(workspace):
    """Every task file on disk, by id."""
    return {p.stem: json.loads(p.read_text()) for p in (workspace / ".agent" / "tasks").glob("*.json")}


def assert_symmetric(tasks):
    """B in A.blocked_by exactly when A in B.blocks; no edge to a closed task."""
    edges_in = {(b, t["id"]) for t in tasks.values() for b in t["blocked_by"]}
    edges_out = {(t["id"], d) for t in tasks.values() for d in t["blocks"]}
    assert edges_in == edges_out
    for a, b in edges_in:
        assert tasks[a]["status"] in ("pending", "in_progress"), (a, tasks[a]["status"])
        assert tasks[b]["status"] in ("pending", "in_progress"), (b, tasks[b]["status"])


def refused(mod, handler, *args, **kwargs):
    with pytest.raises(mod.ToolError) as e:
        handler(*args, **kwargs)
    return str(e.value)


def test_dependencies_are_kept_on_both_sides(mod, workspace):
    mod.task_create("parse")
    mod.task_create("test", blocked_by=["1"])
    mod.task_create("docs")
    mod.task_update("3", add_blocked_by=["#2"])
    mod.task_update("1", add_blocks=["3"])
    tasks = board(workspace)
    assert tasks["1"]["blocks"] == ["2", "3"] and tasks["2"]["blocked_by"] == ["1"]
    assert tasks["2"]["blocks"] == ["3"] and tasks["3"]["blocked_by"] == ["2", "1"]
    mod.task_update("3", remove_blocked_by=["1"])
    tasks = board(workspace)
    assert tasks["1"]["blocks"] == ["2"] and tasks["3"]["blocked_by"] == ["2"]
    assert_symmetric(tasks)
    assert {"id", "subject", "description", "status", "owner", "blocked_by", "blocks",
            "created", "updated"} <= set(tasks["1"])


def test_random_changes_keep_the_graph_symmetric_and_acyclic(mod, workspace):
    rng = random.Random(10)
    for n in range(12):
        mod.task_create(f"task {n}")
    for _ in range(150):
        a, b = str(rng.randint(1, 12)), str(rng.randint(1, 12))
        op = rng.choice(["block", "block", "block", "unblock", "status"])
        try:
            if op == "block":
                mod.task_update(a, add_blocked_by=[b])
            elif op == "unblock":
                mod.task_update(a, remove_blocked_by=[b])
            else:
                mod.task_update(a, status=rng.choice(["pending", "in_progress", "completed", "deleted"]))
        except mod.ToolError:
            pass  # refused: a cycle, a closed task, a blocked one; the board must still hold
        tasks = board(workspace)
        assert_symmetric(tasks)
        for t in tasks.values():   # no task reaches itself along blocks
            assert mod.blocks_path(tasks, t["id"], t["id"]) == [t["id"]]
            assert all(mod.blocks_path(tasks, d, t["id"]) is None for d in t["blocks"])


def test_completing_a_task_unblocks_its_dependents(mod, workspace):
    mod.task_create("parse")
    mod.task_create("lint")
    mod.task_create("test", blocked_by=["1", "2"])
    assert refused(mod, mod.task_update, "3", status="in_progress").startswith("Task #3 is blocked by #1, #2")
    out = mod.task_update("1", status="completed")
    assert "Now ready" not in out                      # #3 still waits for #2
    assert board(workspace)["3"]["blocked_by"] == ["2"] and board(workspace)["1"]["blocks"] == []
    assert mod.task_list().splitlines()[1:3] == ["#2 [ready] lint", "#3 [blocked by #2] test"]
    out = mod.task_update("2", status="completed")
    assert out.endswith("Now ready: #3 test.")
    assert board(workspace)["3"]["blocked_by"] == []
    assert mod.task_list().splitlines() == ["1 ready, 2 completed", "#3 [ready] test",
                                            "#1 [completed] parse", "#2 [completed] lint"]
    assert "already completed" in refused(mod, mod.task_create, "more", blocked_by=["1"])


def test_deleting_a_task_is_logical_and_unblocks_too(mod, workspace):
    mod.task_create("spike")
    mod.task_create("build", blocked_by=["1"])
    assert mod.task_update("1", status="deleted").endswith("Now ready: #2 build.")
    tasks = board(workspace)
    assert tasks["1"]["status"] == "deleted" and tasks["2"]["blocked_by"] == []   # the file stays
    assert "spike" not in mod.task_list() and "[deleted]" in mod.task_get("1")
    assert "is deleted" in refused(mod, mod.task_update, "1", status="pending")
    assert mod.task_create("next").startswith("Created task #3")                 # id 1 not reused


def test_a_dependency_that_would_make_a_cycle_is_refused_and_named(mod, workspace):
    for subject in ("a", "b", "c"):
        mod.task_create(subject)
    mod.task_update("2", add_blocked_by=["1"])
    mod.task_update("3", add_blocked_by=["2"])
    files = {p.name: p.read_bytes() for p in (workspace / ".agent" / "tasks").glob("*.json")}
    why = refused(mod, mod.task_update, "1", add_blocked_by=["3"])
    assert "#1 -> #2 -> #3 -> #1" in why and "cycle" in why
    assert "#2 -> #2" in refused(mod, mod.task_update, "2", add_blocks=["2"])
    # a refused change is no change, even when part of the same call was fine
    assert "cycle" in refused(mod, mod.task_update, "1", owner="me", add_blocked_by=["3"])
    assert {p.name: p.read_bytes() for p in (workspace / ".agent" / "tasks").glob("*.json")} == files


def test_task_list_puts_ready_tasks_first(mod, workspace):
    mod.task_create("first")
    mod.task_create("second", blocked_by=["1"])
    mod.task_create("third")
    mod.task_create("fourth")
    mod.task_update("3", owner="alice")                # claimed: not ready for anyone else
    mod.task_update("4", status="in_progress")
    mod.task_create("fifth")
    assert mod.task_list().splitlines() == [
        "2 ready, 1 in progress, 1 claimed, 1 blocked",
        "#1 [ready] first", "#5 [ready] fifth", "#4 [in_progress] fourth",
        "#3 [claimed, owner: alice] third", "#2 [blocked by #1] second"]


def test_bad_input_and_planted_files_get_clear_errors(mod, workspace, tmp_path):
    assert "not a task id" in refused(mod, mod.task_get, "abc")
    assert "No task #7" in refused(mod, mod.task_update, "7", status="completed")
    assert "one non-empty line" in refused(mod, mod.task_create, "two\nlines")
    mod.task_create("real")
    folder = workspace / ".agent" / "tasks"
    (folder / "2.json").write_text("not json")                     # a broken file: skipped...
    (folder / "3.json").write_bytes(b" " * (mod.TASK_FILE_BYTES + 1) + b"{}")
    (folder / "4.json").symlink_to(folder / "1.json")              # a link: not followed
    assert mod.task_list() == "1 ready\n#1 [ready] real"
    assert mod.task_create("new").startswith("Created task #5")   # ...but its id is not reused
    os.mkfifo(folder / "6.json")                                   # a FIFO: a read would wait forever
    lister = threading.Thread(target=contextvars.copy_context().run, args=(mod.task_list,), daemon=True)
    lister.start()
    lister.join(timeout=10)                                        # a hang guard, not a timing assertion
    assert not lister.is_alive(), "task_list hangs on a planted FIFO"
    assert mod.task_create("after").startswith("Created task #7")
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    other = tmp_path / "other"
    (other / ".agent").mkdir(parents=True)
    (other / ".agent" / "tasks").symlink_to(outside)
    with mod.acting_as(mod.AgentState(other)):
        assert "outside the workspace" in refused(mod, mod.task_create, "x")
    assert list(outside.iterdir()) == []


@pytest.mark.permissions
def test_the_task_tools_never_ask(mod):
    state = mod.agent_state()
    for mode in ("default", "plan"):
        state.mode = mode
        for name, args in [("task_create", {"subject": "x"}), ("task_update", {"id": "1"}),
                           ("task_get", {"id": "1"}), ("task_list", {})]:
            assert mod.decide(name, args, state)[0] == "allow", (mode, name)


def test_the_model_uses_the_board_through_the_loop(mod, api, client, workspace):
    run_turn(mod, api, client, [
        reply(tool("task_create", {"subject": "Write the parser"}),
              tool("task_create", {"subject": "Test it", "blocked_by": ["1"]})),
        reply(tool("task_list", {})),
    ], prompt="plan it as tasks")
    last = message_bodies(api)[-1]["messages"][-1]["content"]
    results = [b["content"] for b in last if b["type"] == "tool_result"]
    assert results == ["1 ready, 1 blocked\n#1 [ready] Write the parser\n#2 [blocked by #1] Test it"]
    assert set(board(workspace)) == {"1", "2"}


WORKER = r"""
import sys, time
from pathlib import Path
sys.path.insert(0, sys.argv[1])
mod = __import__(sys.argv[2])
ws, signals, n, count = Path(sys.argv[3]), Path(sys.argv[4]), sys.argv[5], int(sys.argv[6])
mod.CURRENT.set(mod.AgentState(ws))
(signals / f"ready-{n}").touch()
while not (signals / "go").exists():
    time.sleep(0.002)
for k in range(count):
    mod.task_create(f"worker {n} task {k}", blocked_by=["1"])
    mod.task_update("1", description=f"touched by {n}")
"""


@pytest.mark.e2e("s10")
def test_four_processes_changing_the_board_at_once_lose_nothing(mod, workspace, tmp_path):
    """Every create rewrites #1 (its blocks list): without the lock two processes
    read the same #1 and one append is lost, or two tasks get the same id."""
    mod.task_create("shared")
    signals, per = tmp_path / "signals", 25
    signals.mkdir()
    procs = [subprocess.Popen([sys.executable, "-c", WORKER, str(ROOT), mod.__name__, str(workspace),
                               str(signals), str(n), str(per)], stderr=subprocess.PIPE, text=True)
             for n in range(4)]
    deadline = time.monotonic() + 60                    # a hang guard, not a timing assertion
    while len(list(signals.glob("ready-*"))) < 4 and time.monotonic() < deadline:
        assert all(p.poll() is None for p in procs), [p.stderr.read() for p in procs]
        time.sleep(0.01)
    (signals / "go").touch()
    for p in procs:
        assert p.wait(timeout=60) == 0, p.stderr.read()
    tasks = board(workspace)
    assert sorted(map(int, tasks)) == list(range(1, 2 + 4 * per))      # unique ids, none skipped
    assert sorted(t["subject"] for t in tasks.values() if t["id"] != "1") == sorted(
        f"worker {n} task {k}" for n in range(4) for k in range(per))
    assert sorted(map(int, tasks["1"]["blocks"])) == list(range(2, 2 + 4 * per))  # no append lost
    assert_symmetric(tasks)
    assert not list((workspace / ".agent" / "tasks").glob("*.tmp"))


# --- the cron matcher, against croniter -------------------------------------------------

YEAR = datetime.datetime(2023, 12, 31, 23, 59), datetime.datetime(2025, 1, 1)  # 2024: a leap year
SPARSE = [  # few fires a year: the whole next-fire sequence over YEAR must agree
    "0 0 * * *", "30 6 * * *", "0 */6 * * *", "15 9 * * mon-fri", "0 9-17/2 * * 1-5",
    "0 0 1 * *", "0 0 1,15 * *", "0 0 29 2 *", "0 0 31 * *", "0 0 30 4,6,9,11 *",
    "0 0 * * 0", "0 0 * * 7", "0 0 * * sun", "0 8 * * sat,sun", "0 0 13 * fri",
    "0 0 1-7 * mon", "0 0 */10 * *", "0 0 5/10 * *", "45 23 * dec *", "0 0 1 jan *",
    "0 0 1 * *,1", "0 0 1 * *,mon", "0 0 *,15 * mon",    # a day field starting with *: unrestricted
    "0 0 * * 1/2", "0 0 * * 3/2", "0 0 * * 0/3", "0 0 * * 1-7/2",        # open ranges end at 6
    "0 0 1 */3 *", "0 0 * feb-apr wed", "0 6,18 * * *", "59 23 31 12 *", "0 0 15 * 2-4",
    "0 12 * jan-mar sun,7", "10-20/5 3 * * *",  # */2 in a day field: see test_a_day_field_starting...
    "0 0 * * 5-7", "0 4 8-14 * 1", "0 0 1 JAN,JUL *", "0 0 * * MON", "0 0 28-31 * *",
    "0 9 1 * mon-fri", "0 0 29 * *",
    "30 2 * * mon-fri/2", "0 0 1 jan-dec/3 *", "0 0 10-20/3 * sat", "0 1 1,10-12 * 0,6",  # names, steps
]
DENSE = [  # many fires: a seeded sample of minutes must agree (match and next fire)
    "* * * * *", "*/5 * * * *", "5/10 * * * *", "0-30 * * * *", "*/7 8-18 * * 1-5",
    "1,2,3,5,8,13,21,34,55 * * * *", "* 0-5 * * *", "*/15 * * * 6,0", "*/3 * 1-10 * *",
    "* * * 2 *", "0-59/20 * 15 * fri", "* 12 * * *",
]


def croniter_class():
    from croniter import croniter   # a test-only dependency (requirements.txt)
    return croniter


@functools.cache
def croniter_answers():
    """croniter's side of the comparison below, the same for every file: computed
    once (it is ~85% of the test's time). (SPARSE's fires over YEAR, the sample of
    minutes, DENSE's matches and next fires on that sample.)"""
    croniter = croniter_class()
    fires = {}
    for expr in SPARSE:
        fires[expr], it = [], croniter(expr, YEAR[0])
        while (t := it.get_next(datetime.datetime)) < YEAR[1]:
            fires[expr].append(t)
    rng = random.Random(1010)
    minutes = [YEAR[0] + datetime.timedelta(minutes=rng.randrange(525_600)) for _ in range(400)]
    dense = {expr: ([croniter.match(expr, t) for t in minutes],
                    [croniter(expr, t).get_next(datetime.datetime) for t in minutes[:60]]) for expr in DENSE}
    return fires, minutes, dense


def test_forty_expressions_agree_with_croniter_over_a_year(mod):
    fires, minutes, dense = croniter_answers()
    assert len(SPARSE) + len(DENSE) >= 40
    for expr in SPARSE:
        ours, t = [], YEAR[0]
        while (t := mod.next_fire(expr, t)) < YEAR[1]:
            ours.append(t)
        assert ours == fires[expr], expr
        assert fires[expr], f"{expr} never fires in the year: a useless comparison"
    for expr in DENSE:
        cron = mod.parse_cron(expr)
        matches, nexts = dense[expr]
        assert [mod.cron_matches(cron, t) for t in minutes] == matches, expr
        for t, theirs in zip(minutes[:60], nexts):
            assert mod.next_fire(expr, t) == theirs, (expr, t)


REFUSED_LIKE_CRONITER = [  # (expression, the field the error names); croniter refuses them too
    ("*/00 * * * *", "minute"), ("0 0 * * */000", "day-of-week"), ("1/0 * * * *", "minute"),
    ("*/ * * * *", "minute"), ("5/ * * * *", "minute"), ("1-5/ * * * *", "minute"),
    ("*/² * * * *", "minute"), ("² * * * *", "minute"), ("٣ * * * *", "minute"), ("0 0 * * ७", "day-of-week"),
]


def test_a_bad_cron_expression_names_its_field(mod):
    for expr, field in [("61 * * * *", "minute"), ("* 24 * * *", "hour"), ("* * 0 * *", "day-of-month"),
                        ("* * * 13 *", "month"), ("* * * * 8", "day-of-week"), ("*/0 * * * *", "minute"),
                        ("* * 5-2 * *", "day-of-month"), ("* * * foo *", "month"),
                        ("* * * * mon-", "day-of-week"), ("? * * * *", "minute"), ("1,,2 * * * *", "minute"),
                        ] + REFUSED_LIKE_CRONITER:
        with pytest.raises(ValueError, match=f"cron {field} field"):
            mod.parse_cron(expr)
    with pytest.raises(ValueError, match="5 fields"):
        mod.parse_cron("* * *")
    assert mod.next_fire("0 0 31 2 *", YEAR[0]) is None                        # never comes
    assert mod.next_fire("0 0 29 2 *", datetime.datetime(2097, 1, 1)) == datetime.datetime(2104, 2, 29)


# --- background commands ---------------------------------------------------------------

WAIT_FOR_GO = "while [ ! -f go ]; do sleep 0.02; done; echo tests passed"   # ends when told to


@pytest.fixture
def background(mod):
    """The chapter, and after the test nothing of it still running."""
    yield mod
    for record in list(mod.agent_state().background.values()):
        mod.stop_background(record)


def started_id(out):
    assert out.startswith("Started b"), out
    return out.split()[1]


def wait_for(condition, what="the condition", deadline=10):
    """A hang guard, not a timing assertion: fail if `condition` never holds."""
    end = time.monotonic() + deadline
    while not condition():
        assert time.monotonic() < end, f"{what} did not happen within {deadline} s"
        time.sleep(0.02)


def finish(mod, id):
    """Wait for the watcher to record the end (a hang guard, not a timing assertion)."""
    record = mod.agent_state().background[id]
    record["_thread"].join(timeout=30)
    assert not record["_thread"].is_alive()
    return record


def status_file(workspace, id):
    return json.loads((workspace / ".agent" / "runtime-tasks" / f"{id}.json").read_text())


def log_text(workspace, id):
    return (workspace / ".agent" / "runtime-tasks" / f"{id}.log").read_text()


def ended(p, seconds):
    """Wait for a child to end; one that does not is aborted, and its threads' stacks
    (PYTHONFAULTHANDLER in its environment) are the failure's message."""
    try:
        p.wait(timeout=seconds)
    except subprocess.TimeoutExpired:
        p.send_signal(signal.SIGABRT)
        _, stderr = p.communicate(timeout=30)
        raise AssertionError(f"not ended within {seconds} s; its stderr:\n{stderr.decode(errors='replace')}")


def gone(pid):
    """A process that no longer exists, or only as a zombie nobody reaped yet."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return True
    return stat.rsplit(")", 1)[1].split()[0] in ("Z", "X")


def group(pgid):
    """The live processes of a process group, from /proc (zombies are dead)."""
    pids = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid and fields[0] not in ("Z", "X"):
            pids.append(int(stat.parent.name))
    return pids


def group_exists(pgid):
    try:
        os.killpg(pgid, 0)
        return True
    except ProcessLookupError:
        return False


def last_blocks(body):
    return body["messages"][-1]["content"]


def notes_in(content):
    """The <task-notification> texts among a message's blocks."""
    blocks = [{"type": "text", "text": content}] if isinstance(content, str) else content
    return [b["text"] for b in blocks if b.get("type") == "text" and "<task-notification>" in b["text"]]


def test_the_model_works_on_while_a_background_command_runs(background, api, client, workspace):
    """The "test run" ends only once the model's next call has come (it waits for a
    file that call makes), so that call provably happens while it runs; the news is
    in the first request after the end, not before and not again."""
    mod, seen, state = background, {}, background.agent_state()

    def while_it_runs(body):
        (result,) = [b for b in last_blocks(body) if b.get("type") == "tool_result"]
        seen["id"] = started_id(result["content"])
        record = state.background[seen["id"]]
        seen["alive"], seen["early"] = not gone(record["pid"]), notes_in(last_blocks(body))
        seen["running"] = status_file(workspace, seen["id"])["status"]
        (workspace / "go").touch()                                  # now it may end ...
        wait_for(lambda: gone(record["pid"]), "the end of the run")  # ... and has, before the next call
        return reply(tool("task_list", {}))                          # the model works on

    def after_it_ended(body):
        seen["first"] = last_blocks(body)
        return reply(tool("task_list", {}))

    def later(body):
        seen["later"] = body
        return reply("Finished.")

    api.script([reply(tool("background_run", {"command": WAIT_FOR_GO})), while_it_runs, after_it_ended, later])
    history = [{"role": "user", "content": "run the tests in the background"}]
    assert mod.agent_loop(client, history) == "end_turn"
    assert seen["alive"] and seen["running"] == "running" and seen["early"] == []
    assert [b["type"] for b in seen["first"]] == ["tool_result", "text"]   # the notification after the result
    note = seen["first"][1]["text"]
    assert note.startswith("<task-notification>") and f"<task-id>{seen['id']}</task-id>" in note
    assert "<status>completed</status>" in note and "<exit-code>0</exit-code>" in note
    assert "tests passed" in note and f".agent/runtime-tasks/{seen['id']}.log" in note
    assert WAIT_FOR_GO in note
    assert notes_in(last_blocks(seen["later"])) == []                 # not again ...
    everything = [n for m in seen["later"]["messages"] for n in notes_in(m["content"])]
    assert everything == [note]                                        # ... once in the whole history
    assert status_file(workspace, seen["id"])["exit_code"] == 0


@pytest.mark.parametrize("slow", ["record", "wait"])
def test_a_command_that_has_ended_is_in_the_very_next_request(background, api, client, workspace,
                                                               monkeypatch, slow):
    """Its watcher may not have recorded the end yet when the next call is made (here a
    slow one): the loop waits for it, instead of leaving the news for a later request.
    "wait": the watcher has not even reaped the process, and Popen.poll answers None
    meanwhile, as it does whenever another thread holds the process's wait lock."""
    mod, state, seen = background, background.agent_state(), {}
    tail, watch = mod.read_tail, mod.watch_command

    def slow_tail(fh, limit):
        time.sleep(0.3)
        return tail(fh, limit)

    def slow_watch(p, sink, timeout):
        wait_for(lambda: gone(p.pid), "the end of the run")   # it ends before its watcher looks
        time.sleep(0.3)
        return watch(p, sink, timeout)

    if slow == "record":
        monkeypatch.setattr(mod, "read_tail", slow_tail)
    else:
        monkeypatch.setattr(mod, "watch_command", slow_watch)
        monkeypatch.setattr(subprocess.Popen, "poll", lambda self: self.returncode)

    def ended(body):
        (record,) = state.background.values()
        (workspace / "go").touch()
        wait_for(lambda: gone(record["pid"]), "the end of the run")
        return reply(tool("task_list", {}))

    def next_request(body):
        seen["notes"] = notes_in(last_blocks(body))
        return reply("Finished.")

    api.script([reply(tool("background_run", {"command": WAIT_FOR_GO})), ended, next_request])
    assert mod.agent_loop(client, [{"role": "user", "content": "go"}]) == "end_turn"
    assert len(seen["notes"]) == 1 and "<status>completed</status>" in seen["notes"][0]


def test_background_stop_leaves_no_process_behind(background, workspace):
    mod = background
    id = started_id(mod.background_run("sleep 100 & sleep 100 & echo started; wait"))
    pgid = mod.agent_state().background[id]["pid"]
    wait_for(lambda: "started" in log_text(workspace, id), "the start")
    pids = group(pgid)
    assert len(pids) == 3                                           # the shell and its two children
    assert "Stopped" in mod.background_stop(id)
    assert status_file(workspace, id)["status"] == "stopped"
    wait_for(lambda: all(gone(p) for p in pids), "the end of every process")  # the killed ones die
    assert group(pgid) == []
    wait_for(lambda: not group_exists(pgid), "the group's end")     # init reaps the orphans
    assert mod.drain_notifications() == []                          # the model asked: no news
    assert "is not running: stopped" in mod.background_stop(id)


def test_what_an_ended_command_left_running_goes_with_it(background, workspace):
    """`cmd &` inside a background command: the shell ends at once, its job would run
    on, unwatched, writing to the log without a cap, and background_stop could not
    reach it. It is killed when the command ends, and the model is told why."""
    mod = background
    id = started_id(mod.background_run("(while :; do echo spam; sleep 0.01; done) & sleep 100 & echo started"))
    record = finish(mod, id)
    assert record["status"] == "completed" and record["exit_code"] == 0
    assert "left processes running" in record["note"] and "drop the &" in record["note"]
    wait_for(lambda: group(record["pid"]) == [], "the end of what it left")
    (note,) = [mod.notification(r) for r in mod.drain_notifications()]
    assert "<note>it left processes running" in note


def test_a_process_that_left_the_group_with_setsid_dies_with_the_command(background, workspace):
    """Without the OS sandbox a `setsid` child is out of the process group that a
    stop or the end kills, but it still holds the log: it goes too, and the log
    stops growing."""
    mod = background
    loop = "while :; do echo spam; sleep 0.01; done"
    for how in ("end", "stop"):
        tail = "echo started" if how == "end" else "sleep 100"
        id = started_id(mod.background_run(f"setsid sh -c {shlex.quote(loop)} & {tail}"))
        log = workspace / mod.agent_state().background[id]["log"]
        wait_for(lambda: log.stat().st_size > 0, "the escaped loop's first line")
        if how == "stop":
            mod.background_stop(id)
        record = finish(mod, id)
        size = log.stat().st_size
        time.sleep(0.2)                                                 # it wrote every 10 ms while alive
        assert log.stat().st_size == size, f"the escaped process writes on after the {how}"
        assert how == "stop" or "left processes running" in record["note"]


def test_background_output_is_capped_like_bash(background, monkeypatch, workspace):
    mod = background
    monkeypatch.setattr(mod, "BASH_OUTPUT_CAP", 100_000)
    id = started_id(mod.background_run("cat /dev/zero"))               # gigabytes a second
    record = finish(mod, id)
    assert record["status"] == "failed" and "output passed" in record["note"]
    assert (workspace / record["log"]).stat().st_size <= 100_000        # the disk keeps the cap exactly
    (note,) = [mod.notification(r) for r in mod.drain_notifications()]
    assert "<status>failed</status>" in note and "output passed" in note
    assert len(note) < 2 * mod.BACKGROUND_PREVIEW


def test_every_request_is_valid_with_notifications_beside_results_and_prompts(background, api, client,
                                                                             workspace):
    """A notification joins a plain-text prompt, and a message of parallel results
    and hook context, always last; the api fixture fails the test on any bad request."""
    mod, state, seen = background, background.agent_state(), {}
    earlier = started_id(mod.background_run("echo from an earlier turn"))
    finish(mod, earlier)
    state.permissions["hooks"] = mod.read_hooks("config.yaml", {"hooks": [{
        "event": "post_tool_use", "if": 'tool == "task_list"',
        "action": {"type": "prompt", "message": "the board changed"}}]}, "user", True)

    def prompt_and_news(body):
        seen["first"] = last_blocks(body)
        return reply(tool("background_run", {"command": WAIT_FOR_GO}))

    def while_it_runs(body):
        (record,) = [r for r in state.background.values() if r["id"] != earlier]
        (workspace / "go").touch()
        wait_for(lambda: gone(record["pid"]), "the end of the run")
        return reply(tool("task_list", {}), tool("background_check", {}))   # a parallel pair

    def results_and_news(body):
        seen["second"] = last_blocks(body)
        return reply("Finished.")

    api.script([prompt_and_news, while_it_runs, results_and_news])
    assert mod.agent_loop(client, [{"role": "user", "content": "go on"}]) == "end_turn"
    assert [b["type"] for b in seen["first"]] == ["text", "text"]
    assert seen["first"][0]["text"] == "go on" and f"<task-id>{earlier}</task-id>" in seen["first"][1]["text"]
    kinds = [b["type"] for b in seen["second"]]
    assert kinds == ["tool_result", "tool_result", "text", "text"], kinds
    assert "the board changed" in seen["second"][2]["text"]            # the hook's reminder, then the news
    assert seen["second"][3]["text"].startswith("<task-notification>")
    assert len(message_bodies(api)) == 3


def test_a_notification_is_never_taken_for_the_prompt(background):
    """Hooks on user_prompt_submit, recall and the memory extractor read the prompt;
    news that joined a message of results (or the prompt) is not one."""
    mod = background
    id = started_id(mod.background_run("echo done"))
    news = {"type": "text", "text": mod.notification(finish(mod, id))}
    result = {"type": "tool_result", "tool_use_id": "t1", "content": "ok"}
    history = [{"role": "user", "content": "fix the parser"},
               {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "bash", "input": {}}]},
               {"role": "user", "content": [result, news]}]
    assert mod.prompt_text(history) is None                            # results and news: no new prompt
    assert mod.turn_text(history).startswith("user: fix the parser")   # the turn starts at the real prompt
    assert mod.prompt_text([{"role": "user", "content": [{"type": "text", "text": "go"}, news]}]) == "go"


def test_background_check_lists_and_shows_and_a_subagent_leaves_the_news(background):
    mod = background
    assert mod.background_check() == "No background commands this session."
    id = started_id(mod.background_run("echo out; exit 3"))
    finish(mod, id)
    child = mod.child_state(False, "helper")
    messages = [{"role": "user", "content": "child work"}]
    with mod.acting_as(child):
        mod.deliver_notifications(messages)                         # not the child's to take
    assert messages == [{"role": "user", "content": "child work"}]
    assert mod.background_check() == f"{id} [failed, exit 3] echo out; exit 3"
    shown = mod.background_check(id)
    assert shown.startswith(f"{id} [failed, exit 3]") and shown.endswith("out\n")
    assert mod.drain_notifications() == []                          # seen: not repeated
    assert "No background command 'nope'" in refused(mod, mod.background_check, "nope")


def test_the_session_end_stops_what_still_runs_with_one_line(background, capsys, workspace):
    mod = background
    with mod.background_session():
        id = started_id(mod.background_run("sleep 30"))
    lines = [x for x in capsys.readouterr().err.splitlines() if "stopping" in x]
    assert lines == [f"[stopping 1 background command(s): {id} [running] sleep 30]"]
    assert status_file(workspace, id)["status"] == "stopped"


def test_main_stops_what_still_runs_when_the_session_ends(background, api, workspace, monkeypatch, capsys):
    mod = background
    monkeypatch.setenv("ANTHROPIC_API_KEY", "test")
    monkeypatch.setenv("ANTHROPIC_BASE_URL", api.url)
    monkeypatch.setenv("AGENT_PERMISSION_MODE", "bypassPermissions")
    api.script([reply(tool("background_run", {"command": "sleep 60"})), reply("It runs.")])
    assert mod.main(["serve it"]) == 0
    (record,) = mod.agent_state().background.values()
    lines = [x for x in capsys.readouterr().err.splitlines() if "[stopping" in x]
    assert lines == [f"[stopping 1 background command(s): {record['id']} [running] sleep 60]"]
    assert record["status"] == "stopped" and gone(record["pid"])


@pytest.mark.e2e("s10")
def test_a_killed_or_hung_up_session_stops_its_background_commands(mod, api, workspace):
    """SIGTERM (a kill) or SIGHUP (the terminal closed) ends the REPL like an exit:
    each command has its own process group, so nothing else would stop it."""
    for sig in (signal.SIGTERM, signal.SIGHUP):
        api.script([reply(tool("background_run", {"command": "sleep 60"})), reply("It runs.")])
        env = {k: v for k, v in os.environ.items() if not k.startswith("ANTHROPIC")}
        env |= {"ANTHROPIC_API_KEY": "test", "ANTHROPIC_BASE_URL": api.url, "PYTHONUNBUFFERED": "1",
                "AGENT_PERMISSION_MODE": "bypassPermissions", "AGENT_AUTO_MEMORY": "0",
                "PYTHONFAULTHANDLER": "1"}  # a process that does not end shows where it is (SIGABRT)
        p = subprocess.Popen([sys.executable, str(ROOT / f"{mod.__name__}.py")], cwd=workspace, env=env,
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        try:
            p.stdin.write(b"serve it\n")
            p.stdin.flush()
            wait_for(lambda: api.remaining() == 0 and len(api.requests) == 2, "the turn", deadline=30)
            folder = workspace / ".agent" / "runtime-tasks"
            wait_for(lambda: any(json.loads(f.read_text())["status"] == "running" for f in folder.glob("b*.json")),
                     "the background command", deadline=30)
            p.send_signal(sig)
            ended(p, 30)                    # stdin stays open: an end of input must not race the signal
            stderr = p.stderr.read()
        finally:
            p.kill()
        (status,) = [json.loads(f.read_text()) for f in folder.glob("b*.json")]
        assert p.returncode == 128 + sig, stderr
        assert f"[stopping 1 background command(s): {status['id']} [running] sleep 60]" in stderr.decode()
        assert status["status"] == "stopped" and gone(status["pid"])
        for f in folder.iterdir():
            f.unlink()
        api.reset()


# --- the layers and the hooks judge a background command as bash -------------------------

@pytest.mark.permissions
def test_background_run_is_judged_as_bash(mod, workspace):
    state = mod.agent_state()
    state.permissions["sandbox"]["enabled"] = False
    assert mod.decide("background_run", {"command": "sudo make install"}, state)[:2] == ("deny", "blocklist")
    assert mod.decide("background_run", {"command": "pytest -q"}, state)[0] == "ask"   # default mode
    state.permissions["rules"] = [mod.parse_rule("bash(pytest *)") | {"effect": "allow", "file": "x"},
                                  mod.parse_rule("bash(rm *)") | {"effect": "deny", "file": "x"}]
    assert mod.decide("background_run", {"command": "pytest -q"}, state)[0] == "allow"
    assert mod.decide("background_run", {"command": "pytest -q && rm -rf build"}, state)[0] == "deny"
    assert mod.narrow_rule("background_run", {"command": "npm run test"}, state) == ["bash(npm run test *)"]
    state.mode = "bypassPermissions"
    assert "blocklist" in refused(mod, mod.background_run, "sudo reboot")


def answers(monkeypatch, *lines):
    """The human's answers, read from stdin in order; then end of input."""
    monkeypatch.setattr(sys, "stdin", io.StringIO("".join(line + "\n" for line in lines)))


def results(body):
    return [b for b in last_blocks(body) if b.get("type") == "tool_result"]


@pytest.mark.permissions
def test_through_the_loop_a_rule_the_blocklist_and_the_human_stop_background_run(background, api, client,
                                                                                  workspace, monkeypatch):
    mod = background
    state = mod.agent_state()
    state.permissions["sandbox"]["enabled"] = False                 # else the sandbox would allow it
    state.permissions["rules"] = [mod.parse_rule("bash(rm *)") | {"effect": "deny", "file": "config.yaml"}]
    answers(monkeypatch, "n")                                       # the one question: no
    run_turn(mod, api, client, [reply(tool("background_run", {"command": "rm -rf build"}),
                                      tool("background_run", {"command": "sudo make install"}),
                                      tool("background_run", {"command": "make"}))])
    denied = [r["content"] for r in results(message_bodies(api)[1])]
    assert [d.split(":")[0] for d in denied] == ["Permission denied (rule)", "Permission denied (blocklist)",
                                                 "Permission denied (the user)"]
    assert state.background == {}                                   # nothing started
    assert not list((workspace / ".agent").glob("runtime-tasks/b*"))


@pytest.mark.permissions
def test_background_run_runs_inside_the_sandbox_like_bash(background, api, client, workspace, monkeypatch):
    mod = background
    if not mod.sandbox_available()[0]:
        pytest.skip(f"the OS sandbox does not work here: {mod.sandbox_available()[1]}")
    outside = workspace.parent / "home" / "outside.txt"              # HOME: read-only inside
    command = f"echo inside > in.txt; echo x > {shlex.quote(str(outside))}"
    answers(monkeypatch)                                            # no question may come
    run_turn(mod, api, client, [reply(tool("background_run", {"command": command}))])
    (record,) = mod.agent_state().background.values()
    finish(mod, record["id"])
    assert (workspace / "in.txt").read_text() == "inside\n"
    assert not outside.exists() and record["exit_code"] != 0
    state = mod.agent_state()
    state.permissions["sandbox"]["enabled"] = False                 # the same command, unsandboxed
    state.mode = "bypassPermissions"
    finish(mod, started_id(mod.background_run(command)))
    assert outside.read_text() == "x\n"                            # so the sandbox made the difference


HOOK_RECORD = """\
import json, os, sys
payload = json.load(sys.stdin)
with open("calls.jsonl", "a") as f:
    f.write(json.dumps({"event": os.environ["EVENT"], "tool_name": payload["tool_name"],
                        "tool_input": payload["tool_input"], "env": os.environ.get("TOOL_NAME"),
                        "flag": os.environ.get("TOOL_ARGS_RUN_IN_BACKGROUND")}) + "\\n")
"""


def use_hooks(mod, *items):
    """Hooks as if read from a trusted user config file."""
    mod.agent_state().permissions["hooks"] = mod.read_hooks("config.yaml", {"hooks": list(items)}, "user", True)


def hook(event, command, cond=None):
    return {"event": event, "action": {"type": "command", "command": command}} | ({"if": cond} if cond else {})


def recorder(workspace):
    script = workspace / ".agent" / "hooks" / "record.py"
    script.parent.mkdir(parents=True, exist_ok=True)
    script.write_text(HOOK_RECORD)
    return f"{shlex.quote(sys.executable)} {shlex.quote(str(script))}"


def hook_calls(workspace):
    path = workspace / "calls.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def test_a_hook_that_guards_bash_guards_background_run_too(background, api, client, workspace):
    mod = background
    (workspace / "build").mkdir()
    use_hooks(mod, hook("pre_tool_use", "echo 'no rm here: use git clean' >&2; exit 2",
                        'tool == "bash" && args.command =~ "\\\\brm\\\\b"'))
    run_turn(mod, api, client, [reply(tool("background_run", {"command": "rm -rf build"}),
                                      tool("bash", {"command": "rm -rf build"}),
                                      tool("background_run", {"command": "echo fine"}))])
    got = results(message_bodies(api)[1])
    assert [r.get("is_error", False) for r in got] == [True, True, False]
    assert all("no rm here" in r["content"] for r in got[:2]) and got[2]["content"].startswith("Started b")
    assert (workspace / "build").is_dir()


@pytest.mark.permissions
def test_hooks_see_background_run_as_bash_with_run_in_background(background, api, client, workspace,
                                                                  monkeypatch):
    mod = background
    state = mod.agent_state()
    state.permissions["sandbox"]["enabled"] = False                 # both calls ask: permission_request
    use_hooks(mod, *(hook(event, recorder(workspace)) for event in
                     ("pre_tool_use", "permission_request", "post_tool_use")))
    answers(monkeypatch, "y", "y")
    run_turn(mod, api, client, [reply(tool("background_run", {"command": "echo one"}),
                                      tool("bash", {"command": "echo two"}))])
    seen = hook_calls(workspace)
    assert [(c["event"], c["tool_name"], c["env"]) for c in seen] == [
        (event, "bash", "bash") for event in ("pre_tool_use", "permission_request", "post_tool_use")] * 2
    assert [c["tool_input"] for c in seen] == [{"command": "echo one", "run_in_background": True}] * 3 \
        + [{"command": "echo two"}] * 3
    assert [c["flag"] for c in seen] == ["true"] * 3 + [None] * 3


def test_a_hook_tells_them_apart_by_run_in_background(background, api, client, workspace):
    mod = background
    use_hooks(mod, hook("pre_tool_use", '[ "$TOOL_ARGS.run_in_background" = true ] && '
                                        '{ echo "no background runs here" >&2; exit 2; }; exit 0', 'tool == "bash"'),
              hook("pre_tool_use", "echo 'flagged by its condition' >&2; exit 2",
                   'tool == "bash" && args.run_in_background == "true" && args.command == "echo two"'))
    run_turn(mod, api, client, [reply(tool("background_run", {"command": "echo one"}),
                                      tool("bash", {"command": "echo two"}))])
    got = results(message_bodies(api)[1])
    assert got[0]["is_error"] and "no background runs here" in got[0]["content"]
    assert not got[1].get("is_error") and got[1]["content"] == "two\n"
    assert mod.agent_state().background == {}


@pytest.mark.parametrize("updated, runs", [
    ({"command": "echo rewritten > out.txt", "run_in_background": True}, True),
    ({"command": "echo rewritten > out.txt"}, True),
    ({"command": "echo rewritten > out.txt", "run_in_background": False}, False),   # not to the foreground
    ({"command": 42, "run_in_background": True}, False),                              # the schema holds
])
def test_an_updated_input_becomes_background_runs_own_input(background, api, client, workspace, updated, runs):
    mod = background
    rewrite = json.dumps({"hookSpecificOutput": {"hookEventName": "PreToolUse", "updatedInput": updated}})
    use_hooks(mod, hook("pre_tool_use", f"printf '%s' {shlex.quote(rewrite)}", 'tool == "bash"'),
              hook("pre_tool_use", recorder(workspace)), hook("post_tool_use", recorder(workspace)))
    run_turn(mod, api, client, [reply(tool("background_run", {"command": "echo original > out.txt"}))])
    (result,) = results(message_bodies(api)[1])
    if not runs:
        assert result["is_error"] and "rewrote the input badly" in result["content"]
        assert mod.agent_state().background == {} and hook_calls(workspace) == []
        return
    record = finish(mod, started_id(result["content"]))
    assert record["command"] == "echo rewritten > out.txt"
    assert (workspace / "out.txt").read_text() == "rewritten\n"
    shown = {"command": "echo rewritten > out.txt", "run_in_background": True}
    assert [(c["event"], c["tool_input"]) for c in hook_calls(workspace)] == [
        ("pre_tool_use", shown), ("post_tool_use", shown)]       # the next hook, and after: as shown


# --- a hostile workspace ------------------------------------------------------------------

@pytest.mark.parametrize("target", ["outside", "workspace root"])
def test_a_planted_runtime_folder_link_is_refused(background, workspace, tmp_path, target):
    mod = background
    aim = tmp_path / "elsewhere" if target == "outside" else workspace
    aim.mkdir(exist_ok=True)
    (workspace / ".agent").mkdir()
    (workspace / ".agent" / "runtime-tasks").symlink_to(aim)
    assert "symbolic link" in refused(mod, mod.background_run, "echo hi")
    assert sorted(p.name for p in aim.iterdir()) == ([] if target == "outside" else [".agent"])  # no .gitignore


def test_a_planted_gitignore_link_is_not_followed(background, workspace, tmp_path):
    mod = background
    folder = workspace / ".agent" / "runtime-tasks"
    folder.mkdir(parents=True)
    (folder / ".gitignore").symlink_to(tmp_path / "made-outside")   # a link to nothing yet
    finish(mod, started_id(mod.background_run("echo hi")))
    assert not (tmp_path / "made-outside").exists()


def test_a_planted_log_under_the_new_id_is_never_written_through(background, workspace, tmp_path, monkeypatch):
    mod = background
    folder = workspace / ".agent" / "runtime-tasks"
    folder.mkdir(parents=True)
    secret = tmp_path / "secret.txt"
    secret.write_text("keep me\n")
    (folder / "b00000000.log").symlink_to(secret)
    monkeypatch.setattr(mod.os, "urandom", lambda n: bytes(n))      # the id the clone guessed
    assert "Could not create .agent/runtime-tasks/b00000000.log" in refused(mod, mod.background_run, "echo hi")
    assert secret.read_text() == "keep me\n" and mod.agent_state().background == {}


@pytest.mark.parametrize("link", ["-s", ""])                      # a symbolic link, a hard link
def test_a_command_that_replaces_its_log_cannot_make_check_show_another_file(background, workspace, tmp_path,
                                                                           link):
    mod = background
    secret = tmp_path / "secret.txt"
    secret.write_text("the user's secret\n")
    command = (f"echo before; for f in .agent/runtime-tasks/b*.log; do rm \"$f\"; "
               f"ln {link} {shlex.quote(str(secret))} \"$f\"; done; echo after; {WAIT_FOR_GO}")
    id = started_id(mod.background_run(command))
    wait_for(lambda: "after" in mod.background_check(id), "the replacement")   # while it runs
    (workspace / "go").touch()
    finish(mod, id)
    for shown in (mod.background_check(id), mod.notification(mod.agent_state().background[id])):
        assert "before\nafter\ntests passed" in shown and "the user's secret" not in shown


@pytest.mark.parametrize("when", ["while it runs", "before the first status write"])
def test_a_command_that_swaps_the_runtime_folder_cannot_move_the_status_file(background, workspace, tmp_path,
                                                                             monkeypatch, when):
    mod = background
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    if when != "while it runs":                                     # the command wins the race
        popen = subprocess.Popen

        def started_and_done(*args, **kwargs):
            monkeypatch.setattr(mod.subprocess, "Popen", popen)     # this one call only
            p = popen(*args, **kwargs)
            p.wait()
            return p

        monkeypatch.setattr(mod.subprocess, "Popen", started_and_done)
    id = started_id(mod.background_run(f"mv .agent/runtime-tasks .agent/moved && "
                                       f"ln -s {shlex.quote(str(elsewhere))} .agent/runtime-tasks"))
    record = finish(mod, id)
    assert record["status"] == "completed"                          # known to the loop ...
    assert list(elsewhere.iterdir()) == []                          # ... and nothing written through the link
    if (workspace / ".agent" / "runtime-tasks").is_symlink():      # the status write may have remade the
        assert "symbolic link" in refused(mod, mod.background_run, "echo again")  # folder first (the door
    else:                                                           # makes what is missing): then ln put
        assert (workspace / ".agent" / "runtime-tasks").is_dir()   # its link inside that folder


@pytest.mark.permissions
def test_overlapping_sandboxed_commands_never_leave_a_git_redirect(background, workspace):
    """s07 undoes a sandboxed command's change to git's pointer files against a
    snapshot from its start. With a background command running, a bash call (or a
    second background command) starting after the redirect was planted must not take
    it for the state to keep; nor may a command ending meanwhile lose bash's own."""
    mod = background
    if not mod.sandbox_available()[0]:
        pytest.skip(f"the OS sandbox does not work here: {mod.sandbox_available()[1]}")
    mod.agent_state().permissions["sandbox"]["enabled"] = True
    subprocess.run(["git", "init", "-q"], cwd=workspace, check=True)
    pointer, plant = workspace / ".git" / "commondir", "echo ../evil > .git/commondir"
    for beside in ("bash", "background_run"):
        slow = started_id(mod.background_run(f"while [ ! -e go ]; do sleep 0.05; done; {plant}; sleep 0.3"))
        (workspace / "go").touch()
        wait_for(lambda: pointer.exists(), "the planted redirect")
        if beside == "bash":
            mod.run_bash("true")                                     # starts after the plant, ends first
        else:
            finish(mod, started_id(mod.background_run("true")))
        finish(mod, slow)
        assert not pointer.exists(), f"a redirect was left with {beside} beside it"
        (workspace / "go").unlink()
    quick = started_id(mod.background_run("sleep 0.3"))
    with contextlib.suppress(mod.ToolError):
        mod.run_bash(f"sleep 1; {plant}")                            # the background one ends meanwhile
    finish(mod, quick)
    assert not pointer.exists()


def test_a_rule_naming_background_run_is_a_config_error_not_a_rule_that_never_matches(mod, workspace):
    """background_run is judged as bash, so bash(...) rules are its rules; a rule of
    its own name would load and then never match (a deny that silently allows)."""
    for text in ("background_run", "background_run(sleep *)", "background*"):
        with pytest.raises(ValueError, match="judged by bash's rules"):
            mod.parse_rule(text)
    with pytest.raises(mod.ConfigError, match="permissions.deny"):
        mod.check_config("config.yaml", {"permissions": {"deny": ["background_run(*)"]}})
    assert mod.parse_rule("background_check")["tool"] == "background_check"   # the others keep theirs


def test_a_background_timeout_gives_advice_the_model_can_follow(background, monkeypatch):
    mod = background
    monkeypatch.setattr(mod, "BACKGROUND_TIMEOUT", 1)
    record = finish(mod, started_id(mod.background_run("sleep 30")))
    assert record["status"] == "failed" and "a background command's limit" in record["note"]
    assert "larger timeout" not in record["note"]                        # background_run has no timeout


# --- planted task files and odd cron expressions (a hostile review) ----------------------

def plant(workspace, id, **fields):
    """Write a task file as a clone could ship it: any fields, any types (None: no such field)."""
    folder = workspace / ".agent" / "tasks"
    folder.mkdir(parents=True, exist_ok=True)
    task = {"id": str(id), "subject": f"task {id}", "status": "pending", "blocked_by": [], "blocks": []}
    task = {k: v for k, v in {**task, **fields}.items() if v is not None}
    (folder / f"{id}.json").write_text(json.dumps(task))


@pytest.mark.parametrize("fields", [
    {"subject": None}, {"subject": ["a", "b"]}, {"subject": 7}, {"description": 123}, {"owner": {"x": 1}},
    {"created": 5}, {"updated": []}, {"status": "done"}, {"blocked_by": [1]}, {"blocks": "2"},
    "[" * 60_000,                                          # nests too deep for json: RecursionError
], ids=lambda f: f if isinstance(f, dict) else "deep")
def test_a_planted_task_with_wrong_types_costs_one_task_not_the_board(mod, workspace, fields):
    mod.task_create("real")
    if isinstance(fields, str):
        (workspace / ".agent" / "tasks" / "2.json").write_text(fields)
    else:
        plant(workspace, 2, **fields)
    assert mod.task_list() == "1 ready\n#1 [ready] real"
    assert "No task #2" in refused(mod, mod.task_get, "2")
    assert "No task #2" in refused(mod, mod.task_update, "2", status="completed")
    assert mod.task_update("1", owner="me").startswith("Updated task #1")
    assert mod.task_create("next").startswith("Created task #3")    # the broken file's id is not reused


def test_planted_one_sided_edges_are_mended_so_the_cycle_check_sees_them(mod, workspace):
    plant(workspace, 1)
    plant(workspace, 2, blocked_by=["1"])                  # #1's blocks lacks 2
    files = {p.name: p.read_bytes() for p in (workspace / ".agent" / "tasks").glob("*.json")}
    assert "#1 -> #2 -> #1" in refused(mod, mod.task_update, "2", add_blocks=["1"])
    assert mod.task_list() == "1 ready, 1 blocked\n#1 [ready] task 1\n#2 [blocked by #1] task 2"
    assert "blocks: #2" in mod.task_get("1")
    assert {p.name: p.read_bytes() for p in (workspace / ".agent" / "tasks").glob("*.json")} == files  # reads write nothing
    mod.task_update("1", description="touched")            # the next change writes the mend too
    assert_symmetric(board(workspace))
    assert board(workspace)["1"]["blocks"] == ["2"]
    assert mod.task_update("1", status="completed").endswith("Now ready: #2 task 2.")


def test_a_dangling_or_closed_edge_never_comes_alive(mod, workspace):
    plant(workspace, 1, blocked_by=["5", "2", "1"], blocks=["2"])   # 5 missing, 2 completed, itself
    plant(workspace, 2, status="completed", blocks=["1"])
    assert mod.task_list().splitlines()[1] == "#1 [ready] task 1"
    for n in range(3, 6):
        mod.task_create(f"later {n}")                      # #5 exists now: #1 must not wait for it
    assert mod.task_list().splitlines()[1] == "#1 [ready] task 1"
    tasks = board(workspace)
    assert tasks["1"]["blocked_by"] == [] and tasks["1"]["blocks"] == []
    assert_symmetric(tasks)


def test_task_file_names_and_ids_are_ascii_digits_of_bounded_length(mod, workspace):
    folder = workspace / ".agent" / "tasks"
    folder.mkdir(parents=True)
    (folder / ("9" * 249 + ".json")).write_text("x")       # the next id's name would be too long
    (folder / "².json").write_text("x")                    # int() reads it as 2
    assert mod.task_create("a").startswith("Created task #1")
    assert mod.task_list() == "1 ready\n#1 [ready] a"
    for value in ("²", "३", "1" * 10, "#", ""):
        assert "not a task id" in refused(mod, mod.task_get, value)
    assert mod.task_get("#0001").startswith("#1 [ready] a")
    assert mod.task_id("0" * 5_000 + "1") == "1"           # no int() of 5000 digits
    plant(workspace, 999_999_999)
    assert "longer than 9 digits" in refused(mod, mod.task_create, "b")


def test_the_board_and_its_texts_are_capped(mod, workspace, monkeypatch):
    """A board holds at most MAX_TASKS tasks and task_list shows at most TASK_LIST_LIMIT,
    counting the rest; a subject or a description over its limit is refused."""
    assert f"at most {mod.MAX_SUBJECT}" in refused(mod, mod.task_create, "x" * (mod.MAX_SUBJECT + 1))
    assert f"at most {mod.MAX_TASK_TEXT}" in refused(mod, mod.task_create, "x", "y" * (mod.MAX_TASK_TEXT + 1))
    monkeypatch.setattr(mod, "MAX_TASKS", 3)
    monkeypatch.setattr(mod, "TASK_LIST_LIMIT", 2)
    for n in range(3):
        mod.task_create(f"task {n}")
    assert "the most it may" in refused(mod, mod.task_create, "one too many")
    assert mod.task_list() == "3 ready\n#1 [ready] task 0\n#2 [ready] task 1\n" \
                              "... and 1 more (task_get shows any task)"


def test_a_day_field_starting_with_star_is_unrestricted_as_in_vixie_cron(mod):
    """croniter counts */2 as restricted (day-of-month OR day-of-week); Vixie cron
    and this matcher count a day field that starts with * as unrestricted."""
    def fires(expr, n=4):
        t, out = datetime.datetime(2025, 1, 1), []
        for _ in range(n):
            t = mod.next_fire(expr, t)
            out.append(t.strftime("%m-%d %a"))
        return out
    assert fires("0 0 */2 * mon") == ["01-13 Mon", "01-27 Mon", "02-03 Mon", "02-17 Mon"]  # odd days only
    assert fires("0 0 1-7 * */2") == ["01-02 Thu", "01-04 Sat", "01-05 Sun", "01-07 Tue"]
    assert fires("0 0 1 * */2") == ["02-01 Sat", "03-01 Sat", "04-01 Tue", "05-01 Thu"]  # a 1st on 0, 2, 4, 6
    assert fires("0 0 1 * *,1") == ["02-01 Sat", "03-01 Sat", "04-01 Tue", "05-01 Thu"]       # monthly
    assert mod.parse_cron("0 0 * * 1/2")["day-of-week"] == {1, 3, 5}      # no 7: Sunday only when written
    assert mod.parse_cron("0 0 * * 1-7/2")["day-of-week"] == {1, 3, 5, 0}
    assert mod.parse_cron("0 0 * * */7")["day-of-week"] == {0}


def test_croniter_refuses_what_the_matcher_refuses_and_long_expressions_are_capped(mod):
    croniter = croniter_class()
    for expr, _ in REFUSED_LIKE_CRONITER:
        with pytest.raises(Exception):
            croniter(expr, YEAR[0])
    long = "0 0 * * " + ",".join(["1"] * 50)                 # fine for croniter, 107 characters
    assert len(long) > mod.MAX_CRON
    with pytest.raises(ValueError, match=f"at most {mod.MAX_CRON} characters"):
        mod.parse_cron(long)
    assert "at most" in refused(mod, mod.schedule_create, long, "hi")


def test_a_planted_lock_link_or_a_file_for_the_board_is_a_clear_error(mod, workspace, tmp_path):
    (workspace / ".agent" / "tasks").mkdir(parents=True)
    (workspace / ".agent" / "tasks" / ".lock").symlink_to(tmp_path / "elsewhere")
    assert "cannot be opened as a lock" in refused(mod, mod.task_create, "x")
    assert not (tmp_path / "elsewhere").exists()
    (workspace / ".agent" / "tasks" / ".lock").unlink()
    (workspace / ".agent" / "tasks").rmdir()
    (workspace / ".agent" / "tasks").write_text("planted")
    assert "is not a folder" in refused(mod, mod.task_list)
