"""s04: the agent tool, agent definitions, fork mode and subagent failures.

The scripted server answers requests from one queue in the order they arrive,
so a script interleaves parent and child in execution order: the parent's
agent call, then every child call, then the parent again. What we assert is
what each side received: the child's first request, and the parent's request
after the agent call (it must hold the child's report and nothing else).
"""
import importlib.util
import json
from pathlib import Path

import anthropic
import pytest

from conftest import TESTS, chapters_from, run_chapter, run_turn, strip_cache
from fake_api import error, reply, text, tool

each = pytest.mark.parametrize("mod", chapters_from("s04"), indirect=True)


def agent(prompt="look around", **extra):
    return tool("agent", {"prompt": prompt, **extra})


run = run_turn


def body(api, n):
    """A request as sent, minus cache marks, with the system prompt as one string."""
    b = strip_cache(api.requests[n]["body"])
    if isinstance(b.get("system"), list):
        b["system"] = "".join(block["text"] for block in b["system"])
    return b


def tool_names(request_body):
    return [t["name"] for t in request_body["tools"]]


def result_of(request_body, call):
    """The tool_result answering `call` in the newest user message of a request."""
    return next(b for b in request_body["messages"][-1]["content"]
                if b.get("type") == "tool_result" and b["tool_use_id"] == call["id"])


def agent_description(request_body):
    return next(t["description"] for t in request_body["tools"] if t["name"] == "agent")


def write_agent(folder, name, meta, prompt):
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{name}.md").write_text(f"---\n{meta}\n---\n{prompt}\n")


# --- the basic contract -------------------------------------------------------

@each
def test_child_starts_fresh_with_only_the_task_and_no_agent_tool(mod, api, client):
    call = agent("Count the Python files and report the number.", description="count files")
    run(mod, api, client, [reply(text("Delegating."), call), reply("There are 3.")],
        prompt="a long conversation the child must not see")
    child = body(api, 1)
    assert child["messages"] == [{"role": "user", "content": [
        {"type": "text", "text": "Count the Python files and report the number."}]}]
    parent_tools = tool_names(body(api, 0))
    assert "agent" in parent_tools and "agent" not in tool_names(child)
    assert tool_names(child) == [n for n in parent_tools if n != "agent"]
    assert "a long conversation" not in json.dumps(child)
    assert child["system"] != body(api, 0)["system"] and "subagent" in child["system"]
    assert str(mod.agent_state().workdir) in child["system"]


@each
def test_parent_gets_only_the_final_text(mod, api, client, workspace):
    (workspace / "notes.txt").write_text("SECRET-DETAIL 42\n")
    call, inner = agent("What is in notes.txt?"), tool("read_file", {"path": "notes.txt"})
    run(mod, api, client, [reply(call), reply(text("Let me read it."), inner),
                           reply("notes.txt holds one number: 42.")])
    parent = body(api, 3)
    assert len(parent["messages"]) == 3  # prompt, agent call, its result: nothing else
    result = result_of(parent, call)
    assert result["content"].startswith("notes.txt holds one number: 42.\n\n[subagent ")
    assert not result.get("is_error")
    dump = json.dumps(parent)
    assert inner["id"] not in dump and "SECRET-DETAIL" not in dump and "Let me read" not in dump


@each
def test_child_text_and_usage_go_to_stderr_not_stdout(mod, api, client, capsys):
    call = agent("Summarise the repo.", description="summary")
    usage = {"input_tokens": 100, "output_tokens": 7}
    run(mod, api, client, [reply(text("On it."), call),
                           reply(text("Looking."), tool("glob", {"pattern": "*"}), usage=usage),
                           reply("CHILD REPORT", usage=usage)])
    out, err = capsys.readouterr()
    line = "[subagent summary: 2 model calls, 200 input + 14 output tokens]"
    assert line in err and "CHILD REPORT" in err and "Looking." in err
    assert "CHILD REPORT" not in out and "Looking." not in out
    assert "On it." in out and "Finished." in out
    assert result_of(body(api, 3), call)["content"] == f"CHILD REPORT\n\n{line}"


@each
def test_child_calling_agent_gets_unknown_tool_error(mod, api, client):
    nested = agent("go deeper")
    run(mod, api, client, [reply(agent("task")), reply(nested), reply("Did it myself.")])
    assert len(api.requests) == 4  # parent, child, child, parent: no grandchild
    refused = result_of(body(api, 2), nested)
    assert refused["is_error"] and "Unknown tool 'agent'" in refused["content"]


@each
def test_unknown_agent_type_and_fork_with_type_are_tool_errors(mod, api, client):
    bad, both = agent("x", agent_type="nope"), agent("x", agent_type="explore", fork=True)
    run(mod, api, client, [reply(bad, both)])
    first, second = result_of(body(api, 1), bad), result_of(body(api, 1), both)
    assert first["is_error"] and "Unknown agent_type 'nope'" in first["content"]
    assert "explore" in first["content"]
    assert second["is_error"] and "cannot be combined" in second["content"]
    assert len(api.requests) == 2  # neither started a child


# --- agent definitions -----------------------------------------------------------

@each
def test_project_definition_sets_tools_prompt_model_and_turn_cap(mod, api, client, workspace):
    write_agent(workspace / ".agent" / "agents", "reviewer",
                "name: reviewer\ndescription: Reviews code for bugs.\ntools: [read_file, grep]\n"
                "max_turns: 2\nmodel: claude-haiku-4-5", "You are a careful code reviewer.")
    (workspace / "a.py").write_text("x = 1\n")
    call = agent("Review a.py", agent_type="reviewer")
    write = tool("write_file", {"path": "evil.txt", "content": "x"})
    run(mod, api, client, [reply(call), reply(write), reply(tool("read_file", {"path": "a.py"}))])
    assert "\n- reviewer: Reviews code for bugs." in agent_description(body(api, 0))
    child = body(api, 1)
    assert tool_names(child) == ["read_file", "grep"]
    assert child["system"].startswith("You are a careful code reviewer.")
    assert child["model"] == "claude-haiku-4-5" and body(api, 0)["model"] != child["model"]
    denied = result_of(body(api, 2), write)
    assert denied["is_error"] and "Unknown tool 'write_file'" in denied["content"]
    assert not (workspace / "evil.txt").exists()
    capped = result_of(body(api, 3), call)  # 2 child calls, then the cap: an error result
    assert capped["is_error"] and "2 turns" in capped["content"]


@each
def test_user_definition_found_and_overridden_by_project(mod, api, client, workspace):
    home = Path.home() / ".agent" / "agents"
    write_agent(home, "helper", "description: user helper", "USER PROMPT")
    write_agent(home, "solo", "description: only at user level", "SOLO PROMPT")
    write_agent(workspace / ".agent" / "agents", "helper", "description: project helper",
                "PROJECT PROMPT")
    run(mod, api, client, [reply(agent("a", agent_type="helper")), reply("helped"),
                           reply(agent("b", agent_type="solo")), reply("solo done")])
    desc = agent_description(body(api, 0))
    listed = [line for line in desc.splitlines() if line.startswith("- ")]
    assert listed == ["- explore: " + mod.BUILTIN_AGENTS["explore"]["description"],
                      "- helper: project helper", "- solo: only at user level"]
    assert body(api, 1)["system"].startswith("PROJECT PROMPT")
    assert body(api, 3)["system"].startswith("SOLO PROMPT")


@each
def test_malformed_definitions_are_skipped_with_one_warning(mod, api, client, workspace, capsys):
    folder = workspace / ".agent" / "agents"
    write_agent(folder, "broken", "name: [unclosed\ndescription: x", "body")
    write_agent(folder, "typo", "description: strict\ndisalowed_tools: [bash]", "body")
    write_agent(folder, "nodesc", "name: nodesc", "body")
    write_agent(folder, "good", "description: fine\ndisallowedTools: bash\nmaxTurns: 3", "GOOD")
    typo = agent("y", agent_type="typo")
    run(mod, api, client, [reply(agent("x", agent_type="good")), reply("ok"), reply(typo)])
    err = capsys.readouterr().err
    warnings = [line for line in err.splitlines() if "skipped agent definition" in line]
    assert len(warnings) == 3  # once each, although definitions are read several times
    assert any("broken.md" in w and "bad YAML" in w for w in warnings)
    assert any("typo.md" in w and "disalowed_tools" in w for w in warnings)
    assert any("nodesc.md" in w and "description" in w for w in warnings)
    assert "bash" not in tool_names(body(api, 1))  # the seed's camelCase spelling works
    desc = agent_description(body(api, 0))
    assert "\n- good: fine" in desc and "typo" not in desc and "broken" not in desc
    assert result_of(body(api, 3), typo)["is_error"]  # a skipped file is no agent type


@each
def test_explore_is_read_only(mod, api, client, workspace):
    (workspace / "main.py").write_text("print('hi')\n")
    call = agent("Find the entry point.", agent_type="explore")
    edit = tool("edit_file", {"path": "main.py", "old_string": "hi", "new_string": "bye"})
    write = tool("write_file", {"path": "new.txt", "content": "x"})
    run(mod, api, client, [reply(call), reply(tool("read_file", {"path": "main.py"})),
                           reply(edit, write), reply("main.py prints hi.")])
    child = body(api, 1)
    assert sorted(tool_names(child)) == ["bash", "glob", "grep", "read_file"]
    assert "read-only" in child["system"]
    for blocked in (edit, write):
        assert result_of(body(api, 3), blocked)["is_error"]
        assert "not available to this agent" in result_of(body(api, 3), blocked)["content"]
    assert (workspace / "main.py").read_text() == "print('hi')\n"
    assert not (workspace / "new.txt").exists()
    assert result_of(body(api, 4), call)["content"].startswith("main.py prints hi.")


# --- fork mode -------------------------------------------------------------------

@each
def test_fork_inherits_the_history_with_placeholders(mod, api, client, workspace):
    (workspace / "bug.py").write_text("def add(a, b):\n    return a - b\n")
    first, read = agent("What calls add?"), tool("read_file", {"path": "bug.py"})
    fork, side = agent("Write a test for add.", fork=True), tool("glob", {"pattern": "*.py"})
    run(mod, api, client, [reply(first), reply("Nothing calls add."),
                           reply(text("Reading it."), read),
                           reply(text("Forking a test writer."), fork, side),
                           reply("Scope: wrote no test, only checked.")],
        prompt="We are fixing bug 42 in add().")
    parent, child = body(api, 3), body(api, 4)  # the fork's request follows the parent's
    n = len(parent["messages"])
    assert child["messages"][:n] == parent["messages"]  # the history, as the parent sent it
    assert "Nothing calls add." in json.dumps(child["messages"])  # earlier subagent's result
    assert [b.get("id") for b in child["messages"][n]["content"]][-2:] == [fork["id"], side["id"]]
    tail = child["messages"][n + 1]["content"]  # answers to the parent's open calls, then the task
    assert [b.get("tool_use_id") for b in tail[:2]] == [fork["id"], side["id"]]
    assert all("placeholder" in b["content"] for b in tail[:2])
    assert "<fork_boilerplate>" in tail[2]["text"] and "Do not fork" in tail[2]["text"]
    assert tail[2]["text"].endswith("Task: Write a test for add.")
    assert child["system"] == parent["system"] and "agent" not in tool_names(child)
    assert len(child["messages"]) == n + 2
    final = body(api, 5)
    assert result_of(final, fork)["content"].startswith("Scope: wrote no test")
    assert "placeholder" not in json.dumps(final)  # the parent's own history is untouched


# --- failures ----------------------------------------------------------------------

@each
def test_child_api_error_is_a_tool_error_and_parent_goes_on(mod, api, client):
    call = agent("Do it.")
    # 401: not transient, so no chapter retries it (s06 would retry a 500)
    run(mod, api, client, [reply(call), error(401, "upstream exploded")])
    assert len(api.requests) == 3
    result = result_of(body(api, 2), call)
    assert result["is_error"] and "model API failed" in result["content"]


@each
def test_turn_cap_is_a_tool_error_with_the_last_words(mod, api, client, monkeypatch):
    monkeypatch.setattr(mod, "SUBAGENT_MAX_TURNS", 3)
    call = agent("Loop forever.")
    busy = [reply(text(f"step {k}"), tool("glob", {"pattern": "*"})) for k in range(3)]
    run(mod, api, client, [reply(call)] + busy)
    assert len(api.requests) == 5  # parent, 3 child calls (the cap), parent
    result = result_of(body(api, 4), call)
    assert result["is_error"] and "3 turns" in result["content"]
    assert "step 2" in result["content"] and "3 model calls" in result["content"]


@each
def test_ctrl_c_in_the_child_cancels_the_whole_turn(mod, api, client, monkeypatch):
    def interrupt(**_):
        raise KeyboardInterrupt
    monkeypatch.setitem(mod.TOOL_HANDLERS, "glob", interrupt)
    api.script([reply(agent("x")), reply(tool("glob", {"pattern": "*"}))])
    history = [{"role": "user", "content": "go"}]
    assert mod.agent_loop(client, history) == "interrupted"
    assert len(api.requests) == 2  # the parent did not carry on
    assert history[-1]["content"][0]["is_error"]  # and its history is valid again


@each
def test_files_read_by_one_agent_must_be_read_again_by_the_other(mod, api, client, workspace):
    (workspace / "a.txt").write_text("one\n")
    edit = {"path": "a.txt", "old_string": "one", "new_string": "two"}
    blind, child_read = tool("edit_file", edit), tool("read_file", {"path": "a.txt"})
    child_edit = tool("edit_file", edit | {"new_string": "three"})  # a new size: seen even within one mtime tick
    parent_edit = tool("edit_file", edit)
    run(mod, api, client, [reply(tool("read_file", {"path": "a.txt"})), reply(agent("fix a.txt")),
                           reply(blind), reply(child_read), reply(child_edit), reply("changed"),
                           reply(parent_edit)])
    assert "Read a.txt" in result_of(body(api, 3), blind)["content"]  # fresh child: no reads
    assert not result_of(body(api, 5), child_edit).get("is_error")
    stale = result_of(body(api, 7), parent_edit)  # the parent's read predates the child's edit
    assert stale["is_error"] and "changed on disk" in stale["content"]
    assert (workspace / "a.txt").read_text() == "three\n"


@each
def test_child_with_an_empty_final_reply_reports_that(mod, api, client):
    call = agent("Think quietly.")
    run(mod, api, client, [reply(call), reply(text("Checking."), tool("glob", {"pattern": "*"})),
                           reply()])
    result = result_of(body(api, 3), call)
    assert result["content"].startswith("(the subagent finished without a report)\n\n[subagent ")
    assert "Checking." not in result["content"]  # interim text is not a report


@each
def test_an_empty_prompt_is_refused_and_a_blank_description_is_no_label(mod, api, client, capsys):
    """A child labelled "" would be taken for the main agent by later chapters (its
    hooks, memory and news are the main agent's); an empty prompt the API rejects."""
    call = agent("   ")
    run(mod, api, client, [reply(call)])
    result = result_of(body(api, 1), call)
    assert result.get("is_error") and "The prompt is empty" in result["content"]
    run(mod, api, client, [reply(agent("look around", description="   ")), reply("seen")])
    assert "[agent look around: general-purpose, started]" in capsys.readouterr().err


@each
def test_parse_agent_file_accepts_common_spellings(mod, workspace):
    path = workspace / "w.md"
    path.write_bytes(b"---\r\ndescription: >\r\n  Writes\r\n  docs.\r\ntools: read_file, "
                     b"write_file\r\nmodel: inherit\r\n---\r\nYou write docs.\r\n")
    spec = mod.parse_agent_file(path)
    assert spec["name"] == "w" and spec["description"] == "Writes docs."
    assert spec["tools"] == ["read_file", "write_file"] and spec["disallowed_tools"] == []
    assert spec["model"] is None and spec["max_turns"] == 30   # the documented default
    assert spec["system"] == "You write docs."
    for bad in ("no frontmatter", "---\n- a list\n---\n", "---\ndescription: x\nmax_turns: 0\n---\n",
                "---\ndescription: x\ntools: 3\n---\n",
                "---\ndescription: x\nname: a b\n---\n"):
        path.write_text(bad)
        with pytest.raises(ValueError):
            mod.parse_agent_file(path)


# --- end to end ----------------------------------------------------------------------

@pytest.mark.e2e("s04")
def test_end_to_end_subprocess(api, workspace):
    (workspace / "VERSION").write_text("1.2.3\n")
    api.script([reply(text("Asking an explorer."),
                      agent("Which version is this project?", agent_type="explore",
                            description="find version")),
                reply(tool("read_file", {"path": "VERSION"})),
                reply("VERSION says 1.2.3."),
                reply("The project is at version 1.2.3.")])
    p = run_chapter("s04_subagent", "what version is this?", api=api, cwd=workspace, input="")
    assert p.returncode == 0, p.stderr
    assert "The project is at version 1.2.3." in p.stdout
    assert "VERSION says" not in p.stdout and "VERSION says 1.2.3." in p.stderr
    assert "[subagent find version: 2 model calls," in p.stderr
    assert api.remaining() == 0 and len(api.requests) == 4


@pytest.mark.parametrize("mod", ["s04_subagent"], indirect=True)
def test_demo_scenario_delegates_to_explore(mod, api, client, workspace):
    spec = importlib.util.spec_from_file_location("scenario_s04", TESTS / "scenarios" / "s04.py")
    scenario = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(scenario)
    scenario.SETUP(workspace)
    api.script(list(scenario.STEPS))
    history = [{"role": "user", "content": scenario.PROMPT}]
    assert mod.agent_loop(client, history) == "end_turn"
    assert api.remaining() == 0 and api.exhausted == 0
    assert len(body(api, 1)["messages"]) == 1 and "read-only" in body(api, 1)["system"]
    assert "MAX_RETRIES = 4" in history[-1]["content"][0]["text"]
    assert "(demo:" not in json.dumps(history)
