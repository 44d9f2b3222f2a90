"""s03: todo_write, its rules, the rendered checklist and the stale-plan reminder.

Every test runs on s03 and on every later chapter (the demo scenario check runs
on s03 only, where `python tests/demo.py s03` runs it). The model is the scripted
server; what we assert is what the model received in the next request.
"""
import importlib.util

import pytest

from conftest import TESTS, chapters_from, run_chapter, run_turn
from fake_api import reply, text, tool

each = pytest.mark.parametrize("mod", chapters_from("s03"), indirect=True)

PLAN = [{"content": "Find the callers", "status": "completed"},
        {"content": "Rename the function", "status": "in_progress",
         "active_form": "Renaming the function"},
        {"content": "Update the docs", "status": "pending", "active_form": "Updating the docs"}]
DONE = [dict(item, status="completed") for item in PLAN]


def todo(items):
    return tool("todo_write", {"items": items})


def filler():
    """A harmless read-only call: a tool round that does not touch the plan."""
    return tool("glob", {"pattern": "*.nothing"})


def rounds_of(k):
    """k tool rounds, each with its own tool_use id (ids must be unique)."""
    return [reply(filler()) for _ in range(k)]


def result_for(body, call):
    """The tool_result answering `call` in the newest user message of a request."""
    blocks = body["messages"][-1]["content"]
    return next(b for b in blocks if b.get("type") == "tool_result" and b["tool_use_id"] == call["id"])


def nudges(message):
    """Plan reminder blocks in one message."""
    content = message["content"]
    return [b for b in content if isinstance(b, dict) and b.get("type") == "text"
            and "<system-reminder>" in b["text"] and "todo_write" in b["text"]]


def nudged(request):
    return bool(nudges(request["body"]["messages"][-1]))


run = run_turn


@each
def test_valid_plan_is_stored_rendered_and_returned(mod, api, client, capsys):
    call = todo(PLAN)
    run(mod, api, client, [reply(text("Planning."), call)])
    result = result_for(api.requests[1]["body"], call)
    assert not result.get("is_error")
    assert result["content"] == ("(1/3 completed)\n"
                                 "[x] Find the callers\n"
                                 "[>] Rename the function (Renaming the function)\n"
                                 "[ ] Update the docs")
    assert [i["status"] for i in mod.agent_state().plan["items"]] == ["completed", "in_progress", "pending"]
    assert mod.agent_state().plan["rounds_since_update"] == 0
    err = capsys.readouterr().err  # the human's checklist goes to stderr, not stdout
    for line in ("[x] Find the callers", "[>] Rename the function (Renaming the function)",
                 "[ ] Update the docs", "(1/3 completed)"):
        assert line in err


@each
def test_checklist_text_is_not_read_as_rich_markup(mod, api, client, capsys):
    items = [{"content": "Fix [bold]x[/bold] in the [x] list", "status": "in_progress"}]
    run(mod, api, client, [reply(todo(items))])
    assert "[>] Fix [bold]x[/bold] in the [x] list" in capsys.readouterr().err


@each
def test_a_new_plan_replaces_the_old_one_and_empty_clears_it(mod, api, client):
    second = todo([{"content": "Only step", "status": "pending"}])
    clear = todo([])
    run(mod, api, client, [reply(todo(PLAN)), reply(second), reply(clear)])
    assert result_for(api.requests[2]["body"], second)["content"] == "(0/1 completed)\n[ ] Only step"
    assert "empty" in result_for(api.requests[3]["body"], clear)["content"]
    assert mod.agent_state().plan["items"] == []


@each
def test_twenty_items_are_allowed(mod, api, client):
    items = [{"content": f"step {n}", "status": "pending"} for n in range(mod.MAX_TODOS)]
    call = todo(items)
    run(mod, api, client, [reply(call)])
    assert mod.MAX_TODOS == 20
    assert not result_for(api.requests[1]["body"], call).get("is_error")
    assert len(mod.agent_state().plan["items"]) == 20


BAD = {
    "two_in_progress": ([{"content": "a", "status": "in_progress"},
                         {"content": "b", "status": "in_progress"}], "Only one item may be in_progress"),
    "too_many": ([{"content": f"s{n}", "status": "pending"} for n in range(21)], "at most 20 items"),
    "unknown_status": ([{"content": "a", "status": "done"}], "unknown status 'done'"),
    "missing_status": ([{"content": "a"}], "unknown status None"),
    "string_not_list": ("1. read 2. edit", "must be of type array"),
    "empty_content": ([{"content": "", "status": "pending"}], "non-empty content"),
    "blank_content": ([{"content": "   ", "status": "pending"}], "non-empty content"),
    "item_not_object": (["read the file"], "must be an object"),
    "unknown_field": ([{"content": "a", "status": "pending", "priority": "high"}], "unknown field 'priority'"),
    "active_form_not_string": ([{"content": "a", "status": "pending", "active_form": 3}],
                               "active_form must be a string"),
}


@each
@pytest.mark.parametrize("case", BAD, ids=list(BAD))
def test_invalid_plan_is_an_error_naming_the_rule(mod, api, client, case):
    items, rule = BAD[case]
    bad = todo(items)
    run(mod, api, client, [reply(todo(PLAN)), reply(bad)])
    result = result_for(api.requests[2]["body"], bad)
    assert result["is_error"] is True and rule in result["content"]
    assert [i["content"] for i in mod.agent_state().plan["items"]] == [i["content"] for i in PLAN]  # plan kept


@each
def test_schema_declares_nested_items_and_description_guides_use(mod, api, client):
    run(mod, api, client, [])
    spec = next(t for t in api.requests[0]["body"]["tools"] if t["name"] == "todo_write")
    items = spec["input_schema"]["properties"]["items"]
    assert spec["input_schema"]["required"] == ["items"]
    assert items["type"] == "array" and items["items"]["type"] == "object"
    assert set(items["items"]["properties"]) == {"content", "status", "active_form"}
    assert set(items["items"]["required"]) == {"content", "status"}
    assert items["items"]["properties"]["status"]["enum"] == ["pending", "in_progress", "completed"]
    desc = spec["description"]
    assert desc.count(". ") >= 2 and "in_progress" in desc and "completed" in desc
    assert "one-step" in desc  # says when NOT to use it


@each
@pytest.mark.parametrize("interval", [None, 2])
def test_reminder_after_exactly_n_rounds_without_update(mod, api, client, monkeypatch, interval):
    if interval:
        monkeypatch.setattr(mod, "PLAN_REMINDER_INTERVAL", interval)
    n = mod.PLAN_REMINDER_INTERVAL
    assert interval or n == 3
    rounds = 2 * n + 1  # two reminders expected, at rounds n and 2n
    history = run(mod, api, client, [reply(todo(PLAN))] + [reply(filler(), filler()) for _ in range(rounds)])
    # request r answers reply r-1; reply 0 wrote the plan, reply j >= 1 is filler round j
    got = [r for r, req in enumerate(api.requests) if nudged(req)]
    assert got == [n + 1, 2 * n + 1]
    for r in got:
        last = api.requests[r]["body"]["messages"][-1]
        kinds = [b["type"] for b in last["content"]]
        assert last["role"] == "user" and kinds == ["tool_result", "tool_result", "text"]
        assert "[>] Rename the function" in nudges(last)[0]["text"]  # the plan comes along
    assert mod.agent_state().plan["rounds_since_update"] == rounds
    kept = [m for m in history if m["role"] == "user" and nudges(m)]
    assert len(kept) == 2  # and in our own history too, after the results
    assert all([b["type"] for b in m["content"]] == ["tool_result", "tool_result", "text"]
               for m in kept)


@each
@pytest.mark.parametrize("start", ["no_plan", "all_completed", "cleared"])
def test_no_reminder_without_unfinished_items(mod, api, client, start):
    n = mod.PLAN_REMINDER_INTERVAL
    first = {"no_plan": [], "all_completed": [reply(todo(DONE))],
             "cleared": [reply(todo(PLAN)), reply(todo([]))]}[start]
    run(mod, api, client, first + rounds_of(2 * n))
    assert not any(nudged(req) for req in api.requests)
    assert mod.agent_state().plan["rounds_since_update"] == 2 * n  # still counted, just not nagged


@each
def test_update_resets_the_counter(mod, api, client):
    n = mod.PLAN_REMINDER_INTERVAL
    seen = []

    plan = mod.agent_state().plan  # the server thread runs the steps, outside the agent's context

    def watch(step):  # records the counter as the model is called
        return lambda body: seen.append(plan["rounds_since_update"]) or step

    steps = ([reply(todo(PLAN))] + rounds_of(n - 1) + [reply(todo(PLAN))]
             + rounds_of(n))
    run(mod, api, client, [watch(s) for s in steps])
    assert seen == [0] + list(range(n)) + list(range(n))
    assert mod.agent_state().plan["rounds_since_update"] == n
    assert [r for r, req in enumerate(api.requests) if nudged(req)] == [len(steps)]


@each
def test_rejected_update_is_not_a_refresh(mod, api, client):
    n = mod.PLAN_REMINDER_INTERVAL
    bad = todo([{"content": "a", "status": "in_progress"}, {"content": "b", "status": "in_progress"}])
    steps = [reply(todo(PLAN)), reply(bad)] + rounds_of(n - 1)
    run(mod, api, client, steps)
    assert [r for r, req in enumerate(api.requests) if nudged(req)] == [n + 1]


@each
def test_plan_and_counter_survive_into_the_next_user_turn(mod, api, client):
    n = mod.PLAN_REMINDER_INTERVAL
    history = run(mod, api, client, [reply(todo(PLAN))] + rounds_of(n - 1))
    history.append({"role": "user", "content": "go on"})
    api.script([reply(filler()), reply("Ok.")])
    assert mod.agent_loop(client, history) == "end_turn"
    assert nudged(api.requests[-1]) and mod.agent_state().plan["rounds_since_update"] == n


@each
@pytest.mark.e2e("s03")
def test_end_to_end_run_shows_the_plan(mod, api, workspace):
    first, last = [dict(i, status="pending") for i in PLAN], DONE
    first[0]["status"] = "in_progress"
    api.script([reply(text("Three steps; planning first."), todo(first)), reply(filler()),
                reply(todo(last)), reply("All three steps are done.")])
    p = run_chapter(mod.__name__, "rename the function and update the docs", api=api,
                    cwd=workspace, input="")
    assert p.returncode == 0, p.stderr
    assert "All three steps are done." in p.stdout
    assert "[>] Find the callers" in p.stderr and "[ ] Update the docs" in p.stderr
    assert "[x] Update the docs" in p.stderr and "(3/3 completed)" in p.stderr
    assert "[x]" not in p.stdout  # the checklist is for the human's stderr only
    assert len(api.requests) == 4 and api.remaining() == 0


@pytest.mark.parametrize("mod", ["s03_todo"], indirect=True)
def test_demo_scenario_works_through_its_plan(mod, api, client, workspace):
    spec = importlib.util.spec_from_file_location("scenario_s03", TESTS / "scenarios" / "s03.py")
    scenario = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(scenario)
    api.script(list(scenario.STEPS))
    assert mod.agent_loop(client, [{"role": "user", "content": scenario.PROMPT}]) == "end_turn"
    assert api.remaining() == 0 and api.exhausted == 0
    assert {"greet.py", "test_greet.py", "README.md"} <= {p.name for p in workspace.iterdir()}
    assert [i["status"] for i in mod.agent_state().plan["items"]] == ["completed"] * 3
    assert [r for r, req in enumerate(api.requests) if nudged(req)] == [6]
    assert "1 test passed" in str(api.requests[5]["body"]["messages"][-1]["content"])
