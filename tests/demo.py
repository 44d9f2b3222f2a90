#!/usr/bin/env python3
"""Offline demo: run one chapter end to end against the bundled scripted model.

No API key and no network: a local Messages API server (tests/fake_api.py) plays
the model, following the scenario in tests/scenarios/<chapter>.py, and the real
chapter file runs against it as a subprocess, exactly as `python sNN_x.py "task"`.

    python tests/demo.py s01                   # fresh temporary workspace, removed after
    python tests/demo.py s02 --keep            # keep the workspace (and requests.jsonl)
    python tests/demo.py s06 --show-requests   # then what the model received, request by request
    python tests/demo.py agent                 # agent_full.py: one task three ways (UI, json, stream-json)
    python tests/demo.py all                   # every demo in order, one summary line each

The scripted model does not think: its replies are fixed in the scenario. What
is real is everything the chapter does with them: requests, streaming, tools,
files. A demo fails (non-zero exit, one line per reason) when the chapter sent
an invalid request, exited non-zero, asked for more replies than the script
has or stopped before using them all, or when the scenario's CHECK of the
outcome (the file made, the answer given, the artefact on disk) does not hold.

A scenario module defines PROMPT and STEPS (fake_api steps: replies, or
callables that look at the request first), and optionally SETUP(workspace),
SETUP_HOME(home) (what the scratch HOME starts with), ENV (extra environment
for the chapter), INPUT (the human's typed answers, piped to the chapter's
stdin), FAKED (what else is faked), CHECK(workspace, stdout[, runs]), which
raises AssertionError when the outcome is wrong, and SHOW(workspace), the text
to print after the run (a record the chapter kept on disk, say); its docstring
says what the demo shows and what to watch. For the request view, SENDER(body)
names who sent a request (the lead or a teammate, the main loop or a side
call), read from the request itself, and FULL_RESULTS names the tools whose
results it prints in full.

RUNS, when a scenario has it, is several runs of the chapter one after another
against one script (a second process that resumes the first one's session; one
task shown three ways). Each run is a dict:
    title     what the run is, one line
    steps     its scripted replies (STEPS is every run's, in order)
    prompt    the prompt argument; None: no prompt, the REPL reads stdin
    args      flags before the prompt
    input     what is piped to stdin
    hold      True: stdin stays open until the run's replies are all used (an idle REPL)
    env       more environment for this run
    fresh     True: a new workspace, made by SETUP (else the one before)
    terminal  (columns, rows): run in a pseudo-terminal of that size; the screen it
              leaves is printed as text. keys: [(text on the screen to wait for, keys
              to type)]; None as the text: wait until the run's replies are used
    show      "json": stdout printed as indented JSON after the run; "json-lines":
              each line of stdout cut to one screen line as it comes
`runs` (for CHECK) has per run: stdout, stderr, transcript (both, in order), code,
workspace, and the run's dict.
"""
import argparse
import codecs
import difflib
import fcntl
import importlib
import inspect
import json
import os
import re
import select
import shutil
import struct
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from pathlib import Path

TESTS = Path(__file__).resolve().parent
ROOT = TESTS.parent
sys.path.insert(0, str(TESTS))

from packages import require  # noqa: E402

require()  # before pip install: one line that says how, not a traceback

from fake_api import ScriptedAPI  # noqa: E402
from screen import Screen  # noqa: E402

TIMEOUT = 300          # seconds a chapter may run before the demo gives up on it
LOCAL_HOSTS = ["127.0.0.1", "localhost"]   # the scripted server: never reached through a proxy
WIDTH = 88
POLL = 0.05            # seconds between looks at a running chapter (stdin to close, keys to type)


def chapters():
    """Demo names in order: the chapters (s01, s02, ...) with a file in the repository,
    then agent (agent_full.py) when it is there."""
    names = sorted(p.stem.split("_")[0] for p in ROOT.glob("s[0-9][0-9]_*.py"))
    return names + ["agent"] * (ROOT / "agent_full.py").exists()


def chapter_file(name):
    hits = sorted(ROOT.glob(f"{name}_*.py"))
    if not hits:
        sys.exit(f"no chapter named {name!r}; try one of: {', '.join(chapters())}, all")
    return hits[0]


def load_scenario(name):
    if not (TESTS / "scenarios" / f"{name}.py").exists():
        return None
    return importlib.import_module(f"scenarios.{name}")


def scenario_runs(scenario):
    """The scenario's runs: RUNS, or the one run PROMPT, INPUT and STEPS make."""
    runs = getattr(scenario, "RUNS", None)
    if runs is None:
        return [{"prompt": scenario.PROMPT, "input": getattr(scenario, "INPUT", None),
                 "steps": list(scenario.STEPS)}]
    return runs


def no_proxy(env):
    """NO_PROXY (and no_proxy, which wins where both are set) with the local hosts added."""
    for var in ("NO_PROXY", "no_proxy"):
        hosts = LOCAL_HOSTS + [h.strip() for h in env.get(var, "").split(",")]
        env[var] = ",".join(h for h in dict.fromkeys(hosts) if h)
    return env


def child_env(url, home, scenario, run=None):
    env = {k: v for k, v in os.environ.items() if not k.startswith("ANTHROPIC")}
    env |= {"ANTHROPIC_API_KEY": "offline-demo", "ANTHROPIC_BASE_URL": url,
            "HOME": str(home), "PYTHONUNBUFFERED": "1"}
    env |= getattr(scenario, "ENV", {}) | (run or {}).get("env", {})
    return no_proxy(env)


# --------------------------------------------------------------------------
# Before the run: what the demo shows and what is faked.
# --------------------------------------------------------------------------

def wrap(text, indent="  ", more=None):
    more = " " * len(indent) if more is None else more
    return "\n".join(textwrap.fill(para, WIDTH, initial_indent=indent, subsequent_indent=more)
                     for para in text.split("\n\n"))


def scripted_usage(steps):
    """(reply number, usage) for every plain step whose token usage is scripted."""
    return [(n, s["usage"]) for n, s in enumerate(steps, 1)
            if isinstance(s, dict) and s.get("usage")]


def title_and_notes(doc):
    """A scenario docstring's title (its first paragraph, however many lines) and the rest."""
    title, _, shows = doc.strip().partition("\n\n")
    return " ".join(title.split()), shows


def intro(name, path, scenario):
    title, shows = title_and_notes(scenario.__doc__ or f"{name} demo")
    steps = list(scenario.STEPS)
    lines = [f"=== {title}", "", "What it shows:",
             textwrap.indent(textwrap.dedent(shows).strip() or "(see the scenario)", "  "), "",
             "What is faked:",
             wrap(f"The model. A local server (tests/fake_api.py) answers each request with the "
                  f"next of the {len(steps)} replies fixed in tests/scenarios/{name}.py: it does "
                  f"not read the request or think, and every run gets the same replies. Token "
                  f"usage figures are estimates from the request size (about 4 characters a "
                  f"token), not a real model's counts.")]
    for n, usage in scripted_usage(steps):
        figures = ", ".join(f"{k}={v:,}" for k, v in usage.items())
        lines.append(wrap(f"Reply {n} reports a scripted usage figure ({figures}): a fixed "
                          f"number, not the real size of the request.", "  * ", "    "))
    for what, where in (("SETUP", "The workspace"), ("SETUP_HOME", "The scratch HOME")):
        setup = getattr(scenario, what, None)
        if setup and setup.__doc__:
            lines.append(wrap(f"{where} starts with what the scenario writes: "
                              f"{' '.join(setup.__doc__.split())}", "  * ", "    "))
    if getattr(scenario, "FAKED", None):
        lines.append(wrap(" ".join(scenario.FAKED.split()), "  * ", "    "))
    runs = scenario_runs(scenario)
    how = "run as a subprocess" if len(runs) == 1 else f"run {len(runs)} times as a subprocess"
    lines += ["", "What is real:",
              wrap(f"{path.name} itself, unchanged, {how} in a fresh scratch workspace with an "
                   f"empty HOME: its requests, streaming, tools, files and shell commands.")]
    if mode := getattr(scenario, "ENV", {}).get("AGENT_PERMISSION_MODE"):
        lines.append(wrap(f"Permission mode: {mode} (AGENT_PERMISSION_MODE={mode} in the chapter's "
                          f"environment; its start-up line names it too)."))
    check = getattr(scenario, "CHECK", None)
    if check and check.__doc__:
        lines += ["", "Checked at the end:", wrap(" ".join(check.__doc__.split()))]
    shown = getattr(scenario, "SHOW", None)
    if shown and shown.__doc__:
        lines += ["", "Shown at the end:", wrap(" ".join(shown.__doc__.split()))]
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------
# Running the chapter: what it prints is shown as it comes and kept for CHECK.
# --------------------------------------------------------------------------

class Relay:
    """The chapter's stdout and stderr, passed on to ours as they come, and kept.

    Two pipes carry no order between them, so two rules keep the terminal's view
    right: both are read by one thread, stdout drained first (the chapter writes its
    answer before the status line after it, so once that line can be read the
    answer can be too), and a line of stderr never lands inside a line of the
    answer: while stdout's last line is unfinished, stderr waits for its end (at
    most HOLD seconds). Without them an answer ran into the status line after it.
    The other way round, an unfinished line of stderr is the REPL's prompt waiting
    for a piped line, which no terminal echoes: it is ended before stdout goes on,
    so the answer does not read as what was typed there."""

    HOLD = 1.0   # seconds stderr waits for an unfinished line of stdout to end

    def __init__(self, proc, json_lines=False, echo_out=True):
        self.proc, self.json_lines, self.echo_out = proc, json_lines, echo_out
        self.out, self.err, self.both = [], [], []
        self.decoders = {n: codecs.getincrementaldecoder("utf-8")("replace") for n in ("out", "err")}
        self.partial = ""             # json_lines: the line being received
        self.open_line = False        # stdout's last character so far is not a newline
        self.held, self.held_at = [], None
        self.err_open = False         # the last thing shown is stderr's, without its newline
        self.thread = threading.Thread(target=self.pump, daemon=True)
        self.thread.start()

    def pump(self):
        fds = {self.proc.stdout.fileno(): "out", self.proc.stderr.fileno(): "err"}
        for fd in fds:
            os.set_blocking(fd, False)
        while fds:
            ready, _, _ = select.select(list(fds), [], [], POLL if self.held else None)
            for fd in sorted(ready, key=lambda f: fds[f] != "out"):   # stdout first
                while fd in fds:
                    try:
                        chunk = os.read(fd, 65536)
                    except BlockingIOError:
                        break
                    if not chunk:
                        del fds[fd]
                    else:
                        self.take(fds[fd], chunk)
            stdout_gone = "out" not in fds.values()
            if self.held and (not self.open_line or stdout_gone or time.monotonic() - self.held_at > self.HOLD):
                self.release()
        self.release()

    def take(self, stream, chunk):
        text = self.decoders[stream].decode(chunk)
        if stream == "err":
            self.err.append(chunk)
            if self.open_line or self.held:
                self.held_at = self.held_at or time.monotonic()
                self.held.append(text)
            else:
                self.show("err", text)
            return
        self.out.append(chunk)
        if text:
            self.open_line = not text.endswith("\n")
        self.show("out", text)

    def release(self):
        text, self.held, self.held_at = "".join(self.held), [], None
        if text:
            self.show("err", text)

    def show(self, stream, text):
        if stream == "out" and self.err_open and text:
            self.show("err", "\n")
        if text:
            self.err_open = stream == "err" and not text.endswith("\n")
        self.both.append(text)
        if stream == "out":
            if not self.echo_out:
                return
            if self.json_lines:
                self.partial += text
                *lines, self.partial = self.partial.split("\n")
                text = "".join(short_line(line) + "\n" for line in lines)
        target = sys.stdout if stream == "out" else sys.stderr
        target.flush()
        if binary := getattr(target, "buffer", None):   # the bytes: a terminal that is not UTF-8
            binary.write(text.encode("utf-8", "replace"))  # still gets them, as it would from
            binary.flush()                                  # the chapter itself
        else:
            target.write(text)
            target.flush()

    def finish(self):
        self.thread.join(timeout=5)
        if self.partial:
            sys.stdout.write(short_line(self.partial) + "\n")
        return (b"".join(self.out).decode("utf-8", "replace"),
                b"".join(self.err).decode("utf-8", "replace"), "".join(self.both))


def short_line(line, limit=WIDTH * 2):
    """A long line of stdout, cut: its start and how long it was."""
    return line if len(line) <= limit else f"{line[:limit]}... ({len(line):,} characters)"


def run_chapter(path, argv, workspace, env, answers=None, hold=None, show=None):
    """(exit status or None on timeout, stdout, stderr, both in order). `answers`: what
    the human types at the chapter's questions, one per line. `hold()`: stdin stays
    open until it returns True (a REPL stays idle, and a scheduled job may fire)."""
    piped = answers is not None or hold is not None
    proc = subprocess.Popen([sys.executable, str(path), *argv], cwd=workspace, env=env,
                            stdin=subprocess.PIPE if piped else subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    if answers:
        proc.stdin.write(answers.encode())
        proc.stdin.flush()
    if piped and hold is None:
        proc.stdin.close()
    sys.stdout.flush()
    relay = Relay(proc, json_lines=show == "json-lines", echo_out=show != "json")
    deadline, code, holding = time.monotonic() + TIMEOUT, None, hold is not None
    while time.monotonic() < deadline:
        if holding and hold():
            proc.stdin.close()
            holding = False
        try:
            code = proc.wait(timeout=POLL)
            break
        except subprocess.TimeoutExpired:
            continue
    else:
        proc.kill()
        proc.wait()
    if piped and not proc.stdin.closed:
        proc.stdin.close()
    out, err, both = relay.finish()
    proc.stdout.close()
    proc.stderr.close()
    return code, out, err, both


def run_in_terminal(path, argv, workspace, env, size, keys, done):
    """Run in a pseudo-terminal of `size` (columns, rows), typing `keys` ([(text to wait
    for on the screen, keys)]; text None: wait for done()). (exit status or None on
    timeout, the screen as text, the raw output)."""
    import pty
    import termios
    cols, rows = size
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))
    env = {k: v for k, v in env.items() if k not in ("NO_COLOR", "COLUMNS", "LINES")}
    env |= {"TERM": env.get("TERM") if env.get("TERM", "dumb") != "dumb" else "xterm-256color"}
    proc = subprocess.Popen([sys.executable, str(path), *argv], cwd=workspace, env=env,
                            stdin=slave, stdout=slave, stderr=slave, start_new_session=True)
    os.close(slave)
    screen, raw, decode = Screen(cols, rows), [], codecs.getincrementaldecoder("utf-8")("replace").decode
    keys, seen, eof = list(keys), {}, False   # seen: how often a text was on the screen when typed at
    deadline, code = time.monotonic() + TIMEOUT, None
    while time.monotonic() < deadline:
        if eof:
            time.sleep(POLL)
        elif select.select([master], [], [], POLL)[0]:
            try:
                data = os.read(master, 65536)
            except OSError:   # the program ended and its side is closed (EIO)
                data = b""
            eof = not data
            raw.append(data)
            if answer := screen.feed(decode(data)):   # a cursor position report, say
                os.write(master, answer.encode())
        if keys:
            wait, typed = keys[0]
            count = screen.text().count(wait) if wait is not None else 0
            if done() if wait is None else count > seen.get(wait, 0):
                seen[wait] = count
                os.write(master, typed.encode())
                keys.pop(0)
        if (code := proc.poll()) is not None and (eof or not select.select([master], [], [], 0)[0]):
            break
    else:
        proc.kill()
        proc.wait()
    os.close(master)
    return code, screen.text(), b"".join(raw).decode("utf-8", "replace")


def problems(code, server, steps, scenario, workspace, stdout, runs=None):
    """Every reason the demo did not run as scripted, one line each. `runs`: the
    records of a scenario's several runs (their exit statuses; CHECK may read them)."""
    found = []
    ended = [(f"(run {k}) " if len(runs) > 1 else "", r["code"]) for k, r in enumerate(runs, 1)] \
        if runs else [("", code)]
    for which, status in ended:
        if status is None:
            found.append(f"the chapter {which}did not finish within {TIMEOUT} s and was stopped")
        elif status:
            found.append(f"the chapter {which}exited with status {status}")
    if bad := server.invalid():
        found.append(f"the chapter sent an invalid request: {bad[0]['error']}")
    if server.exhausted:
        found.append(f"the chapter asked the model {server.exhausted} more time(s) than the "
                     f"script has replies ({len(steps)})")
    if left := server.remaining():
        used = len(steps) - left
        when = f"after reply {used}" if used else "before the first reply"
        found.append(f"{left} of {len(steps)} scripted replies were never requested: the chapter "
                     f"stopped {when}")
    for n, entry in enumerate(server.requests, 1):
        for block in (entry.get("step") or {}).get("content", []):
            if block.get("type") == "text" and block["text"].startswith("(demo:"):
                found.append(f"request {n} was not what the scenario expects: "
                             f"{block['text'][6:].strip(' )')}")
    check = getattr(scenario, "CHECK", None)
    if check is None:
        found.append("the scenario has no CHECK(workspace, stdout) of its outcome")
    else:
        more = {"runs": runs} if "runs" in inspect.signature(check).parameters else {}
        try:
            check(workspace, stdout, **more)
        except AssertionError as e:  # its message, one line
            found.append(f"check failed: {(str(e).splitlines() or ['assertion failed'])[0]}")
        except Exception as e:  # a missing file and the like: the outcome is not there
            found.append(f"check failed: {type(e).__name__}: {e}")
    return found


def show_after(scenario, workspace):
    """The scenario's SHOW(workspace) text, printed after the run; a failure to build
    it is one line (CHECK says what went wrong with the outcome)."""
    if (show := getattr(scenario, "SHOW", None)) is None:
        return
    try:
        text = show(workspace)
    except Exception as e:
        text = f"(nothing to show: {type(e).__name__}: {e})"
    print(f"\n{text}", flush=True)


def save_log(server, path):
    with open(path, "w", encoding="utf-8") as f:
        for n, e in enumerate(server.requests, 1):
            f.write(json.dumps({"n": n, "path": e["path"], "valid": e["valid"], "error": e["error"],
                                "body": e["body"], "reply": e["step"]}, ensure_ascii=False) + "\n")


def new_workspace(name, scenario):
    workspace = Path(tempfile.mkdtemp(prefix=f"agent-demo-{name}-"))
    if hasattr(scenario, "SETUP"):
        scenario.SETUP(workspace)
    return workspace


def command_line(path, run):
    prompt = [repr(run["prompt"])] if run.get("prompt") is not None else []
    return " ".join([f"python {path.name}", *run.get("args", []), *prompt])


def columns(text):
    """How many terminal columns a line takes (a wide character takes two)."""
    import unicodedata
    return sum(2 if unicodedata.east_asian_width(c) in "WF" else 1 for c in text)


def framed(text, cols):
    """A screen's text inside a frame `cols` wide: where each line ends is visible."""
    rule = "+" + "-" * cols + "+"
    return "\n".join([rule] + [f"|{line}{' ' * (cols - columns(line))}|" for line in text.splitlines()]
                     + [rule])


def replies_used(server, later, quiet=90):
    """For a run that holds stdin open: True once its replies are all used (`later`:
    the replies scripted for the runs after it), or when no request has come for
    `quiet` seconds (longer than a scenario's own waits): the chapter waits for
    something the script will never send, and the end of input lets it stop."""
    last = {"n": -1, "at": 0.0}

    def check():
        if server.remaining() <= later:
            return True
        if len(server.requests) != last["n"]:
            last.update(n=len(server.requests), at=time.monotonic())
        return time.monotonic() - last["at"] > quiet
    return check


def run_one(path, run, k, runs, workspace, fresh, home, server, scenario, later):
    """One run of the chapter, announced and shown as it goes; its record."""
    if len(runs) > 1:
        print(f"--- run {k + 1} of {len(runs)}: {run.get('title', '')}".rstrip(": "))
    argv = [*run.get("args", []), *([run["prompt"]] if run.get("prompt") is not None else [])]
    env = child_env(server.url, home, scenario, run)
    where = f"workspace {workspace}" if fresh else "the same workspace"
    print(f"$ {command_line(path, run)}\n  (scripted model at {server.url}, {where})", flush=True)
    done = replies_used(server, later)
    if size := run.get("terminal"):
        cols, rows = size
        print(f"  (in a pseudo-terminal of {cols}x{rows}, typing: "
              f"{', '.join(repr(keys) for _, keys in run.get('keys', []))}; its screen follows "
              f"when it ends)\n", flush=True)
        code, text, raw = run_in_terminal(path, argv, workspace, env, size, run.get("keys", []), done)
        print(f"The screen it left, {cols} columns wide (a live region shows its last frame):")
        print(framed(text, cols), flush=True)
        return {"run": run, "code": code, "stdout": text, "stderr": "", "transcript": text, "raw": raw,
                "workspace": workspace}
    if run.get("hold"):
        print("  (no prompt argument: the REPL reads the piped lines, and stdin stays open until the "
              "run's scripted replies are used)")
    print(flush=True)
    show = run.get("show")
    code, out, err, both = run_chapter(path, argv, workspace, env, run.get("input"),
                                       done if run.get("hold") else None, show)
    if show == "json":
        try:
            print(json.dumps(json.loads(out), indent=1, ensure_ascii=False), flush=True)
        except ValueError:
            print(out, flush=True)
    return {"run": run, "code": code, "stdout": out, "stderr": err, "transcript": both, "workspace": workspace}


def run_demo(name, keep=False, show=False):
    """Run one chapter's demo; (ok, summary line)."""
    path = chapter_file(name)
    scenario = load_scenario(name)
    if scenario is None:
        print(f"demo {name}: FAILED: no scenario (tests/scenarios/{name}.py is missing)")
        return False, "FAILED  no scenario"
    print(intro(name, path, scenario), flush=True)
    runs = scenario_runs(scenario)
    workspaces = [new_workspace(name, scenario)]
    home = Path(tempfile.mkdtemp(prefix=f"agent-demo-{name}-home-"))
    if hasattr(scenario, "SETUP_HOME"):
        scenario.SETUP_HOME(home)
    steps = list(scenario.STEPS)
    server = ScriptedAPI().start()
    server.script(steps)
    records, starts = [], []
    started = time.monotonic()
    try:
        for k, run in enumerate(runs):
            if k and run.get("fresh"):
                workspaces.append(new_workspace(name, scenario))
            later = sum(len(r["steps"]) for r in runs[k + 1:])
            starts.append((len(server.requests), f"run {k + 1} of {len(runs)}: {command_line(path, run)}"))
            fresh = not k or run.get("fresh")
            records.append(run_one(path, run, k, runs, workspaces[-1], fresh, home, server, scenario, later))
            if k + 1 < len(runs):
                print()
    finally:
        server.close()
    seconds = time.monotonic() - started
    show_after(scenario, workspaces[0])
    if show:
        sys.stderr.flush()
        print()
        show_requests(server.requests, scenario, starts if len(runs) > 1 else None)
    stdout = "".join(r["stdout"] for r in records)
    found = problems(records[0]["code"], server, steps, scenario, workspaces[0], stdout, records)
    shutil.rmtree(home, ignore_errors=True)
    print()
    for line in found:
        print(f"demo {name}: FAILED: {line}")
    n = len(server.requests)
    summary = (f"{n} request{'s' * (n != 1)}, {len(steps) - server.remaining()}/{len(steps)} "
               f"scripted replies used, {seconds:.1f} s")
    summary += "" if found else ", check held"
    if not found:
        what = " ".join((scenario.CHECK.__doc__ or "outcome checked").split())
        print(f"demo {name}: ok ({summary}: {what})")
    if keep:
        save_log(server, workspaces[0] / "requests.jsonl")
        print(f"workspace kept: {', '.join(map(str, workspaces))} (request log: requests.jsonl)")
    else:
        for workspace in workspaces:
            shutil.rmtree(workspace, ignore_errors=True)
    return not found, (f"ok      {summary}" if not found else f"FAILED  {found[0]}")


# --------------------------------------------------------------------------
# --show-requests: what the model received, request by request.
# --------------------------------------------------------------------------

# Content that a mechanism put there and a learner should spot at once.
MARKS = [
    ("<system-reminder>\n# Deferred tools", "DEFERRED TOOLS (named here, their definitions left out)"),
    ("<persisted-output>", "PERSISTED (full result on disk, the model gets a preview)"),
    ("[old tool result cleared", "CLEARED (placeholder for an old result)"),
    ("This session continues from an earlier conversation that was compacted",
     "COMPACTION SUMMARY (replaces the older messages)"),
    ("Re-read after compaction", "RE-READ after compaction"),
    ("<system-reminder>", "REMINDER (added by the loop, not the user)"),
    ("<skill name=", "SKILL body"),
    ("<fork_boilerplate>", "FORK brief"),
    ("<task-notification>\n<task-id>", "NOTIFICATION (a background command or agent ended)"),
    ("<scheduled-prompt id=", "SCHEDULED PROMPT (a job fired while the REPL was idle)"),
    ("<teammate-message ", "TEAMMATE MESSAGE (read from the inbox)"),
    ("<worktree>", "WORKTREE brief"),
]
COLOUR = sys.stdout.isatty() and "NO_COLOR" not in os.environ


def loud(text):
    return f"\033[1;33m{text}\033[0m" if COLOUR else text


def short(text, limit=100, quote=True):
    """One line, cut at `limit` characters; quoted, newlines shown as \\n."""
    text = str(text)
    cut = "..." if len(text) > limit else ""
    return (json.dumps(text[:limit], ensure_ascii=False) if quote else text[:limit]) + cut


def plain(obj):
    """A request part without its cache_control marks, for comparing requests."""
    if isinstance(obj, dict):
        return {k: plain(v) for k, v in obj.items() if k != "cache_control"}
    if isinstance(obj, list):
        return [plain(v) for v in obj]
    return obj


def blocks(message):
    content = message["content"]
    return [{"type": "text", "text": content}] if isinstance(content, str) else content


def result_text(block):
    content = block.get("content", "")
    if isinstance(content, list):
        return "".join(b.get("text", f"[{b.get('type')}]") for b in content)
    return str(content)


def mark_of(text):
    return next((label for needle, label in MARKS if needle in text), None)


def describe(block):
    """One line for one content block: its type and a shortened payload."""
    kind = block.get("type")
    if kind == "text":
        text = block["text"]
        body = f"text ({len(text):,} chars) {short(text)}"
    elif kind == "tool_use":
        args = short(json.dumps(block["input"], ensure_ascii=False), 140, quote=False)
        body = f"tool_use {block['name']} {args}  id {block['id']}"
        text = ""
    elif kind == "tool_result":
        text = result_text(block)
        flag = ", is_error" if block.get("is_error") else ""
        first = text
        if text.startswith("<persisted-output>"):   # the line that says where the rest is
            first = " ".join(text.splitlines()[1:3])
        elif text.startswith("[old tool result cleared"):
            first = text.split("\n")[0]
        body = f"tool_result for {block['tool_use_id']} ({len(text):,} chars{flag}) {short(first, 120)}"
    elif kind == "thinking":
        text, body = "", f"thinking ({len(block.get('thinking', '')):,} chars)"
    else:
        text, body = "", kind
    mark = mark_of(text) if text else None
    return f"{body}  {loud('<<< ' + mark)}" if mark else body


def shape(message):
    return [(x.get("type"), x.get("id"), x.get("tool_use_id")) for x in blocks(message)]


def same_shape(new, old):
    """An old message edited in place (same role, blocks and tool ids) or with
    blocks appended (a prompt merged into a trailing user message)."""
    a, b = shape(new), shape(old)
    return new["role"] == old["role"] and a[:len(b)] == b


def print_message(i, message, sign, before=None, full=None):
    """One message: its blocks, or (before: the message it changed) only what changed.
    full(block): the text to print in full under a block, or None."""
    parts = blocks(message)
    full = full or (lambda block: None)
    if before is not None:   # changed in place: only the blocks that differ or were added
        old = blocks(before)
        pairs = [(b, o) for b, o in zip(parts, old) if plain(b) != plain(o)]
        added = parts[len(old):]
        what = ([f"{len(pairs)} block(s) changed"] if pairs else []) + \
            ([f"{len(added)} block(s) added"] if added else [])
        print(f"  {sign} [{i}] {message['role']} ({', '.join(what)})")
        for b, o in pairs:
            was = len(result_text(o)) if o.get("type") == "tool_result" else len(o.get("text", ""))
            print(f"        {describe(b)}  (was {was:,} chars)")
        for b in added:
            print(f"      + {describe(b)}")
            print_whole(full(b))
        return
    if len(parts) == 1:
        print(f"  {sign} [{i}] {message['role']}: {describe(parts[0])}")
        print_whole(full(parts[0]))
        return
    print(f"  {sign} [{i}] {message['role']}: {len(parts)} blocks")
    for b in parts:
        print(f"        {describe(b)}")
        print_whole(full(b))


def print_whole(text):
    """A block's text in full (FULL_RESULTS), under its one-line description."""
    if text is not None:
        print("          (in full:)")
        for line in text.splitlines() or [""]:
            print(f"          | {line}")


def common_prefix(a, b):
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def system_text(body):
    system = body.get("system") or ""
    return system if isinstance(system, str) else "\n".join(b.get("text", "") for b in system)


def breakpoints(body):
    """Where the cache_control marks sit, in prefix order: tools, system, messages."""
    where = []
    for i, t in enumerate(body.get("tools") or []):
        if "cache_control" in t:
            where.append(f"tools[{i}] ({t.get('name')}, end of tools)" if i == len(body["tools"]) - 1
                         else f"tools[{i}] ({t.get('name')})")
    system = body.get("system")
    for i, b in enumerate(system if isinstance(system, list) else []):
        if "cache_control" in b:
            where.append(f"system[{i}]")
    for i, m in enumerate(body.get("messages") or []):
        for j, b in enumerate(blocks(m)):
            if isinstance(b, dict) and "cache_control" in b:
                where.append(f"messages[{i}] block {j} ({b.get('type')})")
    if "cache_control" in body:
        where.append("top level (automatic)")
    return where


def print_full(text):
    for line in (text or "(none)").splitlines():
        print("\n".join(textwrap.wrap(line, WIDTH - 6, initial_indent="    | ",
                                       subsequent_indent="    |   ")) or "    |")


def print_system(n, text, compare, seen):
    if compare is not None and text == system_text(compare["body"]):
        print("  system: (unchanged)")
    elif text in seen:
        print(f"  system: (same as request {seen[text]})")
    elif compare is None:
        print(f"  system ({len(text):,} chars, in full):")
        print_full(text)
    else:
        old = system_text(compare["body"])
        if difflib.SequenceMatcher(None, old, text).ratio() < 0.5:
            print(f"  system: a different prompt ({len(text):,} chars, in full):")
            print_full(text)
        else:
            print(f"  system: changed since request {compare['n']}:")
            diff = difflib.unified_diff(old.splitlines(), text.splitlines(), lineterm="", n=0)
            for line in list(diff)[2:]:
                print(f"    {line}")
    seen.setdefault(text, n)


def print_tools(tools, compare):
    names = [t.get("name") for t in tools]
    if compare is None:
        print(f"  tools ({len(names)}): {', '.join(names) or '(none)'}")
        return
    before = compare["body"].get("tools") or []
    old = [t.get("name") for t in before]
    if plain(before) == plain(tools):
        print(f"  tools: (unchanged, {len(names)})")
    elif old == names:
        edited = [t.get("name") for t, o in zip(tools, before) if plain(t) != plain(o)]
        print(f"  tools: same {len(names)} names; changed: {', '.join(edited)}")
    else:
        gone = [x for x in old if x not in names]
        new = [x for x in names if x not in old]
        change = " ".join([f"-{x}" for x in gone] + [f"+{x}" for x in new]) or "reordered"
        print(f"  tools ({len(names)}): {', '.join(names) or '(none)'}   [{change} since request "
              f"{compare['n']}]")


def print_reply(step):
    if not step:
        return
    if step["kind"] == "error":
        print(f"  <- scripted answer: HTTP {step['status']} {step['body']['error']['message']}")
        return
    if step["kind"] == "hangup":
        print("  <- scripted answer: connection dropped")
        return
    parts = []
    for b in step["content"]:
        if b["type"] == "text":
            parts.append(f"text {short(b['text'], 70)}")
        elif b["type"] == "tool_use":
            parts.append(f"tool_use {b['name']}")
        else:
            parts.append(b["type"])
    print(f"  <- scripted reply: {' + '.join(parts)}  [{step['stop_reason']}]")
    if step["usage"]:
        figures = ", ".join(f"{k}={v:,}" for k, v in step["usage"].items())
        print(f"     {loud('usage is SCRIPTED: ' + figures)} (a fixed figure, not the request's size)")


def sender_of(scenario, body):
    """Who sent the request, as the scenario reads it from the request (None: it does not say)."""
    name = getattr(scenario, "SENDER", None)
    if name is None or not body:
        return None
    try:
        return name(body)
    except Exception as e:  # a request the scenario did not expect: say so, never crash the view
        return f"? ({type(e).__name__})"


def is_reply(message, step):
    """Is this history message the scripted reply `step` (its text and tool calls)?"""
    if message["role"] != "assistant" or not step or step.get("kind") != "reply":
        return False
    said = lambda parts: [(b.get("type"), b.get("text"), b.get("id")) for b in parts  # noqa: E731
                          if b.get("type") in ("text", "tool_use")]
    return said(blocks(message)) == said(step["content"])


def tool_names(msgs):
    """tool_use id -> tool name, over a request's messages."""
    return {b.get("id"): b.get("name") for m in msgs for b in blocks(m)
            if isinstance(b, dict) and b.get("type") == "tool_use"}


def show_requests(log, scenario=None, runs=None):
    """What the model received: per request only what is new or changed since
    the earlier request it continues (the one sharing the longest message prefix;
    with the scenario's SENDER, an earlier request of the same sender). `runs`:
    (index of its first request, what it is) for each run of a scenario's RUNS."""
    print(f"=== What the model received: {len(log)} request(s) ===")
    print(wrap("Per request: the messages new (+) or changed in place (~) since the earlier "
               "request it continues (= a message a new process restored from an earlier "
               "one's session); the system prompt in full once, then (unchanged) or a "
               "diff; the tool names; where the cache_control breakpoints sit. <<< marks "
               "content a mechanism put there. The reply under each request is the scripted "
               "one." + (" Each request is headed by its sender, read from the request; it is "
                         "compared with that sender's earlier requests." if
                         getattr(scenario, "SENDER", None) else ""), ""))
    full_tools = set(getattr(scenario, "FULL_RESULTS", ()))
    run_of = {start: (k, label) for k, (start, label) in enumerate(runs or [])}
    done, seen, last_opts, run_now = [], {}, {}, 0
    for n, entry in enumerate(log, 1):
        if n - 1 in run_of:
            run_now, label = run_of[n - 1]
            print(f"\n>>> {label}")
        body = entry["body"] if isinstance(entry["body"], dict) else {}
        msgs = [plain(m) for m in body.get("messages") or []]
        who = sender_of(scenario, body)
        path = entry["path"].split("?")[0]
        count_only = path.endswith("/count_tokens")
        opts = ", ".join(["stream" if body.get("stream") else "no stream",
                          f"max_tokens {body.get('max_tokens')}", f"model {body.get('model')}"])
        head = f"--- request {n}" + (f" from {who}" if who else "") + f": POST {path}"
        if not count_only and opts != last_opts.get(who):  # shown when they change
            head, last_opts[who] = f"{head}  ({opts})", opts
        print(f"\n{head}")
        if not entry["valid"]:
            print(f"  {loud('REJECTED by the API: ' + str(entry['error']))}")
        if count_only:
            print("  (a token count: the model does not answer it)")
        # The earlier request this one continues: the longest shared message prefix.
        mine = [prev for prev in done if prev["who"] == who]
        base, shared = None, 0
        for prev in mine:
            k = common_prefix(prev["msgs"], msgs)
            if k and k >= shared:
                base, shared = prev, k
        compare = base or (mine[-1] if mine else None)
        names = tool_names(msgs)
        full = lambda b: result_text(b) if b.get("type") == "tool_result" and \
            names.get(b.get("tool_use_id")) in full_tools else None  # noqa: E731
        if body.get("tool_choice"):
            choice = body["tool_choice"]
            note = "  (no tool may be called)" if choice.get("type") == "none" else ""
            print(f"  tool_choice: {json.dumps(choice)}{note}")
        print_system(n, system_text(body), compare, seen)
        print_tools(body.get("tools") or [], compare)
        where = breakpoints(body)
        print(f"  cache breakpoints ({len(where)}): {' | '.join(where) or 'none'}")
        if base is None:
            note = "" if not done else "  (a fresh message list: it shares no message with an earlier request)"
            print(f"  messages: {len(msgs)}{note}")
            for i, m in enumerate(msgs):
                print_message(i, m, "+", full=full)
        else:
            i, changed = shared, []
            old = base["msgs"]
            while i < min(len(msgs), len(old)) and (msgs[i] == old[i] or same_shape(msgs[i], old[i])):
                if msgs[i] != old[i]:
                    changed.append(i)
                i += 1
            dropped = len(old) - i
            # A new process that loaded an earlier one's session: that request's
            # messages and the reply it got come back, restored from the file.
            restored = base["run"] != run_now
            answered = restored and not dropped and i < len(msgs) and is_reply(msgs[i], base["reply"])
            parts = [f"{shared} as in request {base['n']}"]
            if restored:
                parts = [f"{shared + answered} restored from run {base['run'] + 1}'s session: the "
                         f"{shared} of request {base['n']}" + (" and its reply" if answered else "")]
            if changed:
                parts.append(f"{len(changed)} changed")
            if len(msgs) - i - answered:
                parts.append(f"{len(msgs) - i - answered} new")
            if dropped:
                parts.append(f"request {base['n']}'s last {dropped} left out")
            print(f"  messages: {len(msgs)} ({', '.join(parts)})")
            for k in range(shared) if restored else ():   # the restored history, one line a message
                print_message(k, msgs[k], "=")
            for k in changed:
                print_message(k, msgs[k], "~", before=old[k], full=full)
            if answered:
                print(f"  = [{i}] assistant: request {base['n']}'s reply: {describe(blocks(msgs[i])[0])}")
            for k in range(i + answered, len(msgs)):
                print_message(k, msgs[k], "+", full=full)
        print_reply(entry.get("step"))
        done.append({"n": n, "msgs": msgs, "body": body, "who": who, "run": run_now, "reply": entry.get("step")})
    print()


# --------------------------------------------------------------------------

def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("chapter", help="s01, s02, ... or all")
    ap.add_argument("--keep", action="store_true",
                    help="keep the temporary workspace, with the request log as requests.jsonl")
    ap.add_argument("--show-requests", action="store_true",
                    help="after the run, print what the model received, request by request")
    args = ap.parse_args()
    if args.chapter != "all":
        ok, _ = run_demo(args.chapter, args.keep, args.show_requests)
        return 0 if ok else 1
    results = []
    for name in chapters():
        results.append((name, *run_demo(name, args.keep, args.show_requests)))
        print("\n")
    print(f"=== demo all: {sum(ok for _, ok, _ in results)} of {len(results)} demos ok ===")
    for name, ok, summary in results:
        print(f"{name:<5}  {summary}")
    return 0 if all(ok for _, ok, _ in results) else 1


if __name__ == "__main__":
    sys.exit(main())
