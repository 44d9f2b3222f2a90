#!/usr/bin/env python3
"""Benchmark (not a test): agent_full's own overhead, on the scripted model.

    python tests/bench_full.py [--turns 500] [--deltas 20] [--starts 5] [--chapter agent_full]

1. Harness CPU as the history grows. One long session in this process, set up
   as main() sets it up, each user turn a read_file call and a text answer (two
   model calls, four messages), the session file written as in a real run, the
   plain front end printing to /dev/null. The CPU time of the agent's thread
   per turn (the scripted server runs in threads of its own and is not counted)
   is the median of the ten turns around turn 10 and around turn N; both are
   printed with their ratio (the issue's target: at most 2x at turn 500), and
   beside them the same less the SDK's own time in each turn (call_model's row:
   the request sent, the stream parsed; before full.6 also the SDK's copy and
   encoding of the whole body, twice a turn). Then where it goes: the functions that pass over
   the history, timed in the loop (each row its own time, less the rows it
   calls), the garbage collector's share, and what one pass over the final
   history costs alone.
2. Time to the first text delta on stdout. The REPL in a subprocess, 20 prompts
   piped in; for each answer, the moment the scripted server sent its first
   text delta (Nagle off, so the socket does not hold it back) and the moment
   that text arrived on the child's stdout, both on the machine's monotonic
   clock; the median, min and max of the gap.
3. Start-up, beside the Claude Code CLI bundled in claude-agent-sdk (offline, on the
   scripted API), each the median of a few starts taken in turns: the time to the
   interactive prompt (stdin and stdout a pty, as a human starts it: agent_full's
   first prompt, the CLI's input box), the time to a -p run's first request at the server, and a bare
   `import anthropic`, the floor of a -p run that uses the SDK (full.9's goals: the
   prompt under 0.3 s, the first request within 0.15 s of that floor). Then what
   had been imported when the prompt came, under -X importtime.

Figures only; nothing here can fail.
"""
import argparse
import fcntl
import gc
import importlib
import json
import os
import pty
import re
import select
import socket
import statistics
import struct
import subprocess
import sys
import tempfile
import termios
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

import anthropic  # noqa: E402
import fake_api  # noqa: E402
from fake_api import ScriptedAPI, reply, tool  # noqa: E402
from test_cli_corpus import cli_binary, cli_env  # noqa: E402

WINDOW = 5  # turns on each side of the one measured: the median of 2 * WINDOW turns
TERMINAL_WAIT = 30  # seconds a start may take to show its prompt before it counts as never
CLI_PROMPT = "\u276f".encode()  # the CLI's input box: "❯ "


def quiet_env(home, api=None):
    env = {k: v for k, v in os.environ.items() if not k.startswith("ANTHROPIC") and k != "MODEL_ID"}
    env |= {"HOME": str(home), "AGENT_AUTO_MEMORY": "0", "AGENT_PERMISSION_MODE": "bypassPermissions",
            "NO_PROXY": "127.0.0.1,localhost", "no_proxy": "127.0.0.1,localhost"}
    return env | ({"ANTHROPIC_API_KEY": "bench", "ANTHROPIC_BASE_URL": api.url} if api else {})


# --- 1. CPU per turn ---------------------------------------------------------------------------

def one_turn(mod, api, client, history, n):
    api.script([reply(tool("read_file", {"path": "small.txt"})), reply(f"Answer {n}: small.txt says hi.")])
    mod.add_user_text(history, f"turn {n}: what does small.txt say?")
    start = time.thread_time()
    reason = mod.prompt_turn(client, history) if hasattr(mod, "prompt_turn") else mod.agent_loop(client, history)
    spent = time.thread_time() - start
    with api._lock:  # the server's request log would hold every body: keep memory flat
        api._log.clear()
    assert reason == "end_turn" and api.remaining() == 0, (reason, api.remaining())
    return spent


# Where a turn's CPU goes: each of these functions is wrapped with a timer that
# counts its own time, less that of the wrapped ones it calls, so the rows add
# up (to the turn, with "the rest"). Each: (name, what it stands for).
WATCHED = [("update_view", "the agent's view brought up to date, its end made again (s06.15)"),
           ("shown_messages", "the history normalised from scratch (s06.4 over s02.5)"),
           ("estimate_tokens", "json.dumps for a size estimate (s06.3)"),
           ("clear_old_results", "the batch clear's check, each call past WORKING_BUDGET (s06.4)"),
           ("tool_results", "the results found in the history (s06.4)"),
           ("request_messages", "the cache marks, on copies (s06.6)"),
           ("request_body", "the request's bytes: kept JSON joined, the newest encoded (full.6)"),
           ("call_model", "the SDK: the request sent, the stream parsed"),
           ("system_prompt", "the prompt rebuilt, skill files read and hashed (s05, s09)"),
           ("sync_session", "the session file (s09.4)"),
           ("report_call", "the reply and status events (full.1)")]
SDK = "call_model"  # the row that is the SDK's own work (request_messages, request_body: rows of their own)


class Timers:
    """Exclusive thread-CPU time per watched function, and the collector's time:
    all of it, and the part spent inside the SDK's row."""

    def __init__(self, mod):
        self.spent, self.stack, self.gc, self.thread = {}, [], [0.0, 0.0], threading.get_ident()
        for name, _ in WATCHED:
            if hasattr(mod, name):
                setattr(mod, name, self.wrap(name, getattr(mod, name)))
        gc.callbacks.append(self.collecting)

    def wrap(self, name, fn):
        def timed(*args, **kwargs):
            now = time.thread_time()
            if self.stack:  # the caller's clock stops while this one runs
                self.stack[-1][1] += now - self.stack[-1][2]
            self.stack.append([name, 0.0, now])
            try:
                return fn(*args, **kwargs)
            finally:
                name_, own, since = self.stack.pop()
                now = time.thread_time()
                self.spent[name_] = self.spent.get(name_, 0.0) + own + now - since
                if self.stack:
                    self.stack[-1][2] = now
        return timed

    def collecting(self, phase, info):
        if threading.get_ident() != self.thread:  # the scripted server collects in its own threads
            return
        if phase == "start":
            self.gc_start = time.thread_time()
        elif hasattr(self, "gc_start"):
            took = time.thread_time() - self.gc_start
            self.gc[0] += took
            self.gc[1] += took if self.stack and self.stack[-1][0] == SDK else 0.0

    def take(self):
        spent, gc_time = dict(self.spent), self.gc
        self.spent, self.gc = {}, [0.0, 0.0]
        return spent, gc_time


def cpu_per_turn(mod, turns, tmp):
    """{turn: CPU seconds}, {turn: (row times, gc time)} of the 10 turns around
    turn 10 and turn N, and the history."""
    ws = Path(tmp) / "ws"
    ws.mkdir()
    (ws / "small.txt").write_text("hi\n")
    os.environ.update(quiet_env(Path(tmp) / "home"))
    api = ScriptedAPI().start()
    client = anthropic.Anthropic(api_key="bench", base_url=api.url, max_retries=0)
    state = mod.AgentState(ws)
    state.mode, state.permissions["sandbox"]["enabled"] = "bypassPermissions", False
    state.record = mod.new_session(state)
    mod.CURRENT.set(state)
    if hasattr(mod, "start_front_end"):  # as main() starts: the front end, the collector's settings
        mod.start_front_end([])
    timers, history, cpu, parts = Timers(mod), [], {}, {}
    real = sys.stdout, sys.stderr
    sys.stdout = sys.stderr = open(os.devnull, "w")
    try:
        for n in range(1, turns + WINDOW + 1):
            timers.take()
            cpu[n] = one_turn(mod, api, client, history, n)
            if n in window(10) or n in window(turns):
                parts[n] = timers.take()
    finally:
        sys.stdout.close()
        sys.stdout, sys.stderr = real
        api.close()
    return cpu, history, parts


def window(n):
    return range(n - WINDOW + 1, n + WINDOW + 1)


def around(cpu, n):
    return statistics.median(cpu[k] for k in window(n))


def cpu_ms(fn, reps=5):
    times = []
    for _ in range(reps):
        start = time.thread_time()
        fn()
        times.append(time.thread_time() - start)
    return statistics.median(times) * 1000


def passes(mod, history):
    """What one pass over the final history costs, and how many each turn makes (two calls)."""
    from anthropic._utils._prepare import serialize_data
    shown = mod.shown_messages(history)
    body = {"model": mod.model_id(), "max_tokens": mod.MAX_TOKENS, "system": mod.cached(mod.system_prompt()),
            "tools": mod.cached(mod.request_tools(mod.TOOLS)), "messages": mod.request_messages(history),
            "stream": True}
    never = 10 ** 9  # min_tokens no batch reaches: the check runs, nothing is cleared
    rows = [("update_view", 10, lambda: mod.update_view(history),
             "in step with the history: one list compare, the end made again"),
            ("shown_messages", 6, lambda: mod.shown_messages(history), "from scratch (what s06.4 made)"),
            ("estimate_tokens", 4, lambda: mod.estimate_tokens(shown), "of the whole view (what s06.3 made)"),
            ("tool_results", 4, lambda: mod.tool_results(history), "of the whole history (after_call, the clear)"),
            ("clear_old_results", 2, lambda: mod.clear_old_results(history, never), "each call past budget"),
            ("the SDK's request", 2, lambda: serialize_data(body, location="body"),
             "the SDK's copy and encoding of the body (before full.6)"),
            ("request_body", 2, lambda: mod.request_body(body["model"], body["max_tokens"], body["system"],
                                                         body["tools"], history),
             "the same bytes from the kept JSON (full.6)"),
            ("sync_session", 6, lambda: mod.sync_session(history), "already incremental")]
    gone = ("shown_messages", "estimate_tokens", "tool_results") if hasattr(mod, "update_view") else ()
    gone += ("the SDK's request",) if hasattr(mod, "request_body") else ()
    rows = [(name, 0 if name in gone else n, fn, note)  # those no longer on the loop's path: what they would cost
            for name, n, fn, note in rows]
    print("   one pass over the final history, alone, x the passes a turn makes:")
    for name, per_turn, fn, note in rows:
        if hasattr(mod, name) or name == "the SDK's request":
            ms = cpu_ms(fn)
            print(f"   {name:18} {ms:6.2f} ms x {per_turn} = {ms * per_turn:6.2f} ms  {note}")


def report_cpu(mod, turns, tmp):
    cpu, history, parts = cpu_per_turn(mod, turns, tmp)
    own = {n: cpu[n] - parts[n][0].get(SDK, 0.0) for n in parts}  # the turn less the SDK's own time
    early, late, early_own, late_own = around(cpu, 10), around(cpu, turns), around(own, 10), around(own, turns)
    size = len(mod.json.dumps(history)) // 1000
    print("1. harness CPU per user turn (read_file + answer: 2 model calls), agent thread only")
    print(f"   turn 10: {early * 1000:7.2f} ms   turn {turns}: {late * 1000:7.2f} ms   "
          f"ratio {late / early:.2f}x   (median of {2 * WINDOW} turns each; history at the end: "
          f"{len(history)} messages, {size} KB)")
    print(f"   less the SDK's own time ({SDK}'s row):  turn 10: {early_own * 1000:7.2f} ms   turn {turns}: "
          f"{late_own * 1000:7.2f} ms   ratio {late_own / early_own:.2f}x")
    print(f"   where it goes, ms per turn (mean of the {2 * WINDOW} turns):  turn 10   turn {turns}")
    means = {n: {name: statistics.mean(parts[k][0].get(name, 0.0) for k in window(n)) * 1000
                 for name, _ in WATCHED} for n in (10, turns)}
    totals = {n: statistics.mean(cpu[k] for k in window(n)) * 1000 for n in (10, turns)}
    for name, what in WATCHED:
        if hasattr(mod, name):
            print(f"   {name:17} {what:66} {means[10][name]:7.2f} {means[turns][name]:8.2f}")
    rest = {n: totals[n] - sum(means[n].values()) for n in (10, turns)}
    print(f"   {'the rest':17} {'the loop, the tool call, the events':66} {rest[10]:7.2f} {rest[turns]:8.2f}")
    for i, what in enumerate(("the garbage collector, inside the rows above",
                              f"  of which inside {SDK}'s row (in the SDK's figure above)")):
        gc_ms = {n: statistics.mean(parts[k][1][i] for k in window(n)) * 1000 for n in (10, turns)}
        print(f"   {'(of it: gc)' if i == 0 else '':17} {what:66} {gc_ms[10]:7.2f} {gc_ms[turns]:8.2f}")
    passes(mod, history)
    print()


# --- 2. time to the first text delta ------------------------------------------------------------

FIRST_DELTA = {}  # the first text of a reply -> when the server wrote it (monotonic)


def send_stream(self, events, delay, cut_after):
    """fake_api's send_stream, noting when the first text delta of a reply leaves."""
    self.send_response(200)
    self.send_header("Content-Type", "text/event-stream")
    self.send_header("Transfer-Encoding", "chunked")
    self.end_headers()
    noted = False
    self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # no Nagle wait between frames
    for name, data in events:
        frame = f"event: {name}\ndata: {fake_api.json.dumps(data)}\n\n".encode()
        if not noted and name == "content_block_delta" and data["delta"]["type"] == "text_delta":
            FIRST_DELTA[data["delta"]["text"]] = time.monotonic()  # just before it leaves
            noted = True
        self.wfile.write(b"%x\r\n%s\r\n" % (len(frame), frame))
        self.wfile.flush()
    self.wfile.write(b"0\r\n\r\n")


def first_delta_latency(chapter, prompts, tmp):
    fake_api._Handler.send_stream = send_stream
    api = ScriptedAPI().start()
    answers = [f"R{k:02d} is the answer to prompt {k}." for k in range(prompts)]
    api.script([reply(a) for a in answers])
    ws, home = Path(tmp) / "ws2", Path(tmp) / "home2"
    ws.mkdir(), home.mkdir()
    p = subprocess.Popen([sys.executable, str(ROOT / f"{chapter}.py")], cwd=ws, env=quiet_env(home, api),
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    seen, out = {}, b""
    p.stdin.write("".join(f"prompt {k}\n" for k in range(prompts)).encode())
    p.stdin.close()
    while chunk := os.read(p.stdout.fileno(), 65536):
        now, out = time.monotonic(), out + chunk
        for k in range(prompts):
            if k not in seen and f"R{k:02d}".encode() in out:
                seen[k] = now
    p.wait()
    api.close()
    gaps = [(seen[k] - FIRST_DELTA[answers[k][:12]]) * 1000 for k in range(prompts)
            if k in seen and answers[k][:12] in FIRST_DELTA]
    print(f"2. time from the server's first text delta to it on stdout (REPL, {len(gaps)} turns)")
    if gaps:
        print(f"   median {statistics.median(gaps):.2f} ms   min {min(gaps):.2f} ms   max {max(gaps):.2f} ms\n")
    else:
        print("   no answer was seen on stdout\n")


# --- 3. start-up ----------------------------------------------------------------------------------

def until_prompt(argv, env, cwd, prompt):
    """Seconds from starting the process to `prompt` on its stderr; the stderr text."""
    start = time.monotonic()
    p = subprocess.Popen(argv, cwd=cwd, env=env, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                         stderr=subprocess.PIPE)
    err = b""
    while prompt not in err:
        chunk = os.read(p.stderr.fileno(), 65536)
        if not chunk:
            break
        err += chunk
    spent = time.monotonic() - start
    p.stdin.close()
    err += p.stderr.read()
    p.wait()
    return spent, err.decode(errors="replace")


def import_times(err):
    """Cumulative import times (us) of the top-level imports, from -X importtime's lines."""
    times = {}
    for line in err.splitlines():
        parts = line.removeprefix("import time:").split("|")
        if line.startswith("import time:") and len(parts) == 3 and parts[1].strip().isdigit():
            if not parts[2][1:].startswith(" "):  # nested imports are indented under their importer
                times[parts[2].strip()] = times.get(parts[2].strip(), 0) + int(parts[1])
    return times


def on_terminal(argv, env, cwd, marker, err_path=os.devnull):
    """Seconds from starting `argv`, its stdin and stdout a pseudo-terminal (as a human
    runs it), to `marker` on that terminal (nan if it never comes); stderr goes to
    err_path. The process is killed then: what it does after its prompt is not timed."""
    fd, child = pty.openpty()
    fcntl.ioctl(child, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 120, 0, 0))
    with open(err_path, "wb") as err:
        start = time.monotonic()
        p = subprocess.Popen(argv, cwd=cwd, env=env | {"TERM": "xterm-256color"}, stdin=child, stdout=child,
                             stderr=err, start_new_session=True)
    os.close(child)
    seen = b""
    while marker not in seen and select.select([fd], [], [], TERMINAL_WAIT)[0]:
        try:
            chunk = os.read(fd, 65536)
        except OSError:  # it ended
            break
        if not chunk:
            break
        seen += chunk
    spent = time.monotonic() - start if marker in seen else float("nan")
    p.kill()
    p.wait()
    os.close(fd)
    return spent


def to_first_request(argv, env, cwd, api):
    """Seconds from starting `argv` to its first Messages request at the scripted server,
    which answers "ok" (nan if none came); the run is left to finish."""
    arrived = []
    api.reset(full=True)
    api.script([lambda body: arrived.append(time.monotonic()) or reply("ok")])
    start = time.monotonic()
    subprocess.run(argv, cwd=cwd, env=env, stdin=subprocess.DEVNULL, capture_output=True, timeout=120)
    return arrived[0] - start if arrived else float("nan")


def claude_home(home, cwd):
    """A HOME where the CLI's interactive UI comes straight to its prompt: onboarding done, the
    scripted key approved, the folder trusted (a fresh one asks first, and reaches for the network)."""
    (home / ".claude.json").write_text(json.dumps({
        "hasCompletedOnboarding": True, "customApiKeyResponses": {"approved": ["test"], "rejected": []},
        "projects": {str(cwd): {"hasTrustDialogAccepted": True}}}))


def startup(chapter, starts, tmp):
    """3. Start-up, side by side with the Claude Code CLI bundled in claude-agent-sdk."""
    api = ScriptedAPI().start()
    ws, home, cli_ws, cli_home = (Path(tmp) / name for name in ("ws3", "home3", "cli-ws3", "cli-home3"))
    for folder in (ws, home, cli_ws, cli_home):
        folder.mkdir()
    claude_home(cli_home, cli_ws.resolve())
    env, script = quiet_env(home, api), [sys.executable, str(ROOT / f"{chapter}.py")]
    task = script + (["-p", "hi"] if chapter == "agent_full" else ["hi"])  # a chapter runs a task as its argument
    prompt = f"{chapter.split('_')[0]} >>".encode()  # prompt_toolkit draws the space after it as a cursor move
    bare = [sys.executable, "-c", "import sys; sys.stderr.write('x >> '); sys.stderr.flush()"]
    sdk = [sys.executable, "-c", "import anthropic, sys; sys.stderr.write('x >> '); sys.stderr.flush()"]
    cli, why = cli_binary()
    runs = {"prompt": lambda: on_terminal(script, env, ws, prompt),
            "request": lambda: to_first_request(task, env, ws, api),
            "sdk": lambda: until_prompt(sdk, env, ws, b"x >> ")[0],
            "bare": lambda: until_prompt(bare, env, ws, b"x >> ")[0]}
    if cli:
        runs |= {"cli prompt": lambda: on_terminal([str(cli)], cli_env(api, cli_home), cli_ws, CLI_PROMPT),
                 "cli request": lambda: to_first_request([str(cli), "-p", "hi", "--permission-mode",
                                                          "bypassPermissions"], cli_env(api, cli_home), cli_ws, api)}
    times = {name: [] for name in runs}
    for _ in range(starts):  # taken in turns, so a busy moment of the machine hits all of them alike
        for name, run in runs.items():
            times[name].append(run())
    ms = {name: statistics.median(t) * 1000 if t else float("nan") for name, t in times.items()}
    err = Path(tmp) / "importtime3.txt"
    on_terminal([sys.executable, "-X", "importtime", *script[1:]], env, ws, prompt, err)
    imported = err.read_text(errors="replace")  # what had loaded when the prompt came
    before, sdk_done = import_times(imported), re.search(r"\| +anthropic$", imported, re.M) is not None
    api.close()
    peer = f"Claude Code {cli_version(cli)}" if cli else "Claude Code CLI"
    print(f"3. start-up, median of {starts} starts taken in turns (2 shared cores: single runs vary a lot)")
    print(f"   {'':47} {chapter:>12} {peer:>22}")
    for label, ours, theirs in (("the interactive prompt (stdin, stdout a pty)", "prompt", "cli prompt"),
                                (" ".join(task[2:]) + ": its first request at the server", "request", "cli request"),
                                ("a bare `import anthropic` (to a line after it)", "sdk", None),
                                ("a bare Python (to a line)", "bare", None)):
        other = f"{ms[theirs]:19.0f} ms" if theirs in ms else f"{'-':>22}"
        print(f"   {label:47} {ms[ours]:9.0f} ms {other}")
    if not cli:
        print(f"   (no CLI beside it: {why})")
    print(f"   goals: the prompt under 300 ms ({ms['prompt']:.0f} ms); the first request at most 150 ms after "
          f"the bare SDK import ({ms['request'] - ms['sdk']:+.0f} ms)")
    top = sorted(before.items(), key=lambda x: -x[1])[:6]
    print(f"   imported when the prompt came, under -X importtime (slowed by it): the SDK "
          f"{'yes' if sdk_done else 'not yet'}; the largest: " +
          ", ".join(f"{name} {us / 1000:.0f} ms" for name, us in top))


def cli_version(cli):
    out = subprocess.run([str(cli), "--version"], capture_output=True, text=True, timeout=60).stdout
    return out.split()[0] if out.strip() else "?"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--turns", type=int, default=500)
    ap.add_argument("--deltas", type=int, default=20)
    ap.add_argument("--starts", type=int, default=5)
    ap.add_argument("--chapter", default="agent_full")
    args = ap.parse_args()
    mod = importlib.import_module(args.chapter)
    print(f"{args.chapter}, {os.cpu_count()} cores, Python {sys.version.split()[0]}, "
          f"anthropic {anthropic.__version__}\n")
    with tempfile.TemporaryDirectory() as tmp:
        report_cpu(mod, args.turns, tmp)
        first_delta_latency(args.chapter, args.deltas, tmp)
        startup(args.chapter, args.starts, tmp)


if __name__ == "__main__":
    main()
