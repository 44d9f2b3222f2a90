"""s10: the task graph on disk.

The handlers are called directly on the test's workspace; one test drives
them through the loop with a scripted model, and one starts four real
processes that change the same board at the same time.
"""
import datetime
import json
import os
import random
import subprocess
import sys
import time

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
    "0 0 1 */3 *", "0 0 * feb-apr wed", "0 6,18 * * *", "59 23 31 12 *", "0 0 15 * 2-4",
    "0 0 */2 * mon", "0 0 1-7 * */2", "0 12 * jan-mar sun,7", "10-20/5 3 * * *",
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


def test_forty_expressions_agree_with_croniter_over_a_year(mod):
    croniter = croniter_class()
    assert len(SPARSE) + len(DENSE) >= 40
    for expr in SPARSE:
        theirs, it = [], croniter(expr, YEAR[0])
        while (t := it.get_next(datetime.datetime)) < YEAR[1]:
            theirs.append(t)
        ours, t = [], YEAR[0]
        while (t := mod.next_fire(expr, t)) < YEAR[1]:
            ours.append(t)
        assert ours == theirs, expr
        assert theirs, f"{expr} never fires in the year: a useless comparison"
    rng = random.Random(1010)
    minutes = [YEAR[0] + datetime.timedelta(minutes=rng.randrange(525_600)) for _ in range(400)]
    for expr in DENSE:
        cron = mod.parse_cron(expr)
        assert [mod.cron_matches(cron, t) for t in minutes] == [croniter.match(expr, t) for t in minutes], expr
        for t in minutes[:60]:
            assert mod.next_fire(expr, t) == croniter(expr, t).get_next(datetime.datetime), (expr, t)


def test_a_bad_cron_expression_names_its_field(mod):
    for expr, field in [("61 * * * *", "minute"), ("* 24 * * *", "hour"), ("* * 0 * *", "day-of-month"),
                        ("* * * 13 *", "month"), ("* * * * 8", "day-of-week"), ("*/0 * * * *", "minute"),
                        ("* * 5-2 * *", "day-of-month"), ("* * * foo *", "month"),
                        ("* * * * mon-", "day-of-week"), ("? * * * *", "minute"), ("1,,2 * * * *", "minute")]:
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


def finish(mod, id):
    """Wait for the watcher to record the end (a hang guard, not a timing assertion)."""
    record = mod.agent_state().background[id]
    record["_thread"].join(timeout=30)
    assert not record["_thread"].is_alive()
    return record


def status_file(workspace, id):
    return json.loads((workspace / ".agent" / "runtime-tasks" / f"{id}.json").read_text())


def test_the_model_works_on_while_a_background_command_runs(background, api, client, workspace):
    mod, seen = background, {}

    def while_it_runs(body):
        """The call after background_run: the command has not ended, and is told to now."""
        (result,) = [b for b in body["messages"][-1]["content"] if b.get("type") == "tool_result"]
        seen["id"] = started_id(result["content"])
        seen["running"] = status_file(workspace, seen["id"])["status"]
        # the bash call ends the command and waits until its status file says so
        return reply(tool("bash", {"command": "touch go; for i in $(seq 500); do grep -q '\"running\"' "
                                               ".agent/runtime-tasks/*.json || exit 0; sleep 0.02; done"}))

    def after_it_ended(body):
        seen["last"] = body["messages"][-1]["content"]
        return reply("Finished.")

    api.script([reply(tool("background_run", {"command": WAIT_FOR_GO})), while_it_runs, after_it_ended])
    history = [{"role": "user", "content": "run the tests in the background"}]
    assert mod.agent_loop(client, history) == "end_turn"
    assert seen["running"] == "running"
    kinds = [b["type"] for b in seen["last"]]
    assert kinds == ["tool_result", "text"]                        # the notification after the result
    note = seen["last"][1]["text"]
    assert note.startswith("<task-notification>") and f"<task-id>{seen['id']}</task-id>" in note
    assert "<status>completed</status>" in note and "<exit-code>0</exit-code>" in note
    assert "tests passed" in note and f".agent/runtime-tasks/{seen['id']}.log" in note
    assert WAIT_FOR_GO in note
    assert status_file(workspace, seen["id"])["exit_code"] == 0
    assert mod.drain_notifications() == []                          # reported once


def test_background_stop_leaves_no_process_behind(background, workspace):
    mod = background
    id = started_id(mod.background_run("sleep 30 & sleep 30 & echo started; wait"))
    pgid = mod.agent_state().background[id]["pid"]
    assert "Stopped" in mod.background_stop(id)
    assert status_file(workspace, id)["status"] == "stopped"
    deadline = time.monotonic() + 10                                # orphans are reaped by init
    while time.monotonic() < deadline:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            break
        time.sleep(0.02)
    with pytest.raises(ProcessLookupError):
        os.killpg(pgid, 0)
    assert mod.drain_notifications() == []                          # the model asked: no news
    assert "is not running: stopped" in mod.background_stop(id)


def test_background_output_is_capped_like_bash(background, monkeypatch, workspace):
    mod = background
    monkeypatch.setattr(mod, "BASH_OUTPUT_CAP", 100_000)
    id = started_id(mod.background_run("while :; do echo 0123456789; done"))
    record = finish(mod, id)
    assert record["status"] == "failed" and "output passed" in record["note"]
    assert (workspace / record["log"]).stat().st_size < 50 * 100_000   # stopped soon after the cap
    (note,) = [mod.notification(r) for r in mod.drain_notifications()]
    assert "<status>failed</status>" in note and "output passed" in note
    assert len(note) < 2 * mod.BACKGROUND_PREVIEW


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
