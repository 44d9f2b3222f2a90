"""Bounds on what the tools hold and show: bash output stops at a cap, read_file
streams, the agent's own .agent/ folder stays out of searches, ripgrep and the
Python walk read the same .gitignore files, long lines are cut with a marker,
and edits work on files that are not clean UTF-8 or use CRLF."""
import io
import os
import random
import re
import shutil
import subprocess
import time
import tracemalloc
from types import SimpleNamespace

import pytest

from conftest import chapters_from

from01 = pytest.mark.parametrize("mod", chapters_from("s01"), indirect=True)
from02 = pytest.mark.parametrize("mod", chapters_from("s02"), indirect=True)


def call(mod, name, **args):
    """Run one tool exactly as the loop does; return (content, is_error)."""
    r = mod.run_tool(SimpleNamespace(id="toolu_t", name=name, input=args))
    return r["content"], r.get("is_error", False)


def marker(mod, seconds):
    """A sleep command line no other test (or concurrent suite) runs, to find its process."""
    return f"sleep {seconds}{random.randrange(10**8):08d}"


def gone(command, wait=5.0):
    """No process runs `command` (a SIGKILLed one can take a moment to disappear)."""
    deadline = time.monotonic() + wait
    while subprocess.run(["pgrep", "-f", command]).returncode != 1:
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


# --- bash: output cap ---------------------------------------------------------

@from01
def test_endless_output_stops_the_command_at_the_cap(mod, workspace, monkeypatch):
    monkeypatch.setattr(mod, "BASH_OUTPUT_CAP", 200_000, raising=False)
    sleeper = marker(mod, 5)
    with pytest.raises(mod.ToolError) as e:   # before: ran to the timeout, all kept
        mod.run_bash(f"{sleeper} & while :; do echo 0123456789; done", timeout=3)
    message = str(e.value)
    assert message.startswith("0123456789\n0123456789\n")
    assert "[stopped: output passed 0.2 MB; redirect it to a file and read parts of it]" in message
    assert re.search(r"\[truncated: \d+ bytes in all, the first 30000 characters shown\]", message)
    assert len(message) < mod.MAX_OUTPUT + 300
    assert gone(sleeper)                      # the whole process group was killed


@from01
def test_command_output_is_read_from_its_head_only(mod, tmp_path):
    class Counting(io.FileIO):
        asked = []

        def read(self, n=-1):
            self.asked.append(n)
            return super().read(n)
    (tmp_path / "out").write_bytes(b"x" * 1_000_000)
    with Counting(tmp_path / "out") as fh:
        text = mod.read_head(fh, 100)
    assert Counting.asked == [400]            # 4 bytes per character at most, never all
    assert text == "x" * 100 + "\n... [truncated: 1000000 bytes in all, the first 100 characters shown]"


@from01
def test_ctrl_c_kills_the_running_pipeline(mod, workspace, monkeypatch):
    sleeper = marker(mod, 6)
    clock = iter([0.0])                      # the deadline, then Ctrl+C on the first check

    def monotonic():
        try:
            return next(clock)
        except StopIteration:
            raise KeyboardInterrupt
    monkeypatch.setattr(mod, "time", SimpleNamespace(monotonic=monotonic))
    with pytest.raises(KeyboardInterrupt):
        mod.run_bash(f"{sleeper} | cat")
    assert gone(sleeper)


@from01
def test_bash_timeout_is_capped_at_the_maximum(mod, workspace, monkeypatch):
    seen = []
    real = mod.watch_command

    def recording(p, sink, timeout):
        seen.append(timeout)
        return real(p, sink, timeout)
    monkeypatch.setattr(mod, "watch_command", recording)
    assert call(mod, "bash", command="echo hi", timeout=100_000) == ("hi\n", False)
    assert call(mod, "bash", command="echo hi", timeout=5) == ("hi\n", False)
    assert seen == [mod.BASH_MAX_TIMEOUT, 5] and mod.BASH_MAX_TIMEOUT == 600


# --- read_file: streamed, long lines marked --------------------------------------

def old_rows(data):
    """read_file's line split before streaming: "\n" ends a line, a CR before it is hidden."""
    lines = data.decode("utf-8", "replace").removesuffix("\n").split("\n")
    return [line.removesuffix("\r") for line in lines] if lines != [""] else []


@from02
@pytest.mark.parametrize("data", [b"a\nb\n", b"a\nb", b"\n\n", b"x\r\ny\r\n", b"x\r\ny", b"a\rb\n",
                                  b"last\r", b"a\fb\nc\n", b"caf\xe9\n\xff\n", "ünï\n".encode()],
                         ids=repr)
def test_streamed_read_numbers_lines_as_before(mod, workspace, data):
    (workspace / "f.txt").write_bytes(data)
    rows = [f"{n:6}\t{line}" for n, line in enumerate(old_rows(data), 1)]
    assert call(mod, "read_file", path="f.txt") == ("\n".join(rows), False)


@from02
def test_read_file_streams_a_big_file(mod, workspace):
    big = workspace / "big.log"
    with open(big, "w") as fh:
        for i in range(200_000):                  # 20 MB
            fh.write(f"{i:08} " + "x" * 91 + "\n")
    tracemalloc.start()
    try:
        out, err = call(mod, "read_file", path="big.log", limit=5)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert not err and out.splitlines()[0] == "     1\t00000000 " + "x" * 91
    assert out.splitlines()[-1].startswith("[showing lines 1-5 of 200000; continue with offset=6")
    assert peak < 5_000_000, peak                 # before: the whole file, decoded and split


@from02
def test_a_huge_single_line_is_cut_and_never_held(mod, workspace):
    (workspace / "one.json").write_text('{"k": "' + "v" * 20_000_000 + '"}')
    tracemalloc.start()
    try:
        out, err = call(mod, "read_file", path="one.json")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert not err and peak < 8_000_000, peak
    assert out == f'     1\t{{"k": "{"v" * 1993}' + \
        f" [line cut: {20_000_009 - 2000} more characters; read them with bash, e.g. cut -c2001-]"


@from02
@pytest.mark.parametrize("ending", ["\n", "\r\n", ""], ids=["lf", "crlf", "unended"])
def test_long_lines_say_how_much_was_cut(mod, workspace, ending):
    line = "[" + "1," * 49_999 + "1]"              # 100,001 characters of one-line JSON
    (workspace / "data.json").write_text(line + ending + ("next" + ending) * bool(ending), newline="")
    rows = call(mod, "read_file", path="data.json")[0].splitlines()
    assert rows[0] == "     1\t" + line[:2000] + \
        " [line cut: 98001 more characters; read them with bash, e.g. cut -c2001-]"
    assert rows[1:] == (["     2\tnext"] if ending else [])


@from02
def test_a_5000_character_line_is_cut_at_max_line(mod, workspace):
    (workspace / "w.txt").write_text("a" * 5_000 + "\nshort\n")
    rows = call(mod, "read_file", path="w.txt")[0].splitlines()
    assert rows[0] == "     1\t" + "a" * 2_000 + " [line cut: 3000 more characters; read them with " \
                                                  "bash, e.g. cut -c2001-]"
    assert rows[1] == "     2\tshort" and mod.MAX_LINE == 2_000


# --- glob / grep: the agent's own files, long rows, the 250-row cap ----------------

needs_rg = pytest.mark.skipif(not shutil.which("rg"), reason="ripgrep is not installed")


def both(mod, monkeypatch, name, **args):
    """A glob or grep result, after checking that ripgrep and the Python walk it
    falls back to give the same text."""
    content, err = call(mod, name, **args)
    assert not err, content
    with monkeypatch.context() as m:
        m.setattr(mod.shutil, "which", lambda name: None)
        assert call(mod, name, **args) == (content, False)
    return content


def make(root, files):
    for name, body in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(body)


@needs_rg
@from02
def test_the_agents_own_files_stay_out_of_searches(mod, workspace, monkeypatch):
    make(workspace, {".agent/transcripts/t1.jsonl": '{"text": "needle"}\n' * 2000,
                     ".agent/tool-results/toolu_1.txt": "needle\n", "notes.txt": "the needle\n",
                     "src/.agent/kept.txt": "needle\n"})   # only the workspace's own folder is the agent's
    assert both(mod, monkeypatch, "grep", pattern="needle", output_mode="content") == \
        "notes.txt:1:the needle\nsrc/.agent/kept.txt:1:needle"
    assert both(mod, monkeypatch, "grep", pattern="needle") == "notes.txt\nsrc/.agent/kept.txt"
    assert set(both(mod, monkeypatch, "glob", pattern="**/*.txt").splitlines()) == \
        {"notes.txt", "src/.agent/kept.txt"}
    # asked for by path, they are searched
    assert both(mod, monkeypatch, "grep", pattern="needle", path=".agent/tool-results") == \
        ".agent/tool-results/toolu_1.txt"
    assert both(mod, monkeypatch, "grep", pattern="needle", path=".agent") == \
        ".agent/tool-results/toolu_1.txt\n.agent/transcripts/t1.jsonl"
    assert both(mod, monkeypatch, "glob", pattern="**/*.txt", path=".agent") == \
        ".agent/tool-results/toolu_1.txt"


@needs_rg
@from02
@pytest.mark.parametrize("line", ["x" * 3000 + "needle" + "y" * 9000, "é" * 5000 + "needle",
                                  "needle" + "€" * 1998 + "ab", "needle" + "z" * 1994])
def test_grep_cuts_long_rows_the_same_in_both_backends(mod, workspace, monkeypatch, line):
    (workspace / "wide.txt").write_text(f"{line}\nneedle short\n")
    rows = both(mod, monkeypatch, "grep", pattern="needle", output_mode="content").splitlines()
    want = line[:2000] + " [line cut at 2000 characters]" if len(line) > 2000 else line
    assert rows == ["wide.txt:1:" + want, "wide.txt:2:needle short"]


@needs_rg
@from02
def test_grep_shows_250_rows_and_says_how_many_more(mod, workspace, monkeypatch):
    (workspace / "many.txt").write_text("hit\n" * 300)
    rows = both(mod, monkeypatch, "grep", pattern="hit", output_mode="content").splitlines()
    assert len(rows) == 251 and rows[249] == "many.txt:250:hit" and mod.GREP_LIMIT == 250
    assert rows[-1] == "[50 more not shown; narrow the pattern, path or glob]"


# --- .gitignore files above the workspace -----------------------------------------

PROJECT = {".gitignore": "*.log\n/src/gen.txt\n", "src/.gitignore": "!keep.log\n/sub/hidden.txt\n",
           "src/we[ir]d/.gitignore": "/sub/*.txt\n", "src/we[ir]d/sub/e.txt": "needle",
           "src/we[ir]d/sub/f.md": "needle", "a.txt": "needle", "b.log": "needle",
           "src/c.txt": "needle", "src/gen.txt": "needle", "src/keep.log": "needle",
           "src/sub/gen.txt": "needle", "src/sub/hidden.txt": "needle", "src/sub/d.log": "needle",
           ".agent/transcripts/t.jsonl": "needle"}
FOUND = ["a.txt", "src/c.txt", "src/keep.log", "src/sub/gen.txt", "src/we[ir]d/sub/f.md"]


def check_project(mod, monkeypatch):
    """The workspace's own rules hold for a search from any folder, in both backends."""
    assert both(mod, monkeypatch, "grep", pattern="needle").splitlines() == FOUND
    assert both(mod, monkeypatch, "grep", pattern="needle", path="src").splitlines() == FOUND[1:]
    assert both(mod, monkeypatch, "grep", pattern="needle", path="src/sub") == "src/sub/gen.txt"
    assert both(mod, monkeypatch, "grep", pattern="e", path="src/we[ir]d/sub") == "src/we[ir]d/sub/f.md"
    assert set(both(mod, monkeypatch, "glob", pattern="**/*.txt").splitlines()) == {
        "a.txt", "src/c.txt", "src/sub/gen.txt"}


@needs_rg
@from02
def test_a_gitignore_outside_any_repository_does_not_apply(mod, tmp_path, monkeypatch):
    ws = tmp_path / "outside" / "ws"
    make(ws, PROJECT)
    (tmp_path / "outside" / ".gitignore").write_text("*\n")   # someone else's: would hide all
    mod.agent_state().workdir = ws.resolve()
    monkeypatch.chdir(ws)
    check_project(mod, monkeypatch)


@needs_rg
@from02
def test_a_gitignore_above_the_workspace_in_its_repository_applies(mod, tmp_path, monkeypatch):
    repo = tmp_path / "repo"
    make(repo, {".gitignore": "*.tmp\nvendor/\n", "pkg/vendor/v.txt": "needle", "pkg/x.tmp": "needle",
                "pkg/inner/.gitignore": "", "pkg/inner/y.tmp": "needle", "pkg/nested/z.tmp": "pin"})
    (repo / ".git").mkdir()
    (repo / "pkg" / "nested" / ".git").mkdir()                # a repository inside: its own rules
    make(tmp_path, {".gitignore": "*\n"})                     # above the repository: not git's
    ws = repo / "pkg"
    make(ws, PROJECT)
    mod.agent_state().workdir = ws.resolve()
    monkeypatch.chdir(ws)
    check_project(mod, monkeypatch)
    assert both(mod, monkeypatch, "grep", pattern="needle", path="inner") == "No matches for 'needle'."
    assert both(mod, monkeypatch, "grep", pattern="pin") == "nested/z.tmp"   # *.tmp is not its rule
    assert both(mod, monkeypatch, "grep", pattern="pin", path="nested") == "nested/z.tmp"


# --- edits of files that are not clean UTF-8 or LF ---------------------------------

@from02
def test_an_edit_of_undecodable_text_says_why_and_what_works(mod, workspace):
    f = workspace / "latin1.py"
    f.write_bytes(b"name = 'caf\xe9'\ncount = 1\n")
    shown = call(mod, "read_file", path="latin1.py")[0]
    copied = shown.splitlines()[0].split("\t", 1)[1]           # what the model copies
    message, err = call(mod, "edit_file", path="latin1.py", old_string=copied,
                        new_string="name = 'cafe'")
    assert err and "not valid UTF-8" in message and "byte 0xe9 at offset 11" in message
    assert "bash" in message and "write_file" in message and "Copy it exactly" not in message
    assert f.read_bytes() == b"name = 'caf\xe9'\ncount = 1\n"
    assert call(mod, "edit_file", path="latin1.py", old_string="count = 1", new_string="count = 2")[1] is False
    assert f.read_bytes() == b"name = 'caf\xe9'\ncount = 2\n"     # the other bytes survive


@from02
def test_new_lines_in_a_crlf_file_end_in_crlf(mod, workspace):
    f = workspace / "win.txt"
    f.write_bytes(b"one\r\ntwo\r\nthree\r\n")
    call(mod, "read_file", path="win.txt")
    assert call(mod, "edit_file", path="win.txt", old_string="two", new_string="two\n2a\n2b")[1] is False
    assert f.read_bytes() == b"one\r\ntwo\r\n2a\r\n2b\r\nthree\r\n"
    assert call(mod, "edit_file", path="win.txt", old_string="2a\n2b\n", new_string="x\r\ny\n")[1] is False
    assert f.read_bytes() == b"one\r\ntwo\r\nx\r\ny\r\nthree\r\n"
    lf = workspace / "unix.txt"                                 # an LF file keeps LF
    lf.write_bytes(b"one\ntwo\n")
    call(mod, "read_file", path="unix.txt")
    call(mod, "edit_file", path="unix.txt", old_string="one", new_string="1\n1b")
    assert lf.read_bytes() == b"1\n1b\ntwo\n"
