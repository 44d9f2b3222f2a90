"""The offline demos a workshop runs: `python tests/demo.py sNN`, no key, no network.

Each demo run starts Python and imports the SDK, so the demos run once per test
run: `demo.py all --show-requests --keep` (every chapter and agent_full, behind
an unreachable proxy, stdout and stderr together as a terminal shows them),
shared by the workers (once_per_run). One test checks that run as a whole (and
s06's requests and kept workspace in detail); one test per mechanism checks
that its demo still shows it, in that output. The failure rules are checked on
demo.problems() directly, the terminal screen and the stream relay on small
inputs, and one failing demo in-process.
"""
import json
import os
import subprocess
import re
import sys
import tempfile
import types
from pathlib import Path

import pytest

from conftest import ROOT, TESTS, chapters_from, once_per_run
from fake_api import reply
from screen import Screen

import demo

DEMOS = demo.chapters()   # s01 ... s12, then agent (agent_full.py)


def run_demo_py(tmp_path, *args, env=None):
    """demo.py as a learner runs it; workspaces land in tmp_path (TMPDIR). Its stdout
    and stderr together, in order, as a terminal shows them."""
    # Not TMUX either: run inside tmux, s11's demo opens its teammates' panes in that window.
    full = {k: v for k, v in os.environ.items() if not k.startswith(("ANTHROPIC", "TMUX"))}
    full |= {"HOME": str(tmp_path), "TMPDIR": str(tmp_path), "NO_COLOR": "1"} | (env or {})
    return subprocess.run([sys.executable, str(TESTS / "demo.py"), *args], cwd=tmp_path, env=full,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=900)


def demo_all(root):
    # An unreachable proxy for every scheme and no NO_PROXY of our own: demo.py
    # must exempt its local scripted server in the chapter's environment itself.
    proxy = "http://127.0.0.1:9"
    env = {"HTTP_PROXY": proxy, "HTTPS_PROXY": proxy, "http_proxy": proxy,
           "https_proxy": proxy, "ALL_PROXY": proxy, "NO_PROXY": "", "no_proxy": ""}
    r = run_demo_py(root, "all", "--show-requests", "--keep", env=env)
    return {"code": r.returncode, "out": r.stdout, "root": str(root)}


@pytest.fixture
def everything(tmp_path_factory):
    """`demo.py all --show-requests --keep`, once per test run."""
    return once_per_run(tmp_path_factory, "demo-all", demo_all)


def part(out, name):
    """One demo's share of `demo.py all`'s output: from its title to its verdict line."""
    ends = [m.end() for m in re.finditer(r"^demo \S+: (?:ok \(|FAILED).*$", out, re.M)]
    mine = re.search(rf"^demo {name}: (?:ok \(|FAILED).*$", out, re.M)
    assert mine, f"no verdict line for {name}"
    start = max([e for e in ends if e < mine.start()], default=0)
    return out[start:mine.end()]


def transcript(text):
    """A demo's run, what the chapter printed: before the request view."""
    return text.split("=== What the model received:")[0]


def test_every_scenario_has_a_check_and_says_what_it_shows():
    for name in DEMOS:
        scenario = demo.load_scenario(name)
        assert scenario is not None, f"{name} has no demo scenario"
        assert callable(getattr(scenario, "CHECK", None)), f"{name}'s scenario has no CHECK"
        assert scenario.CHECK.__doc__, f"{name}'s CHECK does not say what it checks"
        assert len((scenario.__doc__ or "").strip().splitlines()) >= 3, f"{name}: no SHOWS notes"
        assert len(scenario.STEPS) == sum(len(r["steps"]) for r in demo.scenario_runs(scenario))


def test_the_title_is_one_line_and_what_it_shows_starts_after_it():
    """A title written over two lines of the docstring is still the title (s12's spilled)."""
    for name in DEMOS:
        lines = demo.intro(name, demo.chapter_file(name), demo.load_scenario(name)).splitlines()
        assert re.match(rf"=== {name}\w* demo: ", lines[0]) and lines[1:3] == ["", "What it shows:"], lines[:4]
    lines = demo.intro("s12", demo.chapter_file("s12"), demo.load_scenario("s12")).splitlines()
    assert lines[0].endswith("an MCP server's tool, deferred, is found with tool_search.")
    assert lines[3].startswith("  The workspace is a git repository"), lines[3]
    assert demo.title_and_notes("t: one\ntwo\n\nnotes") == ("t: one two", "notes")


@pytest.mark.e2e("s01")
def test_demo_all_runs_every_demo_to_its_end_behind_a_proxy(everything):
    out = everything["out"]
    assert everything["code"] == 0, out[-6000:]
    assert "Traceback" not in out and "FAILED" not in out
    assert f"=== demo all: {len(DEMOS)} of {len(DEMOS)} demos ok ===" in out
    summary = out.split("=== demo all:")[1].splitlines()[1:]
    assert [line.split()[:2] for line in summary] == [[name, "ok"] for name in DEMOS]
    for name in DEMOS:   # every reply used, nothing left over, and the outcome checked
        steps = len(demo.load_scenario(name).STEPS)
        line = next(x for x in out.splitlines() if x.startswith(f"demo {name}: ok ("))
        assert f"{steps}/{steps} scripted replies used" in line and ", check held: " in line
    assert out.count("What is faked:") == len(DEMOS)      # each says so before it runs
    assert out.count("=== What the model received:") == len(DEMOS)
    assert "input_tokens=168,500): a fixed number" in out  # s06's jump is scripted
    assert "alice -> lead  shutdown_response [approve true]" in out  # s11 shows its message log
    root = everything["root"]
    assert not [p for p in os.listdir(root) if "-home-" in p]       # homes removed; without --keep
    kept = sorted(p for p in os.listdir(root) if p.startswith("agent-demo-"))  # the workspaces are
    assert sorted({p.split("-")[2] for p in kept}) == sorted(DEMOS)  # not (the failing demo's test)
    assert len([p for p in kept if p.startswith("agent-demo-agent-")]) == 3   # agent: one per run
    for name in DEMOS:   # the request log sits in each demo's first workspace
        assert any(os.path.isfile(os.path.join(root, p, "requests.jsonl")) for p in kept
                   if p.startswith(f"agent-demo-{name}-"))
    s06 = part(out, "s06")
    show_requests_of_s06(s06, next(Path(root, p) for p in kept if p.startswith("agent-demo-s06-")))


# --- each mechanism, as its demo shows it -----------------------------------------------------

def test_s07_each_allowed_call_names_the_layer_that_allowed_it(everything):
    run = transcript(part(everything["out"], "s07"))
    calls = re.findall(r"^> (\w+) ", run, re.M)
    said = re.findall(r"^  (allowed|error: Permission denied) \(([^)]+)\)", run, re.M)
    assert len(calls) == 8 and len(said) == 8, (calls, said)   # each call, one verdict line
    allowed = [layer for verdict, layer in said if verdict == "allowed"]
    assert allowed == ["sandbox", "the user", "rule", "mode", "sandbox"], allowed
    assert "  allowed (rule): allowed by write_file(notes.txt) in " in run


def test_s08_a_hook_allows_one_asks_the_mode_is_named_and_hooks_log_is_printed(everything):
    text = part(everything["out"], "s08")
    assert "Permission mode: acceptEdits (AGENT_PERMISSION_MODE=acceptEdits" in text        # the intro
    assert "[permission mode: acceptEdits | sandbox:" in text                              # the start-up
    assert ("permission needed: package.json sets the dependencies: a human decides, even in "
            "acceptEdits mode") in text                                   # an ask hook, the mode it read
    assert "  allowed (hook project#3): a Python one-liner in the project" in text          # an allow hook
    log = text.split(".agent/hooks.log:\n")[1].split("\n\n")[0].splitlines()             # printed at the end
    outcomes = [re.sub(r"^\s*\S+ ", "", line) for line in log]
    for event, hook, outcome in (("session_start", 1, "ok"), ("pre_tool_use", 2, "blocked:"),
                                 ("pre_tool_use", 3, "allow"), ("pre_tool_use", 4, "ask"),
                                 ("post_tool_use", 5, "blocked: lint")):
        assert any(re.match(rf"{event} project#{hook} command [\d.]+s {outcome}", x) for x in outcomes), \
            (event, hook, outcomes)


def test_s09_a_second_process_resumes_with_continue_and_side_calls_are_labelled(everything):
    text = part(everything["out"], "s09")
    assert "--- run 2 of 2: a second process resumes it (--continue)" in text
    assert '$ python s09_memory.py --continue "What must hello.py' in text
    assert re.search(r"^\[resumed \d{8}-\d{6}-\w+: 4 messages\]$", text, re.M)
    view = text.split("=== What the model received:")[1]
    heads = re.findall(r"^--- request \d+ from ([\w ]+): POST", view, re.M)
    assert heads == ["recall side call", "main loop", "main loop", "extraction side call",   # run 1
                     "recall side call", "main loop", "extraction side call"], heads          # run 2
    resumed = view.split(">>> run 2 of 2:")[1]
    assert "messages: 5 (4 restored from run 1's session: the 3 of request 3 and its reply, 1 new)" in resumed
    assert re.search(r"^  = \[0\] user: 3 blocks$", resumed, re.M)                 # the restored history
    assert "  = [3] assistant: request 3's reply: text" in resumed


def test_s10_a_schedule_fires_while_idle_a_background_agent_notifies_and_task_list_is_whole(everything):
    text = part(everything["out"], "s10")
    run = transcript(text)
    assert "Done: csv_sum.py" in run and "[schedule s5ca1ab1e fired (* * * * *)" in run
    answer, fired = run.index("Done: csv_sum.py"), run.index("[schedule s5ca1ab1e fired (* * * * *)")
    assert answer < fired and run[:fired].endswith("s10 >> ")     # at the idle REPL's prompt
    view = text.split("=== What the model received:")[1]
    assert "<<< SCHEDULED PROMPT" in view and "from background agent" in view
    notes = re.findall(r'"<task-notification>.*<<< NOTIFICATION', view)
    assert len(notes) == 2 and any("<exit-code>0" in n for n in notes), notes   # the test run's
    assert "[background: " in run and "[completed] agent general-purpose: write the README]" in run
    whole = ("          | 1 ready, 1 in progress, 1 blocked, 1 completed\n"
             "          | #3 [ready] Write the README\n"
             "          | #2 [in_progress] Test csv_sum.py\n"
             "          | #4 [blocked by #2, #3] Tag release 0.1\n"
             "          | #1 [completed] Write csv_sum.py\n")
    assert whole in view                                             # task_list in full, in its order


def test_s11_each_request_is_headed_by_its_sender_and_status_lines_stand_alone(everything):
    text = part(everything["out"], "s11")
    view = text.split("=== What the model received:")[1]
    heads = re.findall(r"^--- request \d+(?: from (\w+))?: POST", view, re.M)
    assert len(heads) == 17 and set(heads) == {"lead", "alice", "bob"}, heads
    assert heads.count("lead") == 4
    run = transcript(text)
    assert len(re.findall(r"\[context \d", run)) == 4                          # the lead's four calls
    assert not re.search(r"[^\n]\[context \d", run), "a status line shares its line"


def test_s12_shows_the_mcp_exchange_and_a_deferred_tool_found_by_tool_search(everything):
    text = part(everything["out"], "s12")
    for arrow, method in (("<-", "initialize"), ("->", "result"), ("<-", "notifications/initialized"),
                          ("<-", "tools/list"), ("<-", "tools/call")):
        assert re.search(rf"^  {arrow} {re.escape(method)} +\{{\"jsonrpc\": \"2.0\"", text, re.M), (arrow, method)
    assert '"params": {"name": "word_count", "arguments": {"text": ' in text
    view = text.split("=== What the model received:")[1]
    assert "<<< DEFERRED TOOLS" in view and 'tool_use tool_search {"query": "count"}' in view
    assert "[+mcp__words__word_count since request" in view
    assert '          | <function>{"name": "mcp__words__word_count"' in view   # the definition it loaded


def test_agent_full_has_its_own_demo_one_task_three_front_ends(everything):
    text = part(everything["out"], "agent")
    assert "worktree" not in text.split("=== What the model received:")[0]   # not s12's scenario
    terminal = text.split("--- run 1 of 3: at a terminal: the interactive RichUI")[1].split("--- run 2 of 3")[0]
    frame = [line for line in terminal.splitlines() if line.startswith(("+", "|"))]
    assert frame[0] == "+" + "-" * 120 + "+" and all(demo.columns(x) == 122 for x in frame), "not 120 wide"
    screen = "\n".join(frame)
    assert "|agent >> pages() in pager.py" in screen and "|╭─ edit_file  pager.py ─" in screen
    assert "|│ +range(0, len(items), size)" in screen and "mode acceptEdits" in screen
    assert "**" not in screen                                         # Markdown, rendered
    headless = text.split("--- run 2 of 3: headless, one JSON result")[1].split("--- run 3 of 3")[0]
    result = json.loads(headless[headless.index("\n{\n"):headless.index("\n}\n") + 2])
    assert result["type"] == "result" and result["num_turns"] == 4 and result["permission_denials"]
    stream = text.split("--- run 3 of 3: headless, the events as JSON lines")[1].split("=== What the model")[0]
    kinds = re.findall(r'^\{"type": "(\w+)"', stream, re.M)
    assert kinds[0] == "system" and kinds[-1] == "result" and kinds.count("assistant") == 4, kinds


# --- the machinery: the screen, the relay ------------------------------------------------------

def test_the_screen_renders_cursor_moves_erases_and_wrapping_as_a_terminal_would():
    screen = Screen(10, 3)
    assert screen.feed("hello\r\nworld\x1b[1A\x1b[2K\rHELLO\x1b[1B\r\x1b[3C!") == ""
    assert screen.text() == "HELLO\nwor!d\n"
    screen.feed("\r\n0123456789abc")                # wraps at the right margin
    assert screen.text().splitlines()[-2:] == ["0123456789", "abc"]
    assert screen.feed("\x1b[6n") == "\x1b[3;4R"      # the cursor report, rows and columns from 1
    screen.feed("\x1b[2J\x1b[H\x1b[31mred\x1b[0m\x1b]0;title\x07")   # clear, colour, a title: no text
    assert screen.visible().splitlines()[0] == "red" and "HELLO" in screen.text()   # scrollback stays


def test_a_status_line_on_stderr_never_lands_inside_a_line_of_the_answer(tmp_path, capfd):
    """The chapter writes part of an answer, a status line, the rest: the line stays whole."""
    script = ("import sys, time\nsys.stdout.write('Release note ('); sys.stdout.flush()\n"
              "sys.stderr.write('[context 1/2 tokens]\\n'); sys.stderr.flush(); time.sleep(0.3)\n"
              "sys.stdout.write('13 words)\\n'); sys.stdout.flush()\n")
    (tmp_path / "chapter.py").write_text(script)
    code, out, err, both = demo.run_chapter(tmp_path / "chapter.py", [], tmp_path, dict(os.environ))
    assert (code, out, err) == (0, "Release note (13 words)\n", "[context 1/2 tokens]\n")
    assert both == "Release note (13 words)\n[context 1/2 tokens]\n"
    assert capfd.readouterr().out == "Release note (13 words)\n"


def show_requests_of_s06(out, kept):
    """s06's --show-requests output and its --keep workspace: what the model received."""
    assert "system (" in out and "in full" in out and "system: (unchanged)" in out
    assert "messages: 3 (1 as in request 1, 2 new)" in out        # the history grows
    assert "messages: 5 (3 as in request 2, 2 new)" in out        # ... only the new part shown
    assert "<<< PERSISTED" in out and "saved to: .agent/tool-results/" in out
    assert "<<< CLEARED" in out and "(was 28," in out              # the batch clear, in place
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
