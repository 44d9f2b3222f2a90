"""Review findings on agent_full's interactive UI (full.4) and slash commands (full.5).

Each test pins one defect a review found (or a mutation the older tests let
through): escape sequences in the answer, lines from other threads inside the
typed line, @path mentions past the read rules, /clear keeping the old
conversation, the spinner, the history file, Ctrl+C, the status line, slash
command arguments, completion of names with spaces.
"""
import contextlib
import io
import json
import os
import re
import stat
import sys
import threading
import types
from pathlib import Path

import pytest
import yaml
from rich.console import Console

from conftest import chapters_from, message_bodies
from fake_api import reply, tool

FULL = pytest.mark.parametrize("mod", ["agent_full"], indirect=True)
USAGE = {"input_tokens": 100, "cache_creation_input_tokens": 0, "cache_read_input_tokens": 300,
         "output_tokens": 50}
HOSTILE = "All good.\x1b[12A\x1b[J\x1b]2;PWNED-TITLE\x1b\\ nothing to see"


def rich_ui(mod, width=100, height=40):
    console = Console(record=True, force_terminal=True, width=width, height=height, file=io.StringIO())
    ui = mod.RichUI(console)
    mod.FRONT_END["current"] = ui
    return ui, console


def end_reply(mod):
    mod.emit(mod.EVENTS.reply, id="m1", model="claude-test", stop_reason="end_turn", content=[], usage=USAGE)


def rendered(renderable, at=None, height=40):
    """What a Live renderable shows, rendered by a console of its own (at a given clock)."""
    console = Console(file=io.StringIO(), width=100, height=height)
    if at is not None:
        console.get_time = lambda: at
    console.print(renderable)
    return console.file.getvalue()


class Tty(io.StringIO):
    def isatty(self):
        return True


@contextlib.contextmanager
def typed_into(output=None):
    """prompt_toolkit reading from a pipe the test types into; output to nowhere, or `output`."""
    from prompt_toolkit.application import create_app_session
    from prompt_toolkit.input import create_pipe_input
    from prompt_toolkit.output import DummyOutput
    with create_pipe_input() as pipe, create_app_session(input=pipe, output=output or DummyOutput()):
        yield pipe


# --- 1. the answer's escape sequences -------------------------------------------------------

@FULL
def test_the_answer_cannot_move_the_cursor_set_the_title_or_hide_a_link(mod):
    ui, console = rich_ui(mod)
    ui.waiting()
    mod.emit(mod.EVENTS.text, text=HOSTILE + "\n\nsee [https://github.com/psf/black](https://evil.example/x.sh)")
    end_reply(mod)
    raw = console.file.getvalue()
    assert "\x1b[12A" not in raw and "\x1b[J" not in raw and "\x1b]2;" not in raw  # shown, not obeyed
    assert "\x1b]8;" not in raw  # no OSC 8 link: its text could hide its target
    text = console.export_text()
    assert "\\x1b[12A" in text and "nothing to see" in text and "evil.example/x.sh" in text


@FULL
def test_plain_text_at_a_terminal_escapes_the_answer_and_a_pipe_gets_its_bytes(mod, monkeypatch):
    monkeypatch.setattr(sys, "stdout", Tty())
    mod.PlainText().handle({"kind": "text", "label": "", "text": HOSTILE})
    assert "\x1b" not in sys.stdout.getvalue() and "\\x1b]2;PWNED-TITLE" in sys.stdout.getvalue()
    monkeypatch.setattr(sys, "stdout", io.StringIO())
    mod.PlainText().handle({"kind": "text", "label": "", "text": HOSTILE})
    assert sys.stdout.getvalue() == HOSTILE


@FULL
def test_a_result_panel_shows_control_characters_as_escapes_and_an_error_in_red(mod):
    ui, console = rich_ui(mod)
    mod.emit(mod.EVENTS.tool_start, id="t1", name="bash", input={"command": "cat x"})
    mod.emit(mod.EVENTS.tool_end, id="t1", content="before\x1b[2Jafter", is_error=False)
    mod.emit(mod.EVENTS.tool_start, id="t2", name="bash", input={"command": "false"})
    mod.emit(mod.EVENTS.tool_end, id="t2", content="Error: exit status 2", is_error=True)
    mod.emit(mod.EVENTS.turn_end, reason="end_turn", result="", session_id="", cost=0.0)
    assert "\x1b[2J" not in console.file.getvalue()
    styled = console.export_text(styles=True)
    assert "before\\x1b[2Jafter" in styled
    assert "\x1b[34m╭─\x1b[0m\x1b[34m bash  cat x" in styled  # blue
    assert "\x1b[31m╭─\x1b[0m\x1b[31m bash  false" in styled  # the error: red


@FULL
def test_a_read_file_result_keeps_its_first_lines_indent(mod):
    text = mod.result_text("     1\talpha\n     2\tbeta\n", False).plain
    assert text.splitlines()[0] == "     1\talpha"


# --- 2. lines from other threads while the human types ---------------------------------------

@FULL
def test_a_line_from_another_thread_prints_above_the_prompt_not_into_it(mod, workspace, monkeypatch):
    from prompt_toolkit.data_structures import Size
    from prompt_toolkit.output.vt100 import Vt100_Output
    screen = Tty()
    ui = mod.RichUI(Console(highlight=False))  # writes to sys.stdout, whatever it is at the time
    mod.FRONT_END["current"] = ui
    monkeypatch.setattr(sys, "stdout", io.StringIO())  # what the terminal would get past prompt_toolkit
    with typed_into(Vt100_Output(screen, lambda: Size(rows=24, columns=80), term="xterm")) as pipe:
        editor = mod.LineEditor()

        def later():
            mod.say("[memory: saved likes-tabs]")  # s09's extraction thread, finishing at the prompt
            pipe.send_text("\r")
        pipe.send_text("now I am typing")
        timer = threading.Timer(0.3, later)
        watch = editor.watch

        def started():  # pre_run: the prompt is up, inside patch_stdout; a clock from before it races
            watch()
            timer.start()
        editor.watch = started
        line = editor.read("agent >> ")
        timer.join()
    assert line == "now I am typing"
    assert "[memory: saved likes-tabs]" in screen.getvalue()  # drawn by prompt_toolkit, above the prompt
    assert "likes-tabs" not in sys.stdout.getvalue()


# --- 3. @path mentions -------------------------------------------------------------------------

@FULL
def test_a_mention_obeys_read_rules_refuses_binary_files_and_says_what_it_did(mod, workspace, tmp_path, capsys):
    home = Path(os.environ["HOME"])
    (home / ".agent").mkdir()
    (home / ".agent" / "config.yaml").write_text(yaml.safe_dump(
        {"permissions": {"deny": ["read_file(secret.txt)", "read_file(**/.env)"]}}))
    state = mod.agent_state()
    state.permissions = mod.load_permissions(workspace)
    (workspace / "notes.md").write_text("NOTES-CONTENT\n")
    (workspace / "secret.txt").write_text("TOP-SECRET-DENIED\n")
    (workspace / ".env").write_text("ANTHROPIC_API_KEY=sk-ant-FAKE-KEY\n")
    (workspace / "bin.png").write_bytes(b"\x89PNG\0\0" + bytes(range(256)) * 40)
    (tmp_path / "outside.txt").write_text("OUTSIDE-CONTENT\n")
    (workspace / "link").symlink_to(tmp_path / "outside.txt")  # a link out of the workspace
    capsys.readouterr()
    line = mod.attach_mentions("look at @notes.md @secret.txt @.env @bin.png @link @missing.txt")
    assert "NOTES-CONTENT" in line and line.count("<file") == 1
    for kept_out in ("TOP-SECRET-DENIED", "sk-ant-FAKE-KEY", "\ufffd", "OUTSIDE-CONTENT"):
        assert kept_out not in line
    told = capsys.readouterr().err
    assert "[@notes.md: attached, 14 bytes]" in told
    assert "[@secret.txt: not attached: denied by read_file(secret.txt)" in told
    assert "[@.env: not attached: " in told, told
    assert "[@bin.png: not attached: a binary file" in told
    assert "[@link: not attached: outside the workspace]" in told
    assert "[@missing.txt: not attached: no such file]" in told


@FULL
def test_the_mentions_of_one_prompt_share_a_budget(mod, workspace, monkeypatch, capsys):
    monkeypatch.setattr(mod, "MENTION_CAP", 100)
    monkeypatch.setattr(mod, "MENTION_BUDGET", 250)
    for name in "abcd":
        (workspace / f"{name}.txt").write_text(name * 150)
    line = mod.attach_mentions("@a.txt @b.txt @c.txt @d.txt")
    assert line.count("a" * 100) == 1 and "b" * 100 in line and "c" * 50 in line and "c" * 51 not in line
    assert "d" * 10 not in line and line.count("<file") == 3
    told = capsys.readouterr().err
    assert "[@d.txt: not attached: this prompt's mentions are over 250 bytes]" in told


# --- 4. /clear -----------------------------------------------------------------------------------

def use_hooks(mod, *items):
    mod.agent_state().permissions["hooks"] = mod.read_hooks("config.yaml", {"hooks": list(items)}, "user", True)


@FULL
def test_clear_leaves_nothing_of_the_old_conversation_and_fires_the_session_hooks(mod, api, client, workspace):
    show_source = f"{sys.executable} -c \"import json,sys; print('source=' + json.load(sys.stdin)['source'])\""
    use_hooks(mod, {"event": "session_start", "action": {"type": "command", "command": show_source}},
              {"event": "session_end", "action": {"type": "command", "command": "cat >> ended.json"}})
    state = mod.agent_state()
    state.record = mod.new_session(state)
    mod.begin_session()
    history = [{"role": "user", "content": "plan the migration"}]
    api.script([reply(tool("todo_write", {"items": [{"content": "Migrate the OLD-CONVERSATION database",
                                                     "status": "in_progress", "active_form": "Migrating"}]})),
                reply("planned")])
    assert mod.agent_loop(client, history) == "end_turn"
    (workspace / "seen.txt").write_text("x\n")
    mod.read_file("seen.txt")
    state.memory["attached"].add("/memory/old.md")
    state.compaction["failures"] = 2
    state.hook_notes.append({"type": "text", "text": "OLD-NOTE"})
    assert state.plan["items"] and state.files

    ctx = {"client": client, "history": history}
    mod.handle_slash("/clear", ctx)
    assert history == [] and "error" not in ctx
    assert state.plan["items"] == [] and state.files == {} and state.memory["attached"] == set()
    assert state.compaction["failures"] == 0
    assert json.loads((workspace / "ended.json").read_text())["reason"] == "clear"

    history.append({"role": "user", "content": "a new unrelated task"})
    api.script([reply("fresh")])
    assert mod.agent_loop(client, history) == "end_turn"
    sent = json.dumps(message_bodies(api)[-1]["messages"])
    assert "OLD-CONVERSATION" not in sent and "OLD-NOTE" not in sent
    assert "source=clear" in sent  # a SessionStart hook's context comes back for the new conversation


# --- 5. the spinner --------------------------------------------------------------------------------

@FULL
def test_a_running_tool_has_a_spinner_that_names_it_and_moves(mod):
    ui, console = rich_ui(mod)
    mod.emit(mod.EVENTS.tool_start, id="t1", name="bash", input={"command": "sleep 6; echo tests passed"})
    assert ui.live is not None and ui.live.is_started
    assert "bash  sleep 6; echo tests passed" in rendered(ui.live.renderable, at=100.0)
    assert rendered(ui.live.renderable, at=100.5) != rendered(ui.live.renderable, at=100.0)  # it moves
    mod.say("[a hook note]")  # a line printed mid-wait: the spinner comes back under it
    assert ui.live is not None and "bash  sleep 6" in rendered(ui.live.renderable)
    mod.emit(mod.EVENTS.tool_end, id="t1", content="tests passed", is_error=False)
    assert ui.live is not None and "thinking" in rendered(ui.live.renderable)  # the results went back
    end_reply(mod)
    mod.emit(mod.EVENTS.turn_end, reason="end_turn", result="", session_id="", cost=0.0)
    assert ui.live is None


@FULL
def test_the_spinner_stays_off_while_a_question_is_answered(mod, monkeypatch):
    ui, console = rich_ui(mod)
    live_while_asked = []
    monkeypatch.setattr("builtins.input", lambda prompt="": live_while_asked.append(ui.live) or "y")
    mod.emit(mod.EVENTS.tool_start, id="t1", name="bash", input={"command": "make"})
    assert mod.ask_human("Allow bash `make`? [y/N/a] ") == "y"
    assert live_while_asked == [None] and ui.live is not None  # off for the answer, back for the run


@FULL
def test_a_long_answer_streams_its_last_lines_and_ends_whole(mod):
    ui, console = rich_ui(mod, height=10)
    ui.waiting()
    mod.emit(mod.EVENTS.text, text="".join(f"line {i}\n\n" for i in range(50)))
    streaming = [line.strip() for line in rendered(ui.live.renderable, height=10).splitlines()]
    assert "line 49" in streaming and "line 0" not in streaming and len(streaming) <= 9
    end_reply(mod)
    text = console.export_text()
    assert all(re.search(rf"^line {i} *$", text, re.M) for i in range(50))


# --- 6. the history file ------------------------------------------------------------------------

@FULL
def test_a_history_path_that_cannot_be_opened_is_one_line(mod, workspace, capsys):
    from prompt_toolkit.history import InMemoryHistory
    (Path(os.environ["HOME"]) / ".agent" / "history").mkdir(parents=True)  # a folder where the file goes
    with typed_into() as pipe:
        editor = mod.LineEditor()
        assert isinstance(editor.session.history, InMemoryHistory)
        pipe.send_text("still works\r")
        assert editor.read("> ") == "still works"
    err = capsys.readouterr().err
    assert "input history not saved" in err and "Traceback" not in err


@FULL
def test_the_history_is_private_and_trimmed(mod, workspace, monkeypatch):
    monkeypatch.setattr(mod, "HISTORY_CAP", 10_000)
    path = Path(os.environ["HOME"]) / ".agent" / "history"
    path.parent.mkdir()
    path.write_text("".join(f"\n# 2026-01-01 00:00:{i:02}\n+prompt number {i}\n" for i in range(2000)))
    path.chmod(0o644)  # as an earlier version made it
    with typed_into() as pipe:
        editor = mod.LineEditor()
        pipe.send_text("a pasted sk-ant-SECRET\r")
        editor.read("> ")
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    text = path.read_text()
    assert len(text) < 10_100 and text.startswith("\n# ") and "+prompt number 1999\n" in text
    assert "+prompt number 0\n" not in text and text.endswith("+a pasted sk-ant-SECRET\n")


@FULL
def test_a_history_file_is_private_new_or_old(mod, workspace):
    path = Path(os.environ["HOME"]) / ".agent" / "history"
    with typed_into():
        mod.LineEditor()
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    path.write_text("\n# 2026-01-01 00:00:00\n+an old prompt\n")
    path.chmod(0o644)  # as an earlier version made it
    with typed_into():
        mod.LineEditor()
    assert stat.S_IMODE(path.stat().st_mode) == 0o600 and "+an old prompt" in path.read_text()


# --- 8. Ctrl+C --------------------------------------------------------------------------------------

@FULL
def test_ctrl_c_clears_a_typed_line_and_quits_only_twice_in_a_row_at_an_empty_prompt(mod, workspace):
    with typed_into() as pipe:
        editor = mod.LineEditor()
        pipe.send_text("a long prompt I decided against\x03\x03")  # cleared, then once at the empty prompt
        pipe.send_text("next\r")
        assert editor.read("> ") == "next"
        pipe.send_text("\x03")  # once at an empty prompt: a step towards quitting only
        pipe.send_text("again\r")
        assert editor.read("> ") == "again"
        pipe.send_text("\x03typed on\x03\x03")  # the count starts over once a line is typed
        pipe.send_text("last\r")
        assert editor.read("> ") == "last"
        pipe.send_text("\x03\x03")
        with pytest.raises(EOFError):
            editor.read("> ")


# --- 9. the status line --------------------------------------------------------------------------

@FULL
def test_the_status_line_counts_only_running_teammates(mod):
    seen = []
    mod.FRONT_END["current"] = types.SimpleNamespace(handle=seen.append)
    state = mod.agent_state()
    state.teammates["alice"] = {"pid": 2 ** 22 + 7, "start": 1, "cmdline": "gone", "proc": None}  # ended
    message = types.SimpleNamespace(id="m1", model="claude-test", stop_reason="end_turn", content=[],
                                    usage=types.SimpleNamespace(**USAGE))
    mod.report_call(message, 1000, "")
    assert [e["teammates"] for e in seen if e["kind"] == "status"] == [0]


# --- 10. slash command arguments ------------------------------------------------------------------

def slash(mod, line):
    ctx = {"client": None, "history": []}
    return mod.handle_slash(line, ctx), ctx


@FULL
@pytest.mark.parametrize("name", ["tasks", "schedules", "worktrees"])
def test_a_listing_command_given_an_argument_says_so_in_one_line(mod, name, capsys):
    _, ctx = slash(mod, f"/{name} x")
    assert ctx["error"] == f"/{name} takes no argument (got 'x')"
    assert "TypeError" not in capsys.readouterr().err


@FULL
def test_bg_still_takes_an_id(mod, capsys):
    _, ctx = slash(mod, "/bg nope")
    assert "takes no argument" not in ctx.get("error", "") and "nope" in capsys.readouterr().err


@FULL
def test_a_model_name_with_a_space_is_refused(mod, monkeypatch):
    monkeypatch.setenv("MODEL_ID", "claude-before")
    _, ctx = slash(mod, "/model a b")
    assert "no spaces" in ctx["error"] and mod.model_id() == "claude-before"


@pytest.mark.parametrize("mod", chapters_from("s07"), indirect=True)
def test_plan_with_a_word_after_it_does_not_flip_the_mode(mod):
    state = mod.agent_state()
    state.mode = state.mode_before_plan = "default"
    ctx = {"client": None, "history": []}
    mod.handle_slash("/plan junk", ctx)
    assert state.mode == "default" and "takes no argument" in ctx["error"]
    mod.handle_slash("/plan", ctx)
    assert state.mode == "plan"


@FULL
def test_mode_completes_a_mode(mod, workspace):
    (workspace / "acc.txt").write_text("x")
    assert mod.completions("/mode ac", workspace) == [("acceptEdits", 2)]
    assert [c for c, _ in mod.completions("/mode ", workspace)] == list(mod.PERMISSION_MODES)


# --- 12. completing names with spaces, after a newline; dotfiles ----------------------------------

@FULL
def test_a_completed_mention_with_a_space_attaches_its_file(mod, workspace):
    (workspace / "my notes.txt").write_text("MY-NOTES\n")
    (workspace / "my dir").mkdir()
    (workspace / "my dir" / "a b.md").write_text("NESTED\n")
    assert mod.completions("look at @my", workspace) == [('@"my dir/', 3), ('@"my notes.txt"', 3)]
    assert mod.completions('look at @"my dir/a', workspace) == [('@"my dir/a b.md"', 10)]
    line = mod.attach_mentions('read @"my notes.txt" and @"my dir/a b.md", please')
    assert "MY-NOTES" in line and "NESTED" in line


@FULL
def test_completion_works_after_a_newline_and_hides_dotfiles_until_asked(mod, workspace):
    (workspace / "src").mkdir()
    (workspace / ".secret").write_text("x")
    (workspace / "seen.txt").write_text("x")
    assert mod.completions("look at\n@sr", workspace) == [("@src/", 3)]
    assert [c for c, _ in mod.completions("@", workspace)] == ["@seen.txt", "@src/"]
    assert mod.completions("@.s", workspace) == [("@.secret", 3)]
    assert mod.completions("/forget\tse", workspace) == [("seen.txt", 2)]


# --- smaller notes ------------------------------------------------------------------------------------

@FULL
def test_a_denial_is_shown_once(mod):
    ui, console = rich_ui(mod)
    reason = "denied by bash(curl *) in config.yaml"
    mod.emit(mod.EVENTS.tool_start, id="t1", name="bash", input={"command": "curl x"})
    mod.emit(mod.EVENTS.denial, id="t1", name="bash", input={"command": "curl x"}, layer="rule", reason=reason)
    mod.emit(mod.EVENTS.tool_end, id="t1", content=f"Permission denied (rule): {reason}. Do not retry.",
             is_error=True)
    mod.emit(mod.EVENTS.turn_end, reason="end_turn", result="", session_id="", cost=0.0)
    assert console.export_text().count(reason) == 1  # in the red panel of the result


@FULL
def test_a_job_that_comes_in_at_the_prompt_gets_the_spinner_too(mod, workspace, monkeypatch):
    ui, console = rich_ui(mod)
    monkeypatch.setattr(mod, "fire_job", lambda key, now: {"id": "j1", "cron": "* * * * *", "prompt": "job"})
    mod.agent_state().schedules["due"].append(("j1", "x"))
    with typed_into():
        turn = mod.LineEditor().read("> ")
    assert "job" in turn and ui.live is not None and "thinking" in rendered(ui.live.renderable)
    ui.stop()
