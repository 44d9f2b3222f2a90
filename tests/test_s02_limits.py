"""Bounds on what the tools hold and show: bash output stops at a cap, read_file
streams, the agent's own .agent/ folder stays out of searches, ripgrep and the
Python walk read the same .gitignore files, long lines are cut with a marker,
and edits work on files that are not clean UTF-8 or use CRLF."""
import io
import os
import re
import subprocess
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
    """A sleep command line no other test runs, to find its process afterwards."""
    return f"sleep {seconds}{os.getpid() % 10}.{len(mod.__name__)}"


def gone(command):
    return subprocess.run(["pgrep", "-f", command]).returncode == 1


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
