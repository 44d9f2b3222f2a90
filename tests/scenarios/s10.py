"""s10 demo: a task graph on disk, a test run and a subagent in the background, and a scheduled job that fires while the REPL is idle.

The chapter runs as a REPL (no prompt argument): the prompt is the second piped
line, and stdin stays open until the script is used up, so the REPL sits idle
between turns as it would at a terminal. Watch stderr and .agent/ (with --keep):
  1. At the start, .agent/schedules.json holds a durable job an earlier
     session made: every minute ("* * * * *"), write a status line. A file of
     jobs is prompts the agent will run by itself, so the REPL asks to trust
     it (the first piped line, y), and counts the runs it missed while no
     agent ran: they are not replayed, the next is this minute's.
  2. The typed prompt: the model creates four tasks, #2 and #3 blocked by #1,
     #4 by both. Each is a JSON file in .agent/tasks/, the edges kept from both
     ends (blocks, blocked_by).
  3. task_list, shown in full in --show-requests: ready first, then in
     progress, claimed, blocked, completed; the id only orders within a kind.
  4. The model completes #1: "Now ready: #2 ..., #3 ...". It writes the test
     and starts it with background_run: an id at once; the run's output goes
     to .agent/runtime-tasks/<id>.log.
  5. task_list again, now a mix: #3 (ready) above #2 (in progress) above #4
     (blocked), and the completed #1 last although its id is lowest.
  6. It hands #3 to a background subagent (agent with run_in_background): an
     id at once; the subagent's requests (headed "background agent" in
     --show-requests) run beside the main loop's, and it writes README.md and
     completes #3 itself.
  7. While both run, the model writes CHANGELOG.md. Before its next call the
     loop drains what finished into <task-notification> blocks after that
     round's tool results ("[background: ...]" on stderr): the command's exit
     code and output, the subagent's report. The model completes #2; #4 is
     ready, and the turn ends.
  8. The REPL is idle: the job is due, so it fires as a turn of its own
     ("[schedule ... fired"), its prompt wrapped in <scheduled-prompt>; the
     model lists the board and writes STATUS.md. The job's last run is now
     recorded in schedules.json. Then stdin closes (the human leaves) before
     the next minute's run.
"""
import datetime
import json
import re
import time
from pathlib import Path

from fake_api import reply, text, tool

PROMPT = ("Plan a csv_sum module as tasks (code, test, README, release) and do them. Run the test "
          "in the background and have a helper write the README meanwhile.")
ENV = {"AGENT_PERMISSION_MODE": "acceptEdits",   # writing the files needs no question
       "AGENT_AUTO_MEMORY": "0"}                 # no memory side calls (s09 shows those)
FAKED = ("The model's pace: after the helper starts, the scripted model waits until both the test "
         "run and the helper have ended (it watches .agent/runtime-tasks/) before it answers, as a "
         "model writing a longer changelog would, so both end between two of its calls on every "
         "machine. The human: y (trust .agent/schedules.json) and the prompt are piped to stdin; "
         "closing stdin at the end is the human leaving. The clock: the job in .agent/schedules.json "
         "is written with a creation time three minutes ago, so it is due at once.")

CODE = ('import csv\n\n\ndef column_sum(path, column):\n'
        '    with open(path, newline="") as f:\n'
        '        return sum(float(row[column]) for row in csv.DictReader(f))\n')
TEST = ('import time\n\nimport csv_sum\n\n'
        'time.sleep(2)  # a slow suite in miniature: time enough to work on something else\n'
        'open("t.csv", "w").write("a,b\\n1,2\\n3,4\\n")\n'
        'assert csv_sum.column_sum("t.csv", "b") == 6\nprint("ok: column_sum adds a column")\n')
README = "# csv_sum\n\n`column_sum(path, column)` adds up one column of a CSV file.\n\nTest: `python3 test_csv_sum.py`\n"
CHANGELOG = "# Changelog\n\n## 0.1\n\n- column_sum(path, column)\n"
STATUS = "csv_sum: 3 of 4 tasks completed; ready: #4 Tag release 0.1.\n"
HELPER = ("Write README.md for csv_sum.py (column_sum(path, column) adds up one column of a CSV "
          "file; the test is python3 test_csv_sum.py), then mark task #3 completed.")
JOB = "Check the task board and write a one-line status to STATUS.md."
TEST_RUN = "python3 test_csv_sum.py"
WORKSPACE = []  # SETUP's workspace: the scripted model's pace watches it


def SETUP(workspace):
    """.agent/schedules.json with one durable job ("* * * * *", made three minutes ago by
    an earlier session): check the task board and write a status line."""
    WORKSPACE[:] = [Path(workspace)]
    made = (datetime.datetime.now() - datetime.timedelta(minutes=3)).strftime("%Y-%m-%dT%H:%M")
    job = {"id": "s5ca1ab1e", "cron": "* * * * *", "prompt": JOB, "recurring": True,
           "created": made, "last_fired": None}
    (workspace / ".agent").mkdir()
    (workspace / ".agent" / "schedules.json").write_text(json.dumps({"jobs": [job]}, indent=1))
    MAIN[:], SCHEDULED[:], HELPER_STEPS[:] = MAIN_STEPS, SCHEDULED_STEPS, HELPER_REPLIES


def SETUP_HOME(home):
    """~/.agent/config.yaml, the human's own settings, allowing `bash(python3 test_csv_sum.py)`:
    the background run needs no question where no OS sandbox allows it either."""
    (home / ".agent").mkdir()
    (home / ".agent" / "config.yaml").write_text(f"permissions:\n  allow: ['bash({TEST_RUN})']\n")


# --- what the scripted model reads from a request ---

def blocks(message):
    content = message["content"]
    return [{"type": "text", "text": content}] if isinstance(content, str) else content


def results(body):
    """The tool results of the newest message, as text."""
    return [str(b["content"]) for b in blocks(body["messages"][-1]) if b.get("type") == "tool_result"]


def news(body):
    """The <task-notification> blocks of the newest message."""
    return [b["text"] for b in blocks(body["messages"][-1])
            if b.get("type") == "text" and b["text"].startswith("<task-notification>")]


def demo_says(what):
    return reply(f"(demo: {what})")


def runtime(kind):
    """The status records of .agent/runtime-tasks/ of one kind (b: commands, a: agents)."""
    folder = WORKSPACE[-1] / ".agent" / "runtime-tasks"
    return [json.loads(p.read_text()) for p in folder.glob(f"{kind}*.json")] if folder.exists() else []


# --- the main agent's turn: the typed prompt ---

def plan(body):
    return reply(text("Four tasks; the test and the README need the code, the release needs both."),
                 tool("task_create", {"subject": "Write csv_sum.py", "description": "column_sum(path, column)"}),
                 tool("task_create", {"subject": "Test csv_sum.py", "blocked_by": ["1"]}),
                 tool("task_create", {"subject": "Write the README", "blocked_by": ["1"]}),
                 tool("task_create", {"subject": "Tag release 0.1", "blocked_by": ["2", "3"]}))


def first_list(body):
    return reply(tool("task_list", {}))


def start_code(body):
    board = results(body)[0].splitlines() if results(body) else []
    if board[:2] != ["1 ready, 3 blocked", "#1 [ready] Write csv_sum.py"]:
        return demo_says(f"expected the ready task first, got {board[:2]}")
    return reply(text("#1 is the only ready task; starting it."),
                 tool("task_update", {"id": "1", "status": "in_progress"}),
                 tool("write_file", {"path": "csv_sum.py", "content": CODE}))


def complete_code(body):
    return reply(tool("task_update", {"id": "1", "status": "completed"}))


def start_test(body):
    done = results(body)[0] if results(body) else ""
    if "Now ready: #2 Test csv_sum.py, #3 Write the README." not in done:
        return demo_says(f"expected #2 and #3 to be unblocked, got {done!r}")
    return reply(tool("task_update", {"id": "2", "status": "in_progress"}),
                 tool("write_file", {"path": "test_csv_sum.py", "content": TEST}),
                 tool("background_run", {"command": TEST_RUN}))


def second_list(body):
    out = results(body)[-1] if results(body) else ""
    if not out.startswith("Started b") or news(body):
        return demo_says(f"expected background_run to return at once, got {out[:80]!r}")
    return reply(text("The test runs in the background. The board now:"), tool("task_list", {}))


MIXED = ["1 ready, 1 in progress, 1 blocked, 1 completed", "#3 [ready] Write the README",
         "#2 [in_progress] Test csv_sum.py", "#4 [blocked by #2, #3] Tag release 0.1",
         "#1 [completed] Write csv_sum.py"]


def hand_off(body):
    board = results(body)[0].splitlines() if results(body) else []
    if board != MIXED:
        return demo_says(f"expected the board in task_list's order {MIXED}, got {board}")
    return reply(text("#3 goes to a helper in the background."),
                 tool("agent", {"description": "write the README", "prompt": HELPER,
                                "run_in_background": True}))


def meanwhile(body):
    """Both started; no news yet. Then the scripted model takes its time, until the
    test run and the helper have ended (a hang guard of 60 s)."""
    out = results(body)[0] if results(body) else ""
    if not out.startswith("Started a") or news(body):
        return demo_says(f"expected the helper to start at once, with no news yet, got {out[:80]!r}")
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not (
            any(r["status"] != "running" for r in runtime("b")) and any(r["status"] != "running" for r in runtime("a"))):
        time.sleep(0.05)
    return reply(text("Meanwhile, the changelog."),
                 tool("write_file", {"path": "CHANGELOG.md", "content": CHANGELOG}))


def notified(body):
    """Both notifications, after the write's result: the test passed, the helper reported."""
    got = news(body)
    kinds = [b.get("type") for b in blocks(body["messages"][-1])]
    if len(got) != 2 or kinds != ["tool_result", "text", "text"]:
        return demo_says(f"expected two <task-notification> blocks after the tool result, got {kinds}")
    test = next((n for n in got if "<exit-code>" in n), "")
    helper = next((n for n in got if "<exit-code>" not in n), "")
    if "<status>completed</status>" not in test or "ok: column_sum adds a column" not in test:
        return demo_says(f"expected a passing test run in a notification, got {test[:300]!r}")
    if "<status>completed</status>" not in helper or "README.md" not in helper:
        return demo_says(f"expected the helper's report in a notification, got {helper[:300]!r}")
    return reply(text("The test passed (exit 0) and the helper wrote README.md and completed #3. "
                      "Completing #2."), tool("task_update", {"id": "2", "status": "completed"}))


def answer(body):
    done = results(body)[0] if results(body) else ""
    if "Now ready: #4 Tag release 0.1." not in done:
        return demo_says(f"expected #4 to be ready now, got {done!r}")
    log = next((line for m in body["messages"] for b in blocks(m) if b.get("type") == "text"
                for line in b["text"].splitlines() if line.startswith("<output-file>.agent/runtime-tasks/b")), "")
    return reply(f"Done: csv_sum.py, its test, the README (by the helper) and the changelog; #1-#3 "
                 f"completed, #4 is ready to tag. The test's output is in "
                 f"{log.removeprefix('<output-file>').removesuffix('</output-file>')}.")


# --- the background subagent's part ---

def helper_writes(body):
    return reply(tool("write_file", {"path": "README.md", "content": README}),
                 tool("task_update", {"id": "3", "status": "completed"}))


def helper_reports(body):
    out = results(body)
    if len(out) != 2 or not out[1].startswith("Updated task #3 [completed]"):
        return demo_says(f"the helper's steps failed: {out}")
    return reply("README.md is written and task #3 is completed.")


# --- the scheduled turn: the REPL was idle and the job was due ---

def scheduled_starts(body):
    prompt = "\n".join(b.get("text", "") for b in blocks(body["messages"][-1]))
    if not re.match(r"<scheduled-prompt id=s5ca1ab1e>\n" + re.escape(JOB), prompt):
        return demo_says(f"expected the job's <scheduled-prompt>, got {prompt[:200]!r}")
    return reply(tool("task_list", {}))


def scheduled_writes(body):
    board = results(body)[0].splitlines() if results(body) else []
    if board[:2] != ["1 ready, 3 completed", "#4 [ready] Tag release 0.1"]:
        return demo_says(f"expected #4 ready above the three completed, got {board[:2]}")
    return reply(tool("write_file", {"path": "STATUS.md", "content": STATUS}))


MAIN_STEPS = [plan, first_list, start_code, complete_code, start_test, second_list, hand_off,
              meanwhile, notified, answer]
SCHEDULED_STEPS = [scheduled_starts, scheduled_writes,
                   lambda body: reply("STATUS.md: " + STATUS.strip())]
HELPER_REPLIES = [helper_writes, helper_reports]
MAIN, SCHEDULED, HELPER_STEPS = [], [], []   # what is still to come of each part (SETUP fills them)


def SENDER(body):
    """The main loop, or the background subagent (its task is the helper's prompt)."""
    first = json.dumps(body["messages"][0]["content"]) if body.get("messages") else ""
    return "background agent" if "Write README.md for csv_sum.py" in first else "main loop"


def turn_prompt(body):
    """The user message the current turn started from: the typed prompt or a scheduled one."""
    for m in reversed(body["messages"]):
        texts = [b["text"] for b in blocks(m) if b.get("type") == "text"] if m["role"] == "user" else []
        if m["role"] == "user" and not any(b.get("type") == "tool_result" for b in blocks(m)):
            return "\n".join(texts)
    return ""


def route(body):
    """Each request gets the next reply of its part: the helper's, the scheduled turn's,
    or the typed prompt's turn."""
    if SENDER(body) == "background agent":
        part = HELPER_STEPS
    else:
        part = SCHEDULED if "<scheduled-prompt" in turn_prompt(body) else MAIN
    return part.pop(0)(body) if part else demo_says("a part of the script was asked once too often")


STEPS = [route] * (len(MAIN_STEPS) + len(SCHEDULED_STEPS) + len(HELPER_REPLIES))
RUNS = [{"title": "the REPL, idle between turns", "prompt": None, "input": f"y\n{PROMPT}\n",
         "hold": True, "steps": STEPS}]
FULL_RESULTS = ("task_list",)


def CHECK(workspace, stdout, runs):
    """csv_sum.py, its test, README.md (by the helper), CHANGELOG.md and STATUS.md (by the
    scheduled turn) written; .agent/tasks holds #1-#3 completed and #4 pending with no edge
    left; .agent/runtime-tasks holds one test run (completed, exit 0, its log ending with
    the ok line) and one background agent (completed); the job fired once, after the first
    turn's answer (the REPL was idle), and .agent/schedules.json records that run."""
    for name, content in (("csv_sum.py", CODE), ("test_csv_sum.py", TEST), ("README.md", README),
                          ("CHANGELOG.md", CHANGELOG), ("STATUS.md", STATUS)):
        assert (workspace / name).read_text() == content, f"{name} is not as written"
    tasks = {p.stem: json.loads(p.read_text()) for p in (workspace / ".agent" / "tasks").glob("*.json")}
    assert sorted(tasks) == ["1", "2", "3", "4"], f"unexpected task files: {sorted(tasks)}"
    assert [tasks[i]["status"] for i in "1234"] == ["completed"] * 3 + ["pending"]
    assert all(not t["blocked_by"] and not t["blocks"] for t in tasks.values()), "edges left over"
    (test_run,), (helper,) = runtime("b"), runtime("a")
    assert (test_run["status"], test_run["exit_code"]) == ("completed", 0), f"the run: {test_run['status']}"
    assert (workspace / test_run["log"]).read_text().endswith("ok: column_sum adds a column\n")
    assert helper["status"] == "completed", f"the helper: {helper['status']}"
    (job,) = json.loads((workspace / ".agent" / "schedules.json").read_text())["jobs"]
    assert job["last_fired"], "schedules.json does not record the job's run"
    seen = runs[0]["transcript"]
    fired = [m.start() for m in re.finditer(r"\[schedule s5ca1ab1e fired \(\* \* \* \* \*\)", seen)]
    assert len(fired) == 1, f"the job fired {len(fired)} time(s)"
    assert seen.index("Done: csv_sum.py") < fired[0], "the job fired before the first turn ended"
    assert f"The test's output is in {test_run['log']}." in stdout, "no final answer naming the log"
