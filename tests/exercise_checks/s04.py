"""Checks for exercises/s04.md. Each point: (what must hold, a hint, fn(x))."""
import contextlib
import io
import json
import re

from fake_api import reply, tool


def turn(x, steps, prompt="do the work", finish="Finished."):
    """One scripted turn, output captured: (history, stderr)."""
    err = io.StringIO()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
        history = x.turn(steps, prompt, finish)
    return history, err.getvalue()


def agent_result(x, history):
    """The tool_result of the (first) agent call."""
    ids = [b["id"] for m in history if m["role"] == "assistant" for b in m["content"]
           if b.get("type") == "tool_use" and b["name"] == "agent"]
    assert ids, "the agent tool was never called"
    return next(r for r in x.tool_results(history) if r["tool_use_id"] == ids[0])


def files(x):
    (x.ws / "app.py").write_text("x = 1\ny = 1\n")
    (x.ws / "readme.md").write_text("hello\n")


def delegate(**extra):
    return reply(tool("agent", {"prompt": "fix app.py and leave a note", "description": "fixer", **extra}))


def call(name, **args):
    return reply(tool(name, args))


READ_APP = call("read_file", path="app.py")


# s04.1: the report names the files the child changed ---------------------------
def names_changed(x):
    files(x)
    history, _ = turn(x, [delegate(), READ_APP, call("edit_file", path="app.py", old_string="x = 1", new_string="x = 2"),
                          call("write_file", path="notes/new.txt", content="a note\n"), reply("Fixed it.")])
    result = agent_result(x, history)
    assert not result.get("is_error"), f"the subagent failed: {result['content'][:200]}"
    for path in ("app.py", "notes/new.txt"):
        assert path in result["content"], f"the report does not name {path}: {result['content'][:300]!r}"
    assert str(x.ws) not in result["content"], "name the files relative to the workspace, as the tools do"


def not_named_when_unchanged(x):
    files(x)
    history, _ = turn(x, [delegate(), call("read_file", path="readme.md"),
                          call("edit_file", path="readme.md", old_string="no such text", new_string="x"),
                          call("read_file", path="app.py"), reply("Nothing needed changing.")])
    result = agent_result(x, history)
    for path in ("readme.md", "app.py"):
        assert path not in result["content"], (f"the report names {path}, which the child only read "
                                                f"(or failed to edit): {result['content'][:300]!r}")


def named_when_stopped(x):
    files(x)
    (x.ws / ".agent" / "agents").mkdir(parents=True)
    (x.ws / ".agent" / "agents" / "short.md").write_text(
        "---\nname: short\ndescription: A helper with two turns.\nmax_turns: 2\n---\nYou are short.\n")
    history, _ = turn(x, [delegate(agent_type="short"), READ_APP,
                          call("edit_file", path="app.py", old_string="x = 1", new_string="x = 2")])
    result = agent_result(x, history)
    assert result.get("is_error"), f"a child past its max_turns did not fail: {result['content'][:200]}"
    assert "app.py" in result["content"], (f"a child stopped early changed app.py, and the parent is "
                                           f"not told: {result['content'][:300]!r}")


def each_once(x):
    files(x)
    history, _ = turn(x, [delegate(), READ_APP,
                          call("edit_file", path="app.py", old_string="x = 1", new_string="x = 2"),
                          call("edit_file", path="./app.py", old_string="y = 1", new_string="y = 2"),
                          reply("Fixed it.")])
    content = agent_result(x, history)["content"]
    assert content.count("app.py") == 1, f"app.py is named {content.count('app.py')} times: {content[:300]!r}"


def fork_own_changes_only(x):
    files(x)
    history, _ = turn(x, [READ_APP, call("edit_file", path="app.py", old_string="x = 1", new_string="x = 2"),
                          reply(tool("agent", {"prompt": "leave a note", "fork": True})),
                          call("write_file", path="notes/new.txt", content="a note\n"), reply("Scope: wrote the note.")])
    content = agent_result(x, history)["content"]
    assert "notes/new.txt" in content, f"the fork's report does not name notes/new.txt: {content[:300]!r}"
    assert "app.py" not in content, ("the fork's report names app.py, which the parent changed before the "
                                     "fork: only the child's own calls count")


# s04.2: a token budget per agent type -------------------------------------------
USAGE = {"input_tokens": 1_000, "output_tokens": 100}
CHEAP = "---\nname: cheap\ndescription: A cheap helper for small chores.\n{extra}---\nYou are cheap.\n"


def define(x, extra="token_budget: 2500\n"):
    (x.ws / ".agent" / "agents").mkdir(parents=True, exist_ok=True)
    (x.ws / ".agent" / "agents" / "cheap.md").write_text(CHEAP.format(extra=extra))


def is_child(body):
    return "You are cheap." in json.dumps(body.get("system"))


def session(child_calls):
    """A parent that delegates once to `cheap`; a child that works for child_calls calls, then reports."""
    state = {"delegated": False, "child": 0}

    def step(body):
        if is_child(body):
            state["child"] += 1
            if state["child"] > child_calls:
                return reply("Report: done.", usage=USAGE)
            return reply(tool("bash", {"command": f"echo chore {state['child']}"}), usage=USAGE)
        if not state["delegated"]:
            state["delegated"] = True
            return reply(tool("agent", {"prompt": "do the chores", "agent_type": "cheap"}))
        return reply("Finished.")
    return [step] * (child_calls + 4)


def offered(x, name="cheap"):
    agent = next(t for t in x.bodies()[0]["tools"] if t["name"] == "agent")
    return f"- {name}:" in agent["description"]


def budget_accepted(x):
    define(x)
    history, err = turn(x, session(1), finish=None)
    assert offered(x), f"the cheap agent type is not offered; stderr: {err.strip()[-300:]!r}"
    assert not agent_result(x, history).get("is_error"), "a child well within its budget failed"


def budget_stops(x):
    define(x)
    history, _ = turn(x, session(5), finish=None)
    calls = sum(map(is_child, x.bodies()))
    assert calls == 3, (f"the child made {calls} model calls; at 1,100 tokens each, a budget of 2,500 "
                        f"is passed by the 3rd, and the child must stop there")


def says_budget(text):
    """Does the error say the token budget ran out? The word in any case or form, or the
    obvious other ways to say it (a token limit, out of tokens); the usage line's
    "tokens" alone, or max_turns' "turns", is not it."""
    return bool(re.search(r"budget|allowance|quota|tokens?[ _-]*(limit|cap)\b|(limit|cap) of [\d,_]+ tokens"
                          r"|out of tokens|tokens? (ran|run|running) out|too many tokens", text, re.I))


def budget_told(x):
    define(x)
    history, _ = turn(x, session(5), finish=None)
    result = agent_result(x, history)
    assert result.get("is_error"), f"a child stopped by its budget reported success: {result['content'][:200]!r}"
    assert says_budget(result["content"]), \
        f"the error does not say the budget ran out: {result['content'][:300]!r}"
    assert x.reason == "end_turn", f"the parent's turn ended with {x.reason!r}"


def budget_bad_value(x):
    for bad in ("lots", "0", "-5", "true"):
        define(x, f"token_budget: {bad}\n")
        x.api.reset()
        _, err = turn(x, [reply("Nothing to do.")], finish=None)
        assert not offered(x), f"a definition with token_budget: {bad} was accepted"
        assert "cheap.md" in err, f"no warning names cheap.md for token_budget: {bad}; stderr {err[-300:]!r}"
        x.mod.WARNED.clear()


def budget_optional(x):
    define(x, "")
    history, _ = turn(x, session(5), finish=None)
    result = agent_result(x, history)
    assert not result.get("is_error"), f"a type without token_budget failed: {result['content'][:200]!r}"
    assert sum(map(is_child, x.bodies())) == 6, "a type without token_budget must have no limit"


EXERCISES = {
    1: ("the report names the files the child changed", [
        ("a child that edits app.py and writes notes/new.txt: the parent's result names both, relative",
         "After run_child() returns, what does the child's own history hold, and what does "
         "run_subagent() return from it?",
         names_changed),
        ("a file the child only read, or failed to edit, is not named",
         "Pair each call with its tool_result (tool_use_id): which ones changed a file?",
         not_named_when_unchanged),
        ("a child stopped early (its max_turns) still says what it changed",
         "The ToolError for an early stop carries the usage note: put the list where both paths use it.",
         named_when_stopped),
        ("each file is named once, whatever path spelling the calls used",
         "app.py and ./app.py are one file: how do the tools turn a path into the text they show?",
         each_once),
        ("a fork names only its own changes, not the parent's from before the fork",
         "Print a fork's history before its first model call: what is in it already?",
         fork_own_changes_only),
    ]),
    2: ("a token budget per agent type", [
        ("a definition may set token_budget: N (the type is offered, not skipped as an unknown field)",
         "parse_agent_file() refuses unknown fields: add token_budget to AGENT_FIELDS and to the spec.",
         budget_accepted),
        ("the child stops once its tokens (input + output) pass the budget, before its next call",
         "Follow max_turns from the definition to agent_loop(): the budget can take the same road. "
         "The child's bill is what add_usage() fills.",
         budget_stops),
        ("the parent gets an error that says the budget ran out, and its own turn goes on",
         "Give the new stop reason a line in CHILD_STOPS with the word 'budget' in it.",
         budget_told),
        ("a bad token_budget (not a whole number >= 1) skips the definition with a warning",
         "Read how max_turns is validated, then try `true` against your check.",
         budget_bad_value),
        ("a type without token_budget has no limit",
         "None means no budget: only compare when one was given.",
         budget_optional),
    ]),
}
