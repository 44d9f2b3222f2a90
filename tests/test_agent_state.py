"""Per-agent state: one AgentState per agent, reached through agent_state().

A subagent runs as its own agent (workdir, file-read records, plan and
compaction state of its own), nothing is swapped in and out of module
globals, and a worker thread of a parallel batch sees the agent that started
it. The turn cap is configurable, and Ctrl+C keeps the results of calls that
already ran.
"""
import threading
from types import SimpleNamespace

import pytest

from conftest import chapters_from, run_chapter, run_turn
from fake_api import reply, tool

each = pytest.mark.parametrize("mod", chapters_from("s01"), indirect=True)
from_s02 = pytest.mark.parametrize("mod", chapters_from("s02"), indirect=True)
from_s04 = pytest.mark.parametrize("mod", chapters_from("s04"), indirect=True)


@each
def test_no_module_level_per_agent_state(mod):
    for gone in ("WORKDIR", "FILE_STATE", "TODO", "RUNNING", "CONTEXT_STATE", "LOOP_CONTEXT"):
        assert not hasattr(mod, gone), f"{gone} is per-agent state: it belongs on AgentState"


@each
def test_tools_work_in_the_running_agents_workdir(mod, tmp_path):
    other = tmp_path / "other"
    other.mkdir()
    with mod.acting_as(mod.AgentState(other)):
        mod.run_bash("echo here > made.txt")
        assert str(other.resolve()) in mod.system_prompt()
    assert (other / "made.txt").read_text() == "here\n"
    assert not (mod.agent_state().workdir / "made.txt").exists()   # the outer agent's is untouched


@from_s02
def test_a_pool_worker_sees_the_agent_that_started_it(mod, monkeypatch):
    seen, barrier = [], threading.Barrier(3, timeout=10)   # three at once: really in threads

    def record(path, offset=1, limit=None):
        barrier.wait()
        seen.append((threading.get_ident(), mod.agent_state()))
        return "ok"
    monkeypatch.setitem(mod.TOOL_HANDLERS, "read_file", record)
    calls = [SimpleNamespace(id=f"t{i}", name="read_file", input={"path": "x"}) for i in range(3)]
    results = mod.run_tools(calls, [])
    assert [r.get("is_error") for r in results] == [None] * 3
    assert {s for _, s in seen} == {mod.agent_state()}
    assert threading.get_ident() not in {t for t, _ in seen}


@each
def test_agent_max_turns_sets_the_cap(mod, api, client, monkeypatch):
    monkeypatch.setenv("AGENT_MAX_TURNS", "2")
    api.script([reply(tool("bash", {"command": "true"})) for _ in range(3)])
    history = [{"role": "user", "content": "loop"}]
    assert mod.agent_loop(client, history) == "max_turns"
    assert len(api.requests) == 2 and api.remaining() == 1
    monkeypatch.delenv("AGENT_MAX_TURNS")
    assert mod.turn_limit() == mod.MAX_TURNS == 50       # the documented default


@each
@pytest.mark.parametrize("bad", ["0", "-3", "ten", "2.5"])
def test_a_bad_turn_cap_is_named(mod, monkeypatch, bad):
    monkeypatch.setenv("AGENT_MAX_TURNS", bad)
    with pytest.raises(ValueError, match="AGENT_MAX_TURNS"):
        mod.turn_limit()


@pytest.mark.e2e("s01")
@each
def test_a_bad_turn_cap_is_one_line_and_status_2(mod, api, workspace):
    r = run_chapter(mod.__name__, "hi", api=api, cwd=workspace, env={"AGENT_MAX_TURNS": "lots"})
    assert r.returncode == 2 and "AGENT_MAX_TURNS" in r.stderr and "Traceback" not in r.stderr
    assert not api.requests


@each
def test_ctrl_c_keeps_the_results_of_calls_that_ran(mod, api, client, monkeypatch, workspace):
    real = mod.TOOL_HANDLERS["bash"]

    def bash(command, timeout=None):
        if command == "stuck":
            raise KeyboardInterrupt
        return real(command, timeout)
    monkeypatch.setitem(mod.TOOL_HANDLERS, "bash", bash)
    first, second, third = (tool("bash", {"command": c}) for c in ("echo done > f.txt", "stuck", "true"))
    api.script([reply(first, second, third)])
    history = [{"role": "user", "content": "go"}]
    assert mod.agent_loop(client, history) == "interrupted"
    results = {b["tool_use_id"]: b for b in history[-1]["content"]}
    assert (workspace / "f.txt").exists()
    assert not results[first["id"]].get("is_error")             # it ran: its real result stays
    assert "cancelled" not in results[first["id"]]["content"]
    assert "cancelled" in results[second["id"]]["content"] and results[second["id"]]["is_error"]
    assert "cancelled" in results[third["id"]]["content"]        # never started
    assert [h["role"] for h in history] == ["user", "assistant", "user"]


@from_s04
def test_a_child_has_its_own_state_and_the_parents_is_untouched(mod, api, client, workspace):
    (workspace / "a.txt").write_text("a\n")
    parent = mod.agent_state()
    seen = {}
    real = mod.TOOL_HANDLERS["glob"]

    def probe(pattern, path="."):  # runs inside the child
        child = mod.agent_state()
        seen.update(child=child, files=dict(child.files), plan=child.plan)
        return real(pattern, path)
    mod.TOOL_HANDLERS["glob"] = probe
    try:
        plan = [{"content": "parent step", "status": "in_progress"}]
        child_plan = [{"content": "child step", "status": "in_progress"}]
        run_turn(mod, api, client, [
            reply(tool("read_file", {"path": "a.txt"}), tool("todo_write", {"items": plan})),
            reply(tool("agent", {"prompt": "look"})),
            reply(tool("todo_write", {"items": child_plan}), tool("glob", {"pattern": "*"})),
            reply("child report")])
    finally:
        mod.TOOL_HANDLERS["glob"] = real
    child = seen["child"]
    assert child is not parent and child.workdir == parent.workdir
    assert seen["files"] == {}                                     # a fresh child has read nothing
    assert [i["content"] for i in seen["plan"]["items"]] == ["child step"]
    assert [i["content"] for i in parent.plan["items"]] == ["parent step"]   # not leaked, kept
    assert str(workspace.resolve() / "a.txt") in parent.files
    assert mod.agent_state() is parent
    if hasattr(parent, "compaction"):
        assert child.compaction is not parent.compaction
        assert child.session is parent.session                     # one bill for the session
