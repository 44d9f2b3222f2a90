"""Checks for exercises/s02.md. Each point: (what must hold, a hint, fn(x))."""
import contextlib
import io
import itertools
import os
import re

from fake_api import reply, tool


def turn(x, steps, prompt="do the work"):
    """One scripted turn with the agent's output captured; returns the tool results."""
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        history = x.turn(steps, prompt)
    return x.tool_results(history)


def one(x, name, args, prompt="do the work"):
    """The tool_result of a single call."""
    results = turn(x, [reply(tool(name, args))], prompt)
    assert len(results) == 1, f"{len(results)} results for one call"
    return results[0]


def crashed(result, name):
    """run_tool's words for a handler that raised something other than ToolError."""
    return f"{name} failed:" in str(result.get("content"))


# s02.1: list_dir ------------------------------------------------------------
def schema(x, name):
    tools = {t["name"]: t for t in x.bodies()[0]["tools"]}
    assert name in tools, f"the model is not offered a {name} tool (it has: {', '.join(tools)})"
    return tools[name]["input_schema"]


def list_offered(x):
    (x.ws / "a.txt").write_text("a\n")
    batches, real = [], x.mod.run_parallel

    def spy(batch, results):
        if batch:
            batches.append([b.name for b in batch])
        return real(batch, results)
    x.patch(x.mod, "run_parallel", spy)
    results = turn(x, [reply(tool("list_dir", {"path": "."}), tool("list_dir", {}))])
    props = schema(x, "list_dir").get("properties", {})
    assert props.get("path", {}).get("type") == "string", f"list_dir's schema has no string field 'path': {props}"
    assert "path" not in schema(x, "list_dir").get("required", []), "path must be optional (default: the workspace)"
    assert not any(r.get("is_error") for r in results), f"list_dir failed: {results[0]['content'][:200]}"
    assert ["list_dir", "list_dir"] in batches, ("two list_dir calls in one reply did not run together, "
                                                 "as one parallel batch: register it concurrency-safe")


def list_lists(x):
    for d in ("src", "zeta"):
        (x.ws / d).mkdir()
    (x.ws / "src" / "deep.py").write_text("x = 1\n")
    (x.ws / "b.txt").write_text("b\n")
    (x.ws / "a.py").write_text("a\n")
    result = one(x, "list_dir", {"path": "."})
    assert not result.get("is_error"), f"list_dir . failed: {result['content'][:200]}"
    firsts = [ln.split()[0] for ln in result["content"].splitlines() if ln.split()]
    want = ["a.py", "b.txt", "src/", "zeta/"]
    found = [w for w in firsts if w in want]
    assert sorted(found) == want, f"entries found: {found}; want {want} (folders end in '/')"
    assert found == want, f"entries come in the order {found}, not sorted by name"
    assert "deep.py" not in result["content"], "list_dir lists one folder, not the folders inside it"


def list_sandboxed(x):
    os.symlink("/etc", x.ws / "link")
    for path in ("/etc", "..", "link", "~"):
        x.api.reset()
        result = one(x, "list_dir", {"path": path})
        schema(x, "list_dir")
        assert result.get("is_error"), f"list_dir {path!r} was not refused: {result['content'][:120]!r}"
        assert "passwd" not in result["content"] and not crashed(result, "list_dir"), \
            f"list_dir {path!r}: {result['content'][:160]!r}"


def list_not_folder(x):
    (x.ws / "a.py").write_text("a\n")
    for path in ("a.py", "missing"):
        x.api.reset()
        result = one(x, "list_dir", {"path": path})
        schema(x, "list_dir")
        assert result.get("is_error"), f"list_dir {path!r} was no error: {result['content'][:120]!r}"
        assert not crashed(result, "list_dir"), (f"list_dir {path!r} crashed instead of raising a ToolError "
                                                 f"that says what to do: {result['content'][:160]!r}")


def list_bounded(x):
    many = x.ws / "many"
    many.mkdir()
    names = ["f" + "".join(p) for p in itertools.islice(itertools.product("abcdefghij", repeat=3), 300)]
    for name in names:
        (many / name).write_text("")
    result = one(x, "list_dir", {"path": "many"})
    shown = [ln for ln in result["content"].splitlines() if ln.split() and ln.split()[0] in names]
    assert 0 < len(shown) <= 200, f"{len(shown)} of 300 entries shown; at most 200"
    assert str(300 - len(shown)) in result["content"], \
        f"the result does not say how many entries ({300 - len(shown)}) were left out"


# s02.2: multi_edit ----------------------------------------------------------
APP = "alpha = 1\nbeta = 2\ngamma = 3\n"


def app(x):
    (x.ws / "app.py").write_text(APP)
    return x.ws / "app.py"


def read_then(*calls):
    return [reply(tool("read_file", {"path": "app.py"}))] + [reply(c) for c in calls]


def edits(*pairs):
    return {"path": "app.py", "edits": [{"old_string": o, "new_string": n} for o, n in pairs]}


def multi_offered(x):
    app(x)
    results = turn(x, read_then(tool("multi_edit", edits(("alpha = 1", "alpha = 10")))))
    props = schema(x, "multi_edit").get("properties", {})
    assert props.get("path", {}).get("type") == "string", "multi_edit's schema has no string field 'path'"
    items = props.get("edits", {})
    assert items.get("type") == "array", f"multi_edit's 'edits' is not an array: {items}"
    fields = items.get("items", {}).get("properties", {})
    assert {"old_string", "new_string"} <= set(fields), f"an edit's schema has fields {sorted(fields)}"
    assert not results[-1].get("is_error"), f"multi_edit failed: {results[-1]['content'][:200]}"


def multi_in_order(x):
    f = app(x)
    results = turn(x, read_then(tool("multi_edit", edits(
        ("alpha = 1", "alpha = 10"), ("alpha = 10", "alpha = 100"), ("beta = 2", "beta = 20")))))
    assert not results[-1].get("is_error"), f"multi_edit failed: {results[-1]['content'][:200]}"
    assert f.read_text() == "alpha = 100\nbeta = 20\ngamma = 3\n", \
        f"app.py is now {f.read_text()!r}: each edit applies to the text the one before left"


def names_edit_2(text):
    """The second edit, as the page asks (edit 2) or as people and programs name it:
    Edit #2, edit no. 2, the second edit, 2nd edit, edits[1] (the input's index)."""
    return bool(re.search(r"\bedit\s*(#|no\.?\s*|number\s*)?2\b|\b(second|2nd)\s+edit\b|\bedits\[1\]",
                          text, re.I))


def multi_all_or_nothing(x):
    f = app(x)
    for bad in (("no such text", "x"), ("= ", "== ")):    # missing, then ambiguous
        x.api.reset()
        results = turn(x, read_then(tool("multi_edit", edits(("alpha = 1", "alpha = 10"), bad))))
        result = results[-1]
        assert result.get("is_error"), f"a failing second edit ({bad[0]!r}) was no error"
        assert f.read_text() == APP, f"app.py changed although edit 2 failed: {f.read_text()!r}"
        assert names_edit_2(result["content"]), f"the error does not name edit 2: {result['content'][:200]!r}"


def multi_needs_read(x):
    f = app(x)
    result = one(x, "multi_edit", edits(("alpha = 1", "alpha = 10")))
    schema(x, "multi_edit")
    assert result.get("is_error") and f.read_text() == APP, "a file never read was edited"
    x.api.reset()

    def changed_meanwhile(body):
        f.write_text(APP + "delta = 4\n")
        return reply(tool("multi_edit", edits(("alpha = 1", "alpha = 10"))))
    results = turn(x, [reply(tool("read_file", {"path": "app.py"})), changed_meanwhile])
    assert results[-1].get("is_error"), "a file changed on disk since it was read was edited"
    assert f.read_text() == APP + "delta = 4\n", "the file changed since the read was overwritten"


def multi_counts_as_read(x):
    f = app(x)
    results = turn(x, read_then(tool("multi_edit", edits(("alpha = 1", "alpha = 10"))),
                                tool("edit_file", {"path": "app.py", "old_string": "gamma = 3",
                                                   "new_string": "gamma = 30"})))
    assert not results[1].get("is_error"), f"multi_edit failed: {results[1]['content'][:200]}"
    assert not results[2].get("is_error"), (f"edit_file right after multi_edit was refused: "
                                            f"{results[2]['content'][:200]}")
    assert f.read_text() == "alpha = 10\nbeta = 2\ngamma = 30\n", f"app.py is {f.read_text()!r}"


EXERCISES = {
    1: ("a list_dir tool", [
        ("list_dir is offered with a schema (optional string 'path') and runs beside other safe calls",
         "Compare your register() call with glob's: params([], path=...), and which flags it sets, and why.",
         list_offered),
        ("it lists one folder: entries sorted by name, folders ending in '/', nothing deeper",
         "sorted(folder.iterdir()) gives the entries; p.is_dir() says which get the '/'.",
         list_lists),
        ("paths outside the workspace are refused: /etc, .., ~ and a symlink that points out",
         "What does read_file's handler do with its path before it opens anything?",
         list_sandboxed),
        ("a file or a missing path gets a ToolError saying what to do, not a crash",
         "Anything but a ToolError reads as a crash (list_dir failed: ...). How does read_file refuse a folder?",
         list_not_folder),
        ("a huge folder shows at most 200 entries and says how many it left out",
         "Keep the first LIST_LIMIT entries and add a line with the number left out, as glob_files() does.",
         list_bounded),
    ]),
    2: ("a multi_edit tool: several edits, all or nothing", [
        ("multi_edit is offered with a schema: path, and edits as an array of {old_string, new_string}",
         "Write the schema as a dict, as s03's todo_write does for its items (params() only makes flat ones).",
         multi_offered),
        ("the edits apply in order, each to the text the one before left",
         "Edit 2 must match the text edit 1 left: what text do you match it against?",
         multi_in_order),
        ("if any edit fails (not found, or not unique) the file is unchanged and the error names that edit",
         "When edit 2 fails, what has already reached the disk? The error says 'edit N: ...'.",
         multi_all_or_nothing),
        ("the read-before-edit rule holds: a file never read, or changed since, is refused",
         "What does edit_file check before it changes anything?",
         multi_needs_read),
        ("after multi_edit the file counts as read: edit_file right after it works",
         "What does edit_file record after it writes, and who reads it?",
         multi_counts_as_read),
    ]),
}
