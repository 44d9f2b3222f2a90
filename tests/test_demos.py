"""The offline demos a workshop runs: `python tests/demo.py sNN`, no key, no network.

Each demo run starts Python and imports the SDK, so each demo runs once:
`demo.py all --show-requests --keep` (every chapter, behind an unreachable proxy;
s06's requests and kept workspace are checked in detail), and one failing demo
in-process; the failure rules themselves are checked on demo.problems() directly.
"""
import json
import os
import subprocess
import re
import sys
import tempfile
import types

import pytest

from conftest import ROOT, TESTS, chapters_from
from fake_api import reply

import demo

DEMOS = sorted(p.stem.split("_")[0] for p in ROOT.glob("s[0-9][0-9]_*.py"))


def run_demo_py(tmp_path, *args, env=None):
    """demo.py as a learner runs it; workspaces land in tmp_path (TMPDIR)."""
    # Not TMUX either: run inside tmux, s11's demo opens its teammates' panes in that window.
    full = {k: v for k, v in os.environ.items() if not k.startswith(("ANTHROPIC", "TMUX"))}
    full |= {"HOME": str(tmp_path), "TMPDIR": str(tmp_path)} | (env or {})
    return subprocess.run([sys.executable, str(TESTS / "demo.py"), *args], cwd=tmp_path,
                          env=full, capture_output=True, text=True, timeout=600)


def test_every_scenario_has_a_check_and_says_what_it_shows():
    for name in DEMOS:
        scenario = demo.load_scenario(name)
        assert scenario is not None, f"{name} has no demo scenario"
        assert callable(getattr(scenario, "CHECK", None)), f"{name}'s scenario has no CHECK"
        assert scenario.CHECK.__doc__, f"{name}'s CHECK does not say what it checks"
        assert len((scenario.__doc__ or "").strip().splitlines()) >= 3, f"{name}: no SHOWS notes"


@pytest.mark.e2e("s01")
def test_demo_all_runs_every_chapter_to_its_end_behind_a_proxy(tmp_path):
    # An unreachable proxy for every scheme and no NO_PROXY of our own: demo.py
    # must exempt its local scripted server in the chapter's environment itself.
    proxy = "http://127.0.0.1:9"
    env = {"HTTP_PROXY": proxy, "HTTPS_PROXY": proxy, "http_proxy": proxy,
           "https_proxy": proxy, "ALL_PROXY": proxy, "NO_PROXY": "", "no_proxy": ""}
    r = run_demo_py(tmp_path, "all", "--show-requests", "--keep", env=env)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "Traceback" not in r.stderr and "FAILED" not in r.stdout
    assert f"=== demo all: {len(DEMOS)} of {len(DEMOS)} chapters ok ===" in r.stdout
    summary = r.stdout.split("=== demo all:")[1].splitlines()[1:]
    assert [line.split()[:2] for line in summary] == [[name, "ok"] for name in DEMOS]
    for name in DEMOS:   # every reply used, nothing left over, and the outcome checked
        steps = len(demo.load_scenario(name).STEPS)
        line = next(x for x in r.stdout.splitlines() if x.startswith(f"demo {name}: ok ("))
        assert f"{steps}/{steps} scripted replies used" in line and ", check held: " in line
    assert r.stdout.count("What is faked:") == len(DEMOS)      # each says so before it runs
    assert r.stdout.count("=== What the model received:") == len(DEMOS)
    assert "input_tokens=168,500): a fixed number" in r.stdout  # s06's jump is scripted
    assert "alice -> lead  shutdown_response [approve true]" in r.stdout  # s11 shows its message log
    assert not list(tmp_path.glob("agent-demo-*-home-*"))      # homes removed; without --keep
    kept = sorted(tmp_path.glob("agent-demo-*"))               # the workspaces are too (the
    assert [p.name.split("-")[2] for p in kept] == DEMOS        # failing demo's test checks it)
    assert all((p / "requests.jsonl").is_file() for p in kept)
    s06 = next(part for part in r.stdout.split("=== What the model received:") if "demo s06: ok (" in part)
    show_requests_of_s06(s06, next(p for p in kept if p.name.startswith("agent-demo-s06-")))


def show_requests_of_s06(out, kept):
    """s06's --show-requests output and its --keep workspace: what the model received."""
    assert "system (" in out and "in full" in out and "system: (unchanged)" in out
    assert "messages: 3 (1 as in request 1, 2 new)" in out        # the history grows
    assert "messages: 5 (3 as in request 2, 2 new)" in out        # ... only the new part shown
    assert "<<< PERSISTED" in out and "saved to: .agent/tool-results/" in out
    assert "<<< CLEARED" in out and "(was 25," in out              # the batch clear, in place
    assert 'tool_choice: {"type": "none"}' in out                  # the summary call
    assert "<<< COMPACTION SUMMARY" in out and "a fresh message list" in out
    assert "tools (10): bash, read_file" in out and "tools: (unchanged, 10)" in out
    assert "cache breakpoints (4): tools[9] (compact, end of tools) | system[0]" in out
    assert "usage is SCRIPTED: input_tokens=168,500" in out
    log = [json.loads(line) for line in (kept / "requests.jsonl").read_text().splitlines()]
    assert len(log) == 9 and all(e["valid"] and e["body"]["messages"] for e in log)
    assert log[7]["body"]["tool_choice"] == {"type": "none"} and log[-1]["reply"]["content"]
    assert list((kept / ".agent" / "transcripts").glob("*.jsonl"))


def server_stub(requests=(), remaining=0, exhausted=0):
    return types.SimpleNamespace(requests=list(requests), remaining=lambda: remaining,
                                 invalid=lambda: [r for r in requests if not r["valid"]],
                                 exhausted=exhausted)


def scenario_with(check):
    return types.SimpleNamespace(CHECK=check)


def ok_check(workspace, stdout):
    """nothing"""


def test_problems_name_every_way_a_demo_can_go_wrong(tmp_path):
    steps = [reply("a"), reply("b"), reply("c")]
    assert demo.problems(0, server_stub(), steps, scenario_with(ok_check), tmp_path, "") == []
    bad = {"valid": False, "error": "messages.1: bad", "step": None}
    expected = {"path": "", "valid": True, "error": None, "step": reply("(demo: expected X here)")}

    def failing(workspace, stdout):
        assert "answer" in stdout, "no answer"

    found = demo.problems(1, server_stub([bad, expected], remaining=2, exhausted=1), steps,
                          scenario_with(failing), tmp_path, "")
    assert found == ["the chapter exited with status 1",
                     "the chapter sent an invalid request: messages.1: bad",
                     "the chapter asked the model 1 more time(s) than the script has replies (3)",
                     "2 of 3 scripted replies were never requested: the chapter stopped after reply 1",
                     "request 2 was not what the scenario expects: expected X here",
                     "check failed: no answer"]
    missing = demo.problems(0, server_stub(), steps, scenario_with(
        lambda ws, out: (ws / "nope.txt").read_text()), tmp_path, "")
    assert len(missing) == 1 and missing[0].startswith("check failed: FileNotFoundError")
    assert demo.problems(None, server_stub(), steps, types.SimpleNamespace(), tmp_path, "") == [
        f"the chapter did not finish within {demo.TIMEOUT} s and was stopped",
        "the scenario has no CHECK(workspace, stdout) of its outcome"]


def test_a_demo_that_stops_early_fails_with_one_line_per_reason(tmp_path, monkeypatch, capfd):
    def check(workspace, stdout):
        """hello.txt is made"""
        assert (workspace / "hello.txt").exists(), "hello.txt was not made"

    scenario = types.SimpleNamespace(__doc__="s01 demo: test\n\nnothing to watch", PROMPT="hi",
                                     STEPS=[reply("Done."), reply("never requested")], CHECK=check)
    monkeypatch.setattr(demo, "load_scenario", lambda name: scenario)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    monkeypatch.setattr(sys, "argv", ["demo.py", "s01"])
    assert demo.main() == 1
    out = capfd.readouterr().out
    failed = [line for line in out.splitlines() if line.startswith("demo s01: FAILED: ")]
    assert failed == ["demo s01: FAILED: 1 of 2 scripted replies were never requested: the "
                      "chapter stopped after reply 1",
                      "demo s01: FAILED: check failed: hello.txt was not made"]
    assert "demo s01: ok" not in out and not list(tmp_path.glob("agent-demo-*"))


@pytest.mark.parametrize("mod", chapters_from("s04"), indirect=True)
def test_example_agent_definitions_load(mod, workspace):
    """examples/agents/*.md: valid for the chapter's parser, tools it has, as documented."""
    found = sorted((ROOT / "examples" / "agents").glob("*.md"))
    assert [p.name for p in found] == ["reviewer.md"]
    tools = {t["name"] for t in mod.TOOLS}
    for path in found:
        spec = mod.parse_agent_file(path)
        assert spec["name"] == path.stem and spec["description"] and spec["system"]
        assert spec["tools"] and set(spec["tools"]) <= tools - {"agent", "bash", "write_file", "edit_file"}
    readme = (ROOT / "examples" / "README.md").read_text()
    block = re.search(r"```markdown\n(.*?)```", readme, re.S)[1]   # the format sample parses too
    (workspace / "sample.md").write_text(block)
    assert mod.parse_agent_file(workspace / "sample.md")["name"] == "reviewer"
    for field in mod.AGENT_FIELDS:
        assert f"| `{field}` |" in readme, f"examples/README.md does not document {field}"
