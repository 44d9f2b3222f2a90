"""s10 demo: work planned as a task graph on disk, done in dependency order.

Watch stderr and .agent/tasks/ (with --keep):
  1. The model creates three tasks: the code, and a test and a README that
     are blocked by it. Each is a JSON file; #1's blocks and the others'
     blocked_by say the same edges from both ends.
  2. task_list puts the ready task first (pending, no owner, nothing blocking).
  3. The model starts #1, writes the code and completes #1: the result says
     "Now ready: #2 ..., #3 ...", because completing a task takes it out of its
     dependents' blocked_by.
  4. It does #2 the same way and leaves #3 on the board: a later session, a
     subagent or another process sees it there as ready.
"""
import json

from fake_api import reply, text, tool

PROMPT = "Plan a csv_sum module as tasks (code, test, README), then do the code and the test."
ENV = {"AGENT_PERMISSION_MODE": "acceptEdits",   # writing the files needs no question
       "AGENT_AUTO_MEMORY": "0"}                 # no memory side calls (s09 shows those)

CODE = ('import csv\n\n\ndef column_sum(path, column):\n'
        '    with open(path, newline="") as f:\n'
        '        return sum(float(row[column]) for row in csv.DictReader(f))\n')
TEST = ('import csv_sum\n\nopen("t.csv", "w").write("a,b\\n1,2\\n3,4\\n")\n'
        'assert csv_sum.column_sum("t.csv", "b") == 6\nprint("ok")\n')


def results(body):
    """The tool results of the newest message, as text."""
    return [b["content"] for b in body["messages"][-1]["content"]
            if isinstance(b, dict) and b.get("type") == "tool_result"]


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


STEPS = [
    reply(text("Three tasks; the test and the README need the code first."),
          tool("task_create", {"subject": "Write csv_sum.py", "description": "column_sum(path, column)"}),
          tool("task_create", {"subject": "Test csv_sum.py", "blocked_by": ["1"]}),
          tool("task_create", {"subject": "Write the README", "blocked_by": ["1"]})),
    reply(tool("task_list", {})),
    after_list,
    reply(tool("task_update", {"id": "1", "status": "completed"})),
    after_complete,
    reply(tool("task_update", {"id": "2", "status": "completed"}), tool("task_list", {})),
    reply("Done: csv_sum.py and its test (#1, #2). The README (#3) is ready on the task board."),
]


def CHECK(workspace, stdout):
    """csv_sum.py and test_csv_sum.py written; .agent/tasks holds three task files: #1 and #2
    completed with no edges left, #3 pending and no longer blocked."""
    assert (workspace / "csv_sum.py").read_text() == CODE, "csv_sum.py is not as written"
    assert (workspace / "test_csv_sum.py").read_text() == TEST, "the test is not as written"
    tasks = {p.stem: json.loads(p.read_text()) for p in (workspace / ".agent" / "tasks").glob("*.json")}
    assert sorted(tasks) == ["1", "2", "3"], f"unexpected task files: {sorted(tasks)}"
    assert [tasks[i]["status"] for i in "123"] == ["completed", "completed", "pending"]
    assert all(not t["blocked_by"] and not t["blocks"] for t in tasks.values()), "edges left over"
    assert "README (#3) is ready" in stdout, "no final answer"
