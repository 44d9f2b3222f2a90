"""agent_full: the prompt before the SDK (full.9).

agent_full runs as a program in a pseudo-terminal, with an import hook that holds
the import of named packages (the SDK, prompt_toolkit) until the test lets each go.
While the SDK is held the prompt must be up and take a typed line: the start before
full.9 imported the SDK before anything else and never showed a prompt. While
prompt_toolkit is held too, the first prompt is the terminal's own, and the line
editor must go on with what was typed there, or take the line sent there. Once let
go, the typed prompt gets its answer. Nothing here is timed; every wait is a bound
for a stuck program.
"""
import fcntl
import os
import pty
import select
import subprocess
import sys
import termios
import time

import pytest

from conftest import ROOT, message_bodies
from fake_api import reply

pytestmark = pytest.mark.parametrize("mod", ["agent_full"], indirect=True)

# Runs agent_full as a program (argv[2:]); the import of each package named in
# HELD ("name=gate-file,...") waits, its module code unrun, until its gate file
# exists, and says so on stderr. Finders run under the import
# lock of the module being found only, so the rest of the program goes on.
HOLD = r"""
import importlib.machinery, os, runpy, sys, time
held = dict(pair.split("=", 1) for pair in os.environ["HELD"].split(",") if pair)

class Held:
    def __init__(self, name, loader):
        self.name, self.loader = name, loader
    def create_module(self, spec):
        return self.loader.create_module(spec)
    def exec_module(self, module):
        print(f"held {self.name}", file=sys.stderr, flush=True)
        while not os.path.exists(held[self.name]):
            time.sleep(0.02)
        self.loader.exec_module(module)

class Hold:
    def find_spec(self, name, path=None, target=None):
        if name not in held or os.path.exists(held[name]):
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path, target)
        if spec is not None and spec.loader is not None:
            spec.loader = Held(name, spec.loader)
        return spec

sys.meta_path.insert(0, Hold())
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
"""
WAIT = 30  # seconds: the bound for anything to show up on the terminal
EDITOR_ON = b"\x1b[?2004h"  # prompt_toolkit turns bracketed paste on: the line editor has the prompt


def controlling_terminal():
    """In the child: the pseudo-terminal (its stdin) becomes its terminal, so Ctrl+C there is SIGINT."""
    fcntl.ioctl(0, termios.TIOCSCTTY, 0)


class Terminal:
    """agent_full at a pseudo-terminal, the packages in `held` held until let go."""

    def __init__(self, api, workspace, tmp_path, held, extra_env=None):
        self.gates = {name: tmp_path / f"let-{name}-in" for name in held}
        self.home = tmp_path / "home"
        env = {"ANTHROPIC_API_KEY": "test", "ANTHROPIC_BASE_URL": api.url, "HOME": str(self.home),
               "AGENT_AUTO_MEMORY": "0", "AGENT_PERMISSION_MODE": "bypassPermissions", "TERM": "xterm-256color",
               "PROMPT_TOOLKIT_NO_CPR": "1", "PATH": os.environ["PATH"], "NO_PROXY": "127.0.0.1,localhost",
               "no_proxy": "127.0.0.1,localhost", "HELD": ",".join(f"{n}={g}" for n, g in self.gates.items()),
               **(extra_env or {})}
        self.fd, child = pty.openpty()
        self.proc = subprocess.Popen([sys.executable, "-c", HOLD, str(ROOT / "agent_full.py")], cwd=workspace,
                                     env=env, stdin=child, stdout=child, stderr=child, close_fds=True,
                                     start_new_session=True, preexec_fn=controlling_terminal)
        os.close(child)
        self.seen, self.pos = b"", 0

    def until(self, wanted):
        """Wait for `wanted` on the terminal, after where the last wait found its text."""
        end = time.monotonic() + WAIT
        while wanted not in self.seen[self.pos:]:
            left = end - time.monotonic()
            if left <= 0 or not select.select([self.fd], [], [], left)[0]:
                raise AssertionError(f"{wanted!r} never came; the terminal showed:\n{self.text()}")
            try:
                chunk = os.read(self.fd, 65536)
            except OSError:  # the program ended
                chunk = b""
            if not chunk:
                raise AssertionError(f"the program ended before {wanted!r}:\n{self.text()}")
            self.seen += chunk
        self.pos = self.seen.index(wanted, self.pos) + len(wanted)

    def type(self, keys):
        os.write(self.fd, keys)

    def let_in(self, name):
        self.gates[name].touch()

    def text(self):
        return self.seen.decode(errors="replace")

    def quit(self, keys=b"\x04"):
        """Ctrl+D at the prompt (or `keys`); the exit status, once the terminal is drained to the end."""
        self.type(keys)
        while select.select([self.fd], [], [], WAIT)[0]:
            try:
                if not (chunk := os.read(self.fd, 65536)):
                    break
            except OSError:  # the program ended
                break
            self.seen += chunk
        return self.proc.wait(timeout=WAIT)

    def close(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        os.close(self.fd)


@pytest.fixture
def terminal(api, workspace, tmp_path):
    made = []

    def start(*held, env=None):
        made.append(Terminal(api, workspace, tmp_path, held, env))
        return made[-1]
    yield start
    for t in made:
        t.close()


def sent_prompts(api):
    """Each request's first user message, as typed (its last text; context blocks come first)."""
    firsts = [next(m for m in body["messages"] if m["role"] == "user")["content"] for body in message_bodies(api)]
    return [c if isinstance(c, str) else [b["text"] for b in c if b["type"] == "text"][-1] for c in firsts]


def history_file(t):
    return (t.home / ".agent" / "history").read_text()


@pytest.mark.e2e("agent_full")
def test_the_prompt_takes_a_line_while_the_sdk_is_held(mod, api, terminal):
    api.script([reply("Answered once the SDK came.")])
    t = terminal("anthropic")
    t.until(b"agent >>")
    assert t.proc.poll() is None and not t.gates["anthropic"].exists()
    t.type(b"hello\r")
    t.until(b"thinking")  # the line was taken: the turn has begun, its request waits for the SDK
    assert message_bodies(api) == []
    t.let_in("anthropic")
    t.until(b"Answered once the SDK came.")
    t.until(b"agent >>")  # the next prompt
    assert t.quit() == 0 and "held anthropic" in t.text() and "Traceback" not in t.text(), t.text()
    assert sent_prompts(api) == ["hello"]
    assert "+hello\n" in history_file(t)


@pytest.mark.e2e("agent_full")
def test_the_line_editor_goes_on_with_what_was_typed_before_it_loaded(mod, api, terminal):
    api.script([reply("Answered.")])
    t = terminal("prompt_toolkit", "anthropic")
    t.until(b"agent >>")
    t.type(b"hel")
    t.until(b"hel")  # the terminal's own echo: nothing has read it yet
    t.let_in("prompt_toolkit")
    t.until(EDITOR_ON)
    t.until(b"agent >> hel")  # the editor draws the prompt again, with the text typed so far
    t.type(b"lo\r")
    t.until(b"thinking")
    t.let_in("anthropic")
    t.until(b"Answered.")
    t.until(b"agent >>")
    assert t.quit() == 0 and "Traceback" not in t.text(), t.text()
    assert sent_prompts(api) == ["hello"]
    assert "+hello\n" in history_file(t)


@pytest.mark.e2e("agent_full")
def test_a_line_sent_before_the_line_editor_loaded_is_the_first_prompt(mod, api, terminal):
    api.script([reply("First answered.")])
    t = terminal("prompt_toolkit", "anthropic")
    t.until(b"agent >>")
    t.type(b"abc\x03")  # Ctrl+C at the terminal's prompt: as the editor's, a step towards quitting
    t.until(b"Ctrl+C again to quit")
    t.until(b"agent >>")
    t.type(b"first\r")
    t.until(b"thinking")
    t.let_in("prompt_toolkit")
    t.let_in("anthropic")
    t.until(b"First answered.")
    t.until(EDITOR_ON)  # the next prompt is the editor's
    assert t.quit() == 0 and "Traceback" not in t.text(), t.text()
    assert sent_prompts(api) == ["first"]
    assert "+first\n" in history_file(t)  # in the editor's history, for the up arrow



@pytest.mark.parametrize("pushed, typed, taken", [
    (b"", b"hel", "hel"), (b"", b"hello\r", "hello\n"), (b"", b"hi\rmore", "hi\n"),  # Enter
    (b"", b"\x04", EOFError), (b"", b"ab\x04", "ab"), (b"ab", b"\x04", "ab\n")])  # Ctrl+D
def test_what_comes_as_the_editor_takes_over_is_kept(mod, monkeypatch, pushed, typed, taken):
    """The editor takes what was typed at the terminal's prompt once it has loaded. An Enter
    that came after the last look for a line was taken as a control character, dropped:
    the editor showed the text and waited for an Enter that had come (a loaded machine,
    the prompt up, nothing more). Taken now, a finished line is the line; a Ctrl+D is what
    it is at input(): at an empty line the end of input, after text it sends the text on
    (kept for the editor), and again it sends that text as the line."""
    master, slave = pty.openpty()
    with open(slave, "r", closefd=True) as stdin:
        monkeypatch.setattr(sys, "stdin", stdin)
        first = mod.FirstPrompt("agent >> ")
        first.pushed = pushed  # sent on by a Ctrl+D that wait() read
        os.write(master, typed)
        echo, end = b"", time.monotonic() + WAIT
        shown = typed.replace(b"\r", b"\r\n").replace(b"\x04", b"")  # the line mode's echo
        while shown not in echo and time.monotonic() < end:
            echo += os.read(master, 1024) if select.select([master], [], [], 1)[0] else b""
        if typed.endswith((b"\r", b"\x04")):  # a finished line, or a Ctrl+D's mark, is readable
            assert select.select([slave], [], [], WAIT)[0]
        if taken is EOFError:
            with pytest.raises(EOFError):
                first.take()
        else:
            assert first.take() == taken
    os.close(master)


def broken_sdk(tmp_path, why):
    """A folder whose `anthropic` package is there but fails to import: a module it needs
    is missing (a half-made venv), or it raises (a broken install)."""
    shadow = tmp_path / "shadow" / "anthropic"
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text("import a_dependency_not_installed\n" if why == "missing"
                                        else "raise ImportError('a broken install')\n")
    return str(shadow.parent)


@pytest.mark.e2e("agent_full")
def test_an_sdk_whose_dependency_is_missing_says_how_to_install_as_a_missing_sdk_does(mod, tmp_path):
    # The SDK's package is there, so it is imported behind the prompt, but a module it
    # imports is not. Before full.9 the top's guard said how to install the packages
    # (exit 2); the thread's import must say the same, not a start-up failure.
    env = {"PATH": os.environ["PATH"], "HOME": str(tmp_path / "home"), "PYTHONPATH": broken_sdk(tmp_path, "missing"),
           "ANTHROPIC_API_KEY": "test", "ANTHROPIC_BASE_URL": "http://127.0.0.1:9", "AGENT_AUTO_MEMORY": "0"}
    run = subprocess.run([sys.executable, str(ROOT / "agent_full.py"), "-p", "hello"], cwd=tmp_path, env=env,
                         stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=WAIT)
    assert "Traceback" not in run.stderr and run.stdout == "", run.stderr
    requirements = os.path.relpath(ROOT / "requirements.txt", tmp_path)
    assert run.returncode == 2, run.stderr
    assert (f"No module named 'a_dependency_not_installed': install the packages with pip install -r "
            f"{requirements}") in run.stderr.splitlines(), run.stderr


@pytest.mark.e2e("agent_full")
@pytest.mark.parametrize("why, status", [("missing", 2), ("raises", 1)])
def test_an_sdk_that_fails_to_load_at_the_first_prompt_leaves_the_terminal_as_it_was(mod, api, terminal, tmp_path,
                                                                                      why, status):
    # The failure comes when the first request waits for the SDK, under the turn's
    # spinner: the run ends there, and the spinner must not stay on the screen with the
    # cursor hidden (it did: the turn's end, which stops it, never came).
    t = terminal(env={"PYTHONPATH": broken_sdk(tmp_path, why)})
    t.until(b"agent >>")
    before = termios.tcgetattr(t.fd)
    t.type(b"hello\r")
    t.until(b"a_dependency_not_installed" if why == "missing" else b"a broken install")
    assert t.quit(b"") == status and "Traceback" not in t.text(), t.text()
    assert termios.tcgetattr(t.fd) == before
    end = t.seen[t.seen.rindex(b"hello"):]   # from the line sent to the end of the run
    assert end.rfind(b"\x1b[?25l") < end.rfind(b"\x1b[?25h"), end   # the cursor shown again
    assert b"thinking" not in end.rsplit(b"\r", 1)[-1], end   # no spinner left on the last line
