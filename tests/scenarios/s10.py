"""s10 demo: work planned as a task graph on disk; a slow test run in the background.

Watch stderr and .agent/ (with --keep):
  1. The model creates three tasks: the code, and a test and a README that
     are blocked by it. Each is a JSON file in .agent/tasks/; #1's blocks and
     the others' blocked_by say the same edges from both ends.
  2. task_list puts the ready task first (pending, no owner, nothing blocking).
  3. The model starts #1, writes the code and completes #1: the result says
     "Now ready: #2 ..., #3 ...", because completing a task takes it out of its
     dependents' blocked_by.
  4. It writes the test (a slow one: about 2 s) and starts it with
     background_run. The call returns at once with an id; the test runs in its
     own process group, its output going to .agent/runtime-tasks/<id>.log.
  5. While it runs, the model takes #3 and writes the README: its next calls
     carry no news of the test yet.
  6. The run ends. Before the next model call, the loop drains it into a
     <task-notification> (status, exit code, the end of the output, the log's
     path), placed after that round's tool results ("[background: ...]" on
     stderr). The model reads it and completes #2 and #3.
"""
import json
import time
from pathlib import Path

from fake_api import reply, text, tool

PROMPT = ("Plan a csv_sum module as tasks (code, test, README) and do them. Run the test in "
          "the background and write the README meanwhile.")
ENV = {"AGENT_PERMISSION_MODE": "acceptEdits",   # writing the files needs no question
       "AGENT_AUTO_MEMORY": "0"}                 # no memory side calls (s09 shows those)
INPUT = "y\n"  # read only where the OS sandbox is unavailable: then background_run asks, as bash does
FAKED = ("The model's pace: before reply 8 the scripted model waits until the test run has ended "
         "(it watches .agent/runtime-tasks/), as a model writing a longer README would, so the run "
         "ends between two of its calls on every machine. The human: a y is piped to stdin, read "
         "only where the OS sandbox is unavailable and background_run asks first, as bash does.")

CODE = ('import csv\n\n\ndef column_sum(path, column):\n'
        '    with open(path, newline="") as f:\n'
        '        return sum(float(row[column]) for row in csv.DictReader(f))\n')
TEST = ('import time\n\nimport csv_sum\n\n'
        'time.sleep(2)  # a slow suite in miniature: time enough to work on something else\n'
        'open("t.csv", "w").write("a,b\\n1,2\\n3,4\\n")\n'
        'assert csv_sum.column_sum("t.csv", "b") == 6\nprint("ok: column_sum adds a column")\n')
README = "# csv_sum\n\n`column_sum(path, column)` adds up one column of a CSV file.\n\nTest: `python3 test_csv_sum.py`\n"
WORKSPACE = []  # SETUP's workspace: the scripted model's pace (reply 8) watches it


def SETUP(workspace):
    # The workspace starts empty; the scripted model only keeps its path (see meanwhile).
    WORKSPACE[:] = [Path(workspace)]


def results(body):
    """The tool results of the newest message, as text."""
    return [b["content"] for b in body["messages"][-1]["content"]
            if isinstance(b, dict) and b.get("type") == "tool_result"]


def news(body):
    """The <task-notification> blocks of the newest message."""
    content = body["messages"][-1]["content"]
    blocks = content if isinstance(content, list) else []
    return [b["text"] for b in blocks if b.get("type") == "text" and b["text"].startswith("<task-notification>")]


def after_list(body):
    """The board as task_list returned it: the ready task first, the blocked ones after."""
    board = results(body)[0].splitlines() if results(body) else []
    if board[:2] != ["1 ready, 2 blocked", "#1 [ready] Write csv_sum.py"]:
        return reply(f"(demo: expected the ready task first, got {board[:2]})")
    return reply(text("#1 is the only ready task; starting it."),
                 tool("task_update", {"id": "1", "status": "in_progress"}),
                 tool("write_file", {"path": "csv_sum.py", "content": CODE}))


def after_complete(body):
    """Completing #1 frees #2 and #3."""
    done = results(body)[0] if results(body) else ""
    if "Now ready: #2 Test csv_sum.py, #3 Write the README." not in done:
        return reply(f"(demo: expected #2 and #3 to be unblocked, got {done!r})")
    return reply(tool("task_update", {"id": "2", "status": "in_progress"}),
                 tool("write_file", {"path": "test_csv_sum.py", "content": TEST}))


def started(body):
    """background_run returned an id at once; the model moves on to the README."""
    out = results(body)[0] if results(body) else ""
    if not out.startswith("Started b") or news(body):
        return reply(f"(demo: expected background_run to return at once, got {out[:80]!r})")
    return reply(text("The test runs in the background; meanwhile I'll write the README (#3)."),
                 tool("task_update", {"id": "3", "status": "in_progress"}),
                 tool("write_file", {"path": "README.md", "content": README}))


def run_ended():
    """Has the background run's status file left "running"? (The scripted model's pace.)"""
    folder = WORKSPACE[-1] / ".agent" / "runtime-tasks"
    return any(json.loads(p.read_text())["status"] != "running" for p in folder.glob("b*.json"))


def meanwhile(body):
    """The README is written and the test is still running: no news yet. Then the
    scripted model takes its time, until the run has ended."""
    if news(body):
        return reply("(demo: the test run ended before the model's next call; this machine is very slow)")
    deadline = time.monotonic() + 60
    while WORKSPACE and not run_ended() and time.monotonic() < deadline:
        time.sleep(0.05)
    return reply(tool("task_update", {"id": "3", "status": "completed"}))


def notified(body):
    """The first request after the run's end carries its <task-notification>, after the result."""
    got = news(body)
    kinds = [b.get("type") for b in body["messages"][-1]["content"]]
    if len(got) != 1 or kinds != ["tool_result", "text"]:
        return reply(f"(demo: expected one <task-notification> after the tool result, got {kinds})")
    if "<status>completed</status>" not in got[0] or "ok: column_sum adds a column" not in got[0]:
        return reply(f"(demo: expected a passing run in the notification, got {got[0][:300]!r})")
    return reply(text("The background run passed (exit 0, \"ok: column_sum adds a column\"). "
                      "Completing #2."),
                 tool("task_update", {"id": "2", "status": "completed"}), tool("task_list", {}))


def answer(body):
    """The final answer names the log the notification pointed to."""
    log = next((line for m in body["messages"] if isinstance(m["content"], list) for b in m["content"]
                if b.get("type") == "text" for line in b["text"].splitlines()
                if line.startswith("<output-file>")), "")
    return reply(f"Done: csv_sum.py, its test and the README (#1-#3 completed). The test passed in "
                 f"the background while I wrote the README; its output is in "
                 f"{log.removeprefix('<output-file>').removesuffix('</output-file>')}.")


STEPS = [
    reply(text("Three tasks; the test and the README need the code first."),
          tool("task_create", {"subject": "Write csv_sum.py", "description": "column_sum(path, column)"}),
          tool("task_create", {"subject": "Test csv_sum.py", "blocked_by": ["1"]}),
          tool("task_create", {"subject": "Write the README", "blocked_by": ["1"]})),
    reply(tool("task_list", {})),
    after_list,
    reply(tool("task_update", {"id": "1", "status": "completed"})),
    after_complete,
    reply(tool("background_run", {"command": "python3 test_csv_sum.py"})),
    started,
    meanwhile,
    notified,
    answer,
]


def CHECK(workspace, stdout):
    """csv_sum.py, its test and README.md written; .agent/tasks holds three completed tasks
    with no edges left; .agent/runtime-tasks holds one background run, completed with exit 0,
    whose log ends with the test's ok line."""
    assert (workspace / "csv_sum.py").read_text() == CODE, "csv_sum.py is not as written"
    assert (workspace / "test_csv_sum.py").read_text() == TEST, "the test is not as written"
    assert (workspace / "README.md").read_text() == README, "the README is not as written"
    tasks = {p.stem: json.loads(p.read_text()) for p in (workspace / ".agent" / "tasks").glob("*.json")}
    assert sorted(tasks) == ["1", "2", "3"], f"unexpected task files: {sorted(tasks)}"
    assert [tasks[i]["status"] for i in "123"] == ["completed"] * 3
    assert all(not t["blocked_by"] and not t["blocks"] for t in tasks.values()), "edges left over"
    runs = [json.loads(p.read_text()) for p in (workspace / ".agent" / "runtime-tasks").glob("b*.json")]
    assert len(runs) == 1, f"expected one background run, found {len(runs)}"
    assert (runs[0]["status"], runs[0]["exit_code"]) == ("completed", 0), f"the run: {runs[0]['status']}"
    assert (workspace / runs[0]["log"]).read_text().endswith("ok: column_sum adds a column\n")
    assert f"its output is in {runs[0]['log']}." in stdout, "no final answer naming the log"
