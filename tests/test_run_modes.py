"""Run modes (docs/s01_agent_loop.md: Running a chapter), exercised as a learner runs them: subprocesses.

These are the slow tests (each starts Python and imports the SDK: ~2.5 s of CPU),
so they run on the first and the newest chapter only; the no-key check also runs
in-process on every file.
"""
import os
import select
import shutil
import signal
import subprocess
import sys
import threading
import time

import pytest

from conftest import CHAPTERS, ROOT, run_chapter
from fake_api import error, reply, text, tool

ENDS = sorted({CHAPTERS[0], CHAPTERS[-1]})


def default_sigint():
    """In the child only: Ctrl+C as at a terminal. A suite run as a background
    job (nohup, cmd &) has SIGINT ignored, and the child would inherit that."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def start(args, cwd, env, stdin=None, stderr=subprocess.DEVNULL):
    return subprocess.Popen([sys.executable, *args], cwd=cwd, env=env, stdin=stdin,
                            stdout=subprocess.PIPE, stderr=stderr, preexec_fn=default_sigint)


def read_stdout(p, until=None, deadline=30):
    """The child's stdout up to `until` (None: to the end), within `deadline` seconds.
    Fails, instead of waiting forever, if the child hangs or exits early."""
    out, end = b"", time.monotonic() + deadline
    while until is None or until not in out:
        left = end - time.monotonic()
        assert left > 0, f"no {until!r} on stdout within {deadline}s: {out[-300:]!r}"
        if not select.select([p.stdout], [], [], left)[0]:
            continue
        chunk = os.read(p.stdout.fileno(), 4096)
        if not chunk:
            assert until is None, f"the program exited before printing {until!r}: {out[-300:]!r}"
            break
        yield chunk
        out += chunk


@pytest.mark.e2e("s01")
@pytest.mark.parametrize("name", ENDS)
def test_no_key_exits_2_with_one_clear_message(name, tmp_path):
    # A copy in an empty folder, so no developer's .env next to the repo leaks in.
    shutil.copy(ROOT / f"{name}.py", tmp_path)
    r = subprocess.run([sys.executable, str(tmp_path / f"{name}.py")], input="hi\n", cwd=tmp_path,
                       capture_output=True, text=True, timeout=60,
                       env={k: v for k, v in os.environ.items() if not k.startswith("ANTHROPIC")})
    assert r.returncode == 2
    assert "Traceback" not in r.stderr and "ANTHROPIC_API_KEY" in r.stderr
    assert "demo.py" in r.stderr and len(r.stderr.strip().splitlines()) <= 2


@pytest.mark.parametrize("mod", CHAPTERS, indirect=True)
def test_no_key_is_status_2_and_one_clear_message_in_every_file(mod, monkeypatch, capsys):
    monkeypatch.setattr(mod, "load_dotenv", lambda **kwargs: False)   # no .env, as in the empty folder
    assert mod.main([]) == 2
    err = capsys.readouterr().err
    assert "ANTHROPIC_API_KEY" in err and "demo.py" in err and len(err.strip().splitlines()) <= 2


@pytest.mark.e2e("s01")
@pytest.mark.parametrize("name", ENDS)
def test_piped_prompt_makes_file_and_exits_0(name, api, tmp_path):
    api.script([reply(tool("bash", {"command": "printf hi > hello.txt"})),
                reply("Created hello.txt.")])
    r = run_chapter(name, api=api, cwd=tmp_path, input="make hello.txt containing hi\n",
                    env={"HOME": str(tmp_path), "AGENT_PERMISSION_MODE": "acceptEdits"})
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "hello.txt").read_text() == "hi"
    assert "Created hello.txt." in r.stdout
    assert ">>" not in r.stdout and f"{name.split('_')[0]} >> " in r.stderr   # prompts stay off stdout
    assert api.remaining() == 0 and api.exhausted == 0


@pytest.mark.e2e("s01")
@pytest.mark.parametrize("name", ENDS)
def test_text_streams_before_the_reply_is_finished(name, api, tmp_path):
    words = [f"word{i} " for i in range(30)]
    api.script([reply("".join(words), delay=0.1)])    # ~40 events over ~4 s: a stall cannot hide it
    env = os.environ | {"ANTHROPIC_API_KEY": "test", "ANTHROPIC_BASE_URL": api.url,
                        "HOME": str(tmp_path), "PYTHONUNBUFFERED": "1"}
    p = start([str(ROOT / f"{name}.py"), "say words"], tmp_path, env)
    first = None
    out = b""
    try:
        for chunk in read_stdout(p):
            if first is None and b"word0" in out + chunk:
                first = time.monotonic()
            out += chunk
        assert p.wait(timeout=30) == 0
    finally:
        p.kill()
    deadline = time.monotonic() + 10                   # the server notes it just after its last write
    while "done_at" not in api.requests[0]:
        assert time.monotonic() < deadline
        time.sleep(0.01)
    done = api.requests[0]["done_at"]
    # Causal, not timed: the first word was on stdout before the server had
    # even sent the end of the reply.
    assert first is not None and first < done
    assert b"word29" in out


@pytest.mark.e2e("s01")
@pytest.mark.parametrize("name", ENDS)
def test_one_shot_failure_exits_nonzero(name, api, tmp_path):
    api.script([error(401, "invalid x-api-key")])
    r = run_chapter(name, "do something", api=api, cwd=tmp_path, env={"HOME": str(tmp_path)})
    assert r.returncode != 0
    assert "invalid x-api-key" in r.stderr and "Traceback" not in r.stderr


@pytest.mark.e2e("s01")
@pytest.mark.parametrize("name", ENDS)
def test_repl_quits_on_q_and_eof(name, api, tmp_path):
    for stdin in ("q\n", "exit\n", ""):
        r = run_chapter(name, api=api, cwd=tmp_path, input=stdin, env={"HOME": str(tmp_path)})
        assert r.returncode == 0, r.stderr
    assert api.requests == []


@pytest.mark.e2e("s01")
@pytest.mark.parametrize("name", ENDS)
def test_ctrl_c_cancels_the_turn_not_the_program(name, api, tmp_path):
    api.script([reply("".join(f"slow{i} " for i in range(200)), delay=0.05),
                reply("Second answer.")])
    env = os.environ | {"ANTHROPIC_API_KEY": "test", "ANTHROPIC_BASE_URL": api.url,
                        "HOME": str(tmp_path), "PYTHONUNBUFFERED": "1"}
    p = start([str(ROOT / f"{name}.py")], tmp_path, env, stdin=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        p.stdin.write(b"first question\n")
        p.stdin.flush()
        for _ in read_stdout(p, until=b"slow3"):
            pass
        p.send_signal(signal.SIGINT)          # mid-stream
        time.sleep(0.3)
        stdout, stderr = p.communicate(b"second question\n", timeout=30)
    finally:
        p.kill()
    assert p.returncode == 0, stderr
    assert b"Second answer." in stdout and b"interrupted" in stderr
    assert len(api.requests) == 2         # and the api fixture checks both were valid
