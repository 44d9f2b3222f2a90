"""s03 demo: a three-step plan, written first and ticked off as the work goes.

Watch stderr: every todo_write prints the checklist ([x] done, [>] current,
[ ] next). Steps 4-6 run three tool rounds without touching the plan, so the
loop appends a <system-reminder> after the tool results of round 6; the
scripted model answers it in round 7 by updating the plan.
"""
import subprocess
import sys

from fake_api import reply, text, tool

PROMPT = "Create a tiny greeting module with a test and a README."

MODULE = 'def greet(name):\n    return f"Hello, {name}!"\n'
TEST = ('from greet import greet\n\nassert greet("Ada") == "Hello, Ada!"\n'
        'print("1 test passed")\n')
README = "# greet\n\n`greet(name)` returns a friendly greeting.\n\nTest: `python3 test_greet.py`\n"


def plan(done, current=None):
    """The three-step plan with `done` steps completed and the next one in progress."""
    steps = [("Write greet.py", "Writing greet.py"),
             ("Add and run a test", "Adding and running a test"),
             ("Write the README", "Writing the README")]
    items = []
    for n, (content, form) in enumerate(steps):
        status = "completed" if n < done else "in_progress" if n == done else "pending"
        items.append({"content": content, "status": status, "active_form": form})
    return tool("todo_write", {"items": items})


def after_reminder(body):
    """Round 7: the plan reminder must sit after the tool results; answer it."""
    last = body["messages"][-1]["content"]
    nudged = any(b.get("type") == "text" and "<system-reminder>" in b["text"] for b in last)
    if not nudged:
        return reply("(demo: expected a plan reminder in this request, none came)")
    return reply(text("The test passes; updating the plan."), plan(2))


STEPS = [
    reply(text("Three steps, so I'll plan them first."), plan(0)),              # 1
    reply(tool("write_file", {"path": "greet.py", "content": MODULE})),         # 2
    reply(plan(1)),                                                              # 3
    reply(tool("write_file", {"path": "test_greet.py", "content": TEST})),      # 4
    reply(tool("bash", {"command": "python3 test_greet.py"})),                  # 5
    reply(tool("read_file", {"path": "greet.py"})),                             # 6
    after_reminder,                                                              # 7
    reply(tool("write_file", {"path": "README.md", "content": README})),        # 8
    reply(plan(3)),                                                              # 9
    reply("Done: greet.py, test_greet.py (passing) and README.md."),             # 10
]


def CHECK(workspace, stdout):
    """greet.py, test_greet.py and README.md are on disk as written, and the test passes."""
    for name, content in (("greet.py", MODULE), ("test_greet.py", TEST), ("README.md", README)):
        assert (workspace / name).read_text() == content, f"{name} is not as written"
    run = subprocess.run([sys.executable, "test_greet.py"], cwd=workspace, capture_output=True,
                         text=True, timeout=30)
    assert run.returncode == 0 and "1 test passed" in run.stdout, "test_greet.py does not pass"
    assert "Done:" in stdout, "no final answer"
