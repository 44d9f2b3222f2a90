"""s02 demo: parallel reads and searches, then an edit guarded by read-before-edit."""
from fake_api import reply, text, tool


def SETUP(ws):
    (ws / "app.py").write_text("def greet(name):\n    # TODO: say hello properly\n"
                               "    return 'hi ' + name\n")
    (ws / "util.py").write_text("# TODO: add helpers\n")
    (ws / ".gitignore").write_text("build/\n")
    (ws / "build").mkdir()
    (ws / "build" / "old.py").write_text("# TODO: ignored by .gitignore\n")


PROMPT = "find the TODOs and fix the one in app.py"

STEPS = [
    reply(text("Searching and listing in parallel."),
          tool("grep", {"pattern": "TODO", "output_mode": "content"}),
          tool("glob", {"pattern": "**/*.py"}),
          tool("read_file", {"path": "app.py"})),
    reply(text("Editing app.py."),
          tool("edit_file", {"path": "app.py", "old_string": "    # TODO: say hello properly\n"
                             "    return 'hi ' + name",
                             "new_string": "    return f'Hello, {name}!'"})),
    reply(text("An attempt outside the workspace is refused:"),
          tool("read_file", {"path": "/etc/passwd"})),
    reply(text("Done: `greet` now returns `Hello, <name>!`. The other TODO is in util.py; "
               "build/old.py was skipped because .gitignore excludes build/.")),
]
