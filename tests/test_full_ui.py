"""agent_full's interactive UI (full.4) and its slash commands (full.5).

The RichUI is fed events in-process and its output read back from a recording
rich Console; the completer, the @path mentions and the commands are plain
functions. One test drives the real program in a tmux pane against the scripted
API: what a human at a terminal sees and types.
"""
import io
import os
import shutil
import subprocess
import sys
import threading
import time

import pytest
from rich.console import Console

from conftest import ROOT, message_bodies, run_chapter
from fake_api import reply, tool

pytestmark = pytest.mark.parametrize("mod", ["agent_full"], indirect=True)

USAGE = {"input_tokens": 100, "cache_creation_input_tokens": 0, "cache_read_input_tokens": 300,
         "output_tokens": 50}


def rich_ui(mod, width=80):
    console = Console(record=True, force_terminal=True, width=width, file=io.StringIO())
    ui = mod.RichUI(console)
    mod.FRONT_END["current"] = ui
    return ui, console


def status(mod, **over):
    fields = dict(text="", context=50_000, window=200_000, usage=USAGE, cost=0.0123, mode="acceptEdits",
                  model="claude-test", background=2, teammates=1) | over
    mod.emit(mod.EVENTS.status, **fields)


# --- RichUI rendering -------------------------------------------------------------------------

def test_the_answer_is_rendered_as_markdown(mod):
    ui, console = rich_ui(mod)
    ui.waiting()
    for piece in ["# Plan\n\n", "Some **bold** words and `code`.\n\n", "- one\n", "- two\n"]:
        mod.emit(mod.EVENTS.text, text=piece)
    assert ui.live is not None  # live while it streams
    mod.emit(mod.EVENTS.reply, id="m1", model="claude-test", stop_reason="end_turn", content=[], usage=USAGE)
    text = console.export_text()
    assert "**" not in text and "# Plan" not in text and "`code`" not in text  # the marks are rendered
    assert "Plan" in text and "bold" in text and "• one" in text and "• two" in text
    assert ui.live is None


def test_status_line_has_model_context_tokens_cost_cache_mode_and_background(mod):
    ui, console = rich_ui(mod, width=200)
    mod.emit(mod.EVENTS.reply, id="m1", model="claude-test", stop_reason="end_turn", content=[], usage=USAGE)
    status(mod)
    line = console.export_text().strip()
    for part in ("claude-test", "context 25%", "400 in", "50 out", "$0.0123", "cache 75%", "mode acceptEdits",
                 "2 background", "1 teammates"):
        assert part in line, part


def test_tool_call_is_a_panel_with_a_preview_and_an_edit_is_a_coloured_diff(mod):
    ui, console = rich_ui(mod)
    mod.emit(mod.EVENTS.tool_start, id="t1", name="bash", input={"command": "ls -la"})
    mod.emit(mod.EVENTS.tool_end, id="t1", content="\n".join(f"line{i}" for i in range(20)), is_error=False)
    mod.emit(mod.EVENTS.tool_start, id="t2", name="edit_file",
             input={"path": "a.py", "old_string": "x = 1\n", "new_string": "x = 2\n"})
    mod.emit(mod.EVENTS.tool_end, id="t2", content="Edited a.py", is_error=False)
    mod.emit(mod.EVENTS.turn_end, reason="end_turn", result="", session_id="", cost=0.0)
    text = console.export_text(clear=False)
    assert "╭─ bash  ls -la" in text and "line5" in text and "line6" not in text and "14 more lines" in text
    assert "╭─ edit_file  a.py" in text and "-x = 1" in text and "+x = 2" in text
    styled = console.export_text(styles=True)
    assert "\x1b[31m-x = 1" in styled and "\x1b[32m+x = 2" in styled  # red and green


def test_a_failed_call_shows_its_error_and_a_subagent_is_dimmed_with_its_name(mod):
    ui, console = rich_ui(mod)
    mod.emit(mod.EVENTS.tool_start, id="t1", name="read_file", input={"path": "nope"})
    mod.emit(mod.EVENTS.tool_end, id="t1", content="Error: no such file", is_error=True)
    with mod.acting_as(mod.AgentState(mod.agent_state().workdir)) as child:
        child.label = "helper"
        mod.say("[child progress]")
    text = console.export_text()
    assert "Error: no such file" in text and "[helper] [child progress]" in text


def test_a_spinner_waits_and_goes_when_anything_else_is_shown(mod):
    ui, console = rich_ui(mod)
    ui.waiting()
    assert ui.live is not None and ui.live.is_started
    live = ui.live
    mod.say("[a note]")
    assert not live.is_started and live.transient  # a terminal erases it
    assert ui.live is not live and ui.live.is_started  # and it comes back below the note
    assert console.export_text().endswith("[a note]\n")
    mod.emit(mod.EVENTS.turn_end, reason="end_turn", result="", session_id="", cost=0.0)
    assert ui.live is None


def test_the_question_is_a_clear_prompt_and_its_answer_returned(mod, monkeypatch):
    ui, console = rich_ui(mod)
    monkeypatch.setattr("builtins.input", lambda prompt="": "a")
    assert mod.ask_human("Allow bash `rm x`? [y/N/a] ") == "a"
    text = console.export_text()
    assert "the agent asks" in text and "Allow bash `rm x`?" in text


def test_a_question_at_the_end_of_input_is_no(mod, monkeypatch):
    rich_ui(mod)

    def eof(prompt=""):
        raise EOFError
    monkeypatch.setattr("builtins.input", eof)
    assert mod.ask_human("Allow? [y/N] ") == "no"


def test_no_color_or_no_terminal_keeps_plain_text(mod, monkeypatch):
    from prompt_toolkit.application import create_app_session
    from prompt_toolkit.input import create_pipe_input
    from prompt_toolkit.output import DummyOutput

    class Tty(io.StringIO):
        def isatty(self):
            return True
    monkeypatch.setattr(sys, "stdout", Tty())
    monkeypatch.setattr(sys, "stdin", io.StringIO())  # input from a pipe: the chapters' read_line and text
    monkeypatch.delenv("NO_COLOR", raising=False)
    assert type(mod.interactive_front_end()) is mod.PlainText and "editor" not in mod.FRONT_END
    monkeypatch.setattr(sys, "stdin", Tty())
    with create_pipe_input() as pipe, create_app_session(input=pipe, output=DummyOutput()):
        assert isinstance(mod.interactive_front_end(), mod.RichUI) and "editor" in mod.FRONT_END
        mod.FRONT_END.pop("editor")
        monkeypatch.setenv("NO_COLOR", "")  # present but empty: colour stays on (no-color.org)
        assert isinstance(mod.interactive_front_end(), mod.RichUI)
        mod.FRONT_END.pop("editor")
        monkeypatch.setenv("NO_COLOR", "1")  # colour off, the line editor (@path, history, Tab) still on
        assert type(mod.interactive_front_end()) is mod.PlainText and "editor" in mod.FRONT_END
        mod.FRONT_END.pop("editor")
    monkeypatch.delenv("NO_COLOR")
    monkeypatch.setattr(sys, "stdout", io.StringIO())  # output to a file: plain, no editor
    assert type(mod.interactive_front_end()) is mod.PlainText and "editor" not in mod.FRONT_END


# --- input: completion and @path ------------------------------------------------------------

def test_tab_completes_commands_skills_and_paths(mod, workspace):
    skill = workspace / ".agent" / "skills" / "deploy-app"
    skill.mkdir(parents=True)
    (skill / "SKILL.md").write_text("---\nname: deploy-app\ndescription: Deploy it\n---\nDo it.\n")
    (workspace / "src").mkdir()
    (workspace / "src" / "main.py").write_text("print(1)\n")
    (workspace / "README.md").write_text("hi\n")
    assert mod.completions("/comp", workspace) == [("/compact", 5)]
    assert ("/deploy-app", 4) in mod.completions("/dep", workspace)
    assert mod.completions("look at @sr", workspace) == [("@src/", 3)]
    assert mod.completions("look at @src/m", workspace) == [("@src/main.py", 6)]
    assert mod.completions("/forget RE", workspace) == [("README.md", 2)]
    assert mod.completions("plain words", workspace) == []
    assert mod.completions("@../", workspace) == []  # never outside the workdir


def test_the_prompt_toolkit_completer_gives_the_same(mod, workspace):
    from prompt_toolkit.document import Document
    found = list(mod.SlashCompleter().get_completions(Document("/comp"), None))
    assert [(c.text, c.start_position) for c in found] == [("/compact", -5)]


def test_a_mention_attaches_the_file_and_only_inside_the_workdir(mod, workspace, tmp_path):
    (workspace / "notes.md").write_text("the notes\n")
    (tmp_path / "secret.txt").write_text("secret\n")
    line = mod.attach_mentions("summarise @notes.md, and @../secret.txt and mail@example.com")
    assert line.startswith("summarise @notes.md, and")
    assert '<file path="notes.md">\nthe notes\n' in line and "secret\n" not in line and line.count("<file") == 1


def test_a_big_mention_is_cut(mod, workspace, monkeypatch):
    monkeypatch.setattr(mod, "MENTION_CAP", 100)
    (workspace / "big.txt").write_text("x" * 1000)
    line = mod.attach_mentions("@big.txt")
    assert "x" * 100 in line and "x" * 101 not in line and "cut at 100 bytes" in line


def test_the_line_editor_keeps_history_and_ctrl_c_twice_quits(mod, workspace, monkeypatch):
    from prompt_toolkit.application import create_app_session
    from prompt_toolkit.input import create_pipe_input
    from prompt_toolkit.output import DummyOutput
    (workspace / "f.txt").write_text("content of f\n")
    with create_pipe_input() as pipe, create_app_session(input=pipe, output=DummyOutput()):
        editor = mod.LineEditor()
        pipe.send_text("look at @f.txt\r")
        assert mod.attach_mentions("look at @f.txt") == editor.read("> ")
        pipe.send_text("first line\\\rsecond\r")
        assert editor.read("> ") == "first line\nsecond"
        pipe.send_text("\x1b\rthird\r")  # Esc+Enter: a new line
        assert editor.read("> ") == "\nthird"
        pipe.send_text("\x03\x03")
        with pytest.raises(EOFError):
            editor.read("> ")
        pipe.send_text("\x04")  # Ctrl+D
        with pytest.raises(EOFError):
            editor.read("> ")
    assert "look at @f.txt" in (workspace.parent / "home" / ".agent" / "history").read_text()


def test_a_home_that_cannot_hold_the_history_is_one_line(mod, workspace, monkeypatch, capsys):
    from prompt_toolkit.application import create_app_session
    from prompt_toolkit.input import create_pipe_input
    from prompt_toolkit.output import DummyOutput
    home = workspace.parent / "home"
    (home / ".agent").write_text("a file where the folder would go")
    with create_pipe_input() as pipe, create_app_session(input=pipe, output=DummyOutput()):
        editor = mod.LineEditor()
        pipe.send_text("still works\r")
        assert editor.read("> ") == "still works"
    assert "input history not saved" in capsys.readouterr().err


def test_a_job_that_falls_due_while_the_prompt_waits_runs(mod, workspace, monkeypatch):
    from prompt_toolkit.application import create_app_session
    from prompt_toolkit.input import create_pipe_input
    from prompt_toolkit.output import DummyOutput
    monkeypatch.setattr(mod, "INPUT_POLL", 0.01)
    fired = []
    monkeypatch.setattr(mod, "fire_job", lambda key, now: fired.append(key) or
                        {"id": "j1", "cron": "* * * * *", "prompt": "the job's prompt"})
    with create_pipe_input() as pipe, create_app_session(input=pipe, output=DummyOutput()):
        editor = mod.LineEditor()
        due = mod.agent_state().schedules["due"]  # the checker thread's queue
        timer = threading.Timer(0.2, lambda: due.append(("j1", "x")))
        timer.start()
        turn = editor.read("> ")  # nothing typed: the job comes in instead
        timer.join()
    assert fired and "the job's prompt" in turn and turn.startswith("<scheduled-prompt id=j1>")


# --- slash commands ---------------------------------------------------------------------------

EVERY = ("help clear compact context cost model mode plan permissions hooks memory forget resume sessions "
         "tasks bg schedules team worktrees mcp skills agents init exit").split()


def test_every_mechanism_has_its_command(mod):
    assert not [name for name in EVERY if name not in mod.all_commands()]


def run(mod, line, history=None, client=None):
    ctx = {"client": client, "history": [] if history is None else history}
    return mod.handle_slash(line, ctx), ctx


def test_context_shows_the_window_by_part(mod, capsys):
    history = [{"role": "user", "content": "hello " * 100},
               {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "bash",
                                                  "input": {"command": "ls"}}]},
               {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "x" * 4000}]}]
    run(mod, "/context", history)
    out = capsys.readouterr().out
    assert "of 200,000 tokens" in out
    rows = {line.split()[0]: line for line in out.splitlines()[1:]}
    assert set(rows) >= {"system", "tools", "user", "assistant", "tool"}
    results = next(r for r in out.splitlines() if "tool results" in r)
    assert 1000 <= int(results.split()[2].replace(",", "")) < 1100  # 4,000 characters, ~4 a token


def test_cost_model_and_init(mod, capsys, monkeypatch):
    mod.agent_state().session["cost"] = 0.5
    run(mod, "/cost")
    assert "~$0.5000" in capsys.readouterr().out
    run(mod, "/model claude-other")
    assert mod.model_id() == "claude-other"
    run(mod, "/model")
    assert "claude-other" in capsys.readouterr().out
    text, ctx = run(mod, "/init keep it short")
    assert "AGENTS.md" in text and text.endswith("Also: keep it short")


def test_clear_starts_a_new_session(mod):
    state = mod.agent_state()
    state.record = mod.new_session(state)
    old = state.record["path"]
    history = [{"role": "user", "content": "hi"}]
    run(mod, "/clear", history)
    assert history == [] and state.record["path"] != old


def test_listing_commands_print_what_the_tools_tell(mod, capsys):
    for line, expect in (("/tasks", "task board is empty"), ("/bg", "No background commands"),
                         ("/agents", "explore"), ("/sessions", "no sessions")):
        _, ctx = run(mod, line)
        assert "error" not in ctx, line
        assert expect in capsys.readouterr().out, line
    _, ctx = run(mod, "/schedules")
    assert "error" not in ctx
    _, ctx = run(mod, "/worktrees")  # not a git repository: the tool's own words, one line
    assert ctx["error"].startswith("Worktrees need a git repository") and "Traceback" not in capsys.readouterr().err
    _, ctx = run(mod, "/tasks 12")
    assert ctx["error"] == "/tasks takes no argument (got '12')"  # a clear line, not a crash


def test_exit_quits(mod):
    with pytest.raises(SystemExit):
        run(mod, "/exit")


def test_init_sends_its_prompt_to_the_model(mod, api, client):
    api.script([reply("Wrote AGENTS.md.")])
    history = []
    text, _ = run(mod, "/init", history, client)
    history.append({"role": "user", "content": text})
    assert mod.agent_loop(client, history) == "end_turn"
    assert "write an AGENTS.md" in str(message_bodies(api)[0]["messages"])


# --- a real terminal ----------------------------------------------------------------------------

TMUX_SOCKET = f"fui{os.getpid()}"  # a tmux server of the test's own, never the developer's


def tmux(*args):
    return subprocess.run(["tmux", "-L", TMUX_SOCKET, *args], capture_output=True, text=True, timeout=10)


def screen(name):
    return tmux("capture-pane", "-p", "-t", name, "-S", "-200").stdout


def wait_for(name, test, what, timeout=20):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if test(text := screen(name)):
            return text
        time.sleep(0.1)
    raise AssertionError(f"no {what} on the screen:\n{screen(name)}")


@pytest.mark.e2e("agent_full")
@pytest.mark.skipif(not shutil.which("tmux"), reason="needs tmux")
def test_the_interactive_ui_in_a_real_terminal(mod, api, workspace, tmp_path):
    name = f"fui{os.getpid()}"
    env = {"ANTHROPIC_API_KEY": "test", "ANTHROPIC_BASE_URL": api.url, "HOME": str(tmp_path / "home"),
           "AGENT_AUTO_MEMORY": "0", "AGENT_PERMISSION_MODE": "default", "TERM": "xterm-256color",
           "PATH": os.environ["PATH"], "NO_PROXY": "127.0.0.1,localhost", "no_proxy": "127.0.0.1,localhost"}
    (workspace / "a.txt").write_text("a\n")
    api.script([
        reply("# Heading\n\nSome **bold** text."),
        reply("slow " * 800, delay=0.05),  # ~17 s of streaming: cancelled long before its end
        reply("After the cancel."),
        reply(tool("write_file", {"path": "out.txt", "content": "one\n"})),
        reply(tool("write_file", {"path": "out.txt", "content": "two\n"})),
        reply("Both done."),
    ])
    command = " ".join([f"{k}={v!r}" for k, v in env.items()] + [sys.executable, str(ROOT / "agent_full.py")])
    assert tmux("new-session", "-d", "-s", name, "-x", "120", "-y", "50", "-c", str(workspace),
                f"env -i {command}").returncode == 0
    try:
        wait_for(name, lambda s: "agent >>" in s, "prompt")
        tmux("send-keys", "-t", name, "hello", "Enter")
        # the first answer waits for the SDK, which loads behind the prompt (full.9): on a
        # loaded machine that is seconds more than any later step, hence its longer wait
        text = wait_for(name, lambda s: "bold text" in s, "answer", timeout=60)
        assert "**bold**" not in text and "# Heading" not in text  # rendered Markdown
        wait_for(name, lambda s: "mode default" in s and "$0." in s, "status line with cost and mode")
        tmux("send-keys", "-t", name, "/comp", "Tab")
        wait_for(name, lambda s: "/compact" in s, "completion")
        tmux("send-keys", "-t", name, "C-u")
        tmux("send-keys", "-t", name, "go on", "Enter")
        wait_for(name, lambda s: "slow slow" in s, "streaming")
        tmux("send-keys", "-t", name, "C-c")
        wait_for(name, lambda s: "interrupted" in s, "cancel")
        tmux("send-keys", "-t", name, "again", "Enter")
        wait_for(name, lambda s: "After the cancel." in s, "the next answer")
        tmux("send-keys", "-t", name, "write the file twice", "Enter")
        wait_for(name, lambda s: "the agent asks" in s, "the permission question")
        tmux("send-keys", "-t", name, "a", "Enter")
        text = wait_for(name, lambda s: "Both done." in s, "the last answer")
        assert text.count("the agent asks") == 1  # the second write was not asked about
        assert (workspace / "out.txt").read_text() == "two\n"
        assert "+one" in text and "+two" in text  # the writes as diffs
        assert "thinking" not in text  # the spinner left no trace
        tmux("send-keys", "-t", name, "C-d")
    finally:
        tmux("kill-server")
