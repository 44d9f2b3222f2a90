"""s02 demo: parallel reads and searches, then an edit guarded by read-before-edit.

Watch stderr: the first reply asks for grep, glob and read_file at once; all
three are concurrency-safe, so they run in parallel (their previews may come
back in any order, their results go back in call order). The edit is allowed
because app.py was read first and has not changed since. The read of
/etc/passwd is refused by the path sandbox: only paths inside the workspace
work. grep skips build/, which .gitignore excludes.
"""
from fake_api import reply, text, tool


def SETUP(ws):
    """app.py and util.py with a TODO each, and build/old.py, which .gitignore excludes."""
    (ws / "app.py").write_text("def greet(name):\n    # TODO: say hello properly\n"
                               "    return 'hi ' + name\n")
    (ws / "util.py").write_text("# TODO: add helpers\n")
    (ws / ".gitignore").write_text("build/\n")
    (ws / "build").mkdir()
    (ws / "build" / "old.py").write_text("# TODO: ignored by .gitignore\n")


PROMPT = "find the TODOs and fix the one in app.py"


def after_refusal(body):
    """The read outside the workspace must come back as an error, not the file."""
    result = body["messages"][-1]["content"][0]
    if not (result.get("is_error") and "outside the workspace" in str(result["content"])):
        return reply("(demo: expected the sandbox to refuse /etc/passwd)")
    return reply(text("Done: `greet` now returns `Hello, <name>!`. The other TODO is in util.py; "
                      "build/old.py was skipped because .gitignore excludes build/."))


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
    after_refusal,
]


def CHECK(workspace, stdout):
    """app.py's TODO is fixed, util.py and build/old.py are untouched, the answer says so."""
    assert (workspace / "app.py").read_text() == ("def greet(name):\n    return f'Hello, {name}!'\n"), \
        "app.py was not edited as asked"
    assert (workspace / "util.py").read_text() == "# TODO: add helpers\n", "util.py changed"
    assert "TODO" in (workspace / "build" / "old.py").read_text(), "build/old.py changed"
    assert "Hello, <name>!" in stdout, "the answer does not describe the fix"
