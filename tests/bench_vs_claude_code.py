#!/usr/bin/env python3
"""Benchmark: agent_full beside the real Claude Code CLI, on the same scripted work.

Scenario L: 100 distinct 14 KB files in one session, read over 4 prompts of 25
reads each (one read a model call, then a text answer that ends the prompt). The
real CLI (the one the claude-agent-sdk wheel bundles) and agent_full each run it
offline against the scripted Messages API (tests/fake_api.py), the CLI as
tests/test_cli_corpus.py runs it (ANTHROPIC_BASE_URL, a fresh HOME, nonessential
traffic off), on a 200K-window model and on a 1M-window model, two ways:

  resumed       each prompt a new `-p` process continued with `-c` (the CLI's
                --continue, the newest session of the folder), as a user goes on
                the next day; agent_full's session file carries what shapes
                its next request (s09's resume: the cleared and sent marks, the
                agent's state, the file-read records), so a resumed prompt
                sends what the live session would (tests/test_s09_resume.py)
  one process   the 4 prompts as 4 user messages into one process
                (--input-format stream-json, each sent once the previous result
                came back): the live session, which resumed must equal

The scripted model answers by what the request is, not by position: a request
whose last user message asks for a "detailed summary of" the conversation (both
agents' compaction prompts say so) gets a summary; any other request with the
agent's read tool gets the next step of the prompt's script; anything else a
short text. The same script drives both agents; only the tool's name and input
differ (Read {file_path}, read_file {path}).

The cost model is the scripted API's, fake_api.PromptCache and fake_api.priced,
the API's documented prompt-caching rules:
  - the prefix is tools, system, messages, block by block; cache_control marks a
    breakpoint (at most 4); the marks are not part of the prefix
  - a write happens only at a breakpoint: one entry, the prefix ending at that
    block; a prefix under the model's minimum cacheable length (1,024 tokens for
    Sonnet 4.5, 4,096 for Opus 4.5 and later) is not cached at all
  - a read looks back from each breakpoint one block at a time, at most 20
    positions (the breakpoint itself the first), for a prefix an earlier request
    wrote; the longest found is read, from there to the last breakpoint is
    written, the rest is plain input
  - entries belong to one model; the 5-minute TTL does not matter offline (each
    run is minutes long, with no pause)
  - price: input $3/M tokens, cache writes 1.25x, reads 0.1x (no long-context
    premium: the one price at every length, which favours the larger requests)
Tokens are the server's one estimate, 4 bytes of request body a token, for both.

Per prompt it prints: input tokens (all sent: plain + read + written), cache
reads and writes, the largest request, the input cost with and without the
compaction (summary) calls, and agent_full / CLI. Then it CHECKS that agent_full
is not cheaper by seeing less, and prints each check for both agents:
  1. every file read reaches the model whole at least once;
  2. the first request of each resumed prompt carries the previous prompt's
     exchange (its final answer) or a summary of it;
  3. every cleared read result says how to get it back (a placeholder without a
     way back fails: "[Old tool result content cleared]" alone does).
Figures only: it exits 0 whatever they are (a run that could not happen, 1).

Run:  python tests/bench_vs_claude_code.py [--files 100] [--prompts 4]
          [--windows 200K,1M] [--modes resumed,one-process] [--sides cli,full]
          [--json out.json]
"""
import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

TESTS = Path(__file__).resolve().parent
ROOT = TESTS.parent
sys.path[:0] = [str(TESTS)]

from fake_api import ScriptedAPI, priced, reply, tool  # noqa: E402
from test_cli_corpus import cli_binary, cli_env  # noqa: E402
from bench_s06_context import make_files  # noqa: E402  the same 14 KB files (FILE_BYTES)

FILE_BYTES = 14 * 1024
PRICE_INPUT = 3.00           # USD per million input tokens
# The CLI runs claude-sonnet-4-5 with a 200K window and claude-opus-5-5 (its default) with
# 1M; it gives claude-sonnet-4-6 200K too unless named "claude-sonnet-4-6[1m]" (1M=... picks
# another). One price for both (the ratio is what counts).
WINDOWS = {"200K": "claude-sonnet-4-5", "1M": "claude-opus-5-5"}
MODES = ("resumed", "one-process")
SIDES = ("cli", "full")
SUMMARY_ASK = "detailed summary of"   # in both agents' compaction prompts
SUMMARY = ("<analysis>Reading files one a turn.</analysis>\n<summary>\n1. Primary request: read the "
           "files named in each prompt, one a turn, and say when done.\n{done}\n9. Next step: the "
           "next file of the current prompt.\n</summary>")
WAY_BACK = re.compile(r"again|full output is in|saved to|re-?read", re.I)
TIMEOUT = 900                 # seconds for one process (a prompt, or all in one process)


# --- the scripted model --------------------------------------------------------------------

def last_user_text(body):
    for m in reversed(body.get("messages") or []):
        if m.get("role") == "user":
            content = m["content"]
            return content if isinstance(content, str) else " ".join(
                b.get("text", "") for b in content if isinstance(b, dict) and b.get("type") == "text")
    return ""


class Model:
    """The scripted model of one run: a summary for a compaction call, the prompt's
    next step for a loop call, a short text for anything else. It tags each request
    it answers with (prompt, kind), in the order answered."""

    def __init__(self, side, work):
        self.side, self.work, self.steps, self.prompt, self.tags = side, work, [], 0, []
        self.lock = threading.Lock()

    def start_prompt(self, p, first, last):
        with self.lock:
            self.prompt = p
            self.steps = [self.read(i) for i in range(first, last)] + [reply(done_text(p))]

    def read(self, i):
        if self.side == "cli":
            return reply(tool("Read", {"file_path": str(self.work / f"f{i:03d}.txt")}))
        return reply(tool("read_file", {"path": f"f{i:03d}.txt"}))

    def __call__(self, body):
        tools = {t.get("name") for t in body.get("tools") or []}
        with self.lock:
            if SUMMARY_ASK in last_user_text(body):
                self.tags.append((self.prompt, "summary"))
                done = " ".join(f"Prompt {p + 1} is done: {done_text(p)}" for p in range(self.prompt))
                return reply(SUMMARY.format(done=f"2. Work so far: {done or 'nothing finished yet.'}"))
            if tools & {"Read", "read_file"} and self.steps:
                self.tags.append((self.prompt, "loop"))
                return self.steps.pop(0)
            self.tags.append((self.prompt, "side"))
            return reply("OK.")


def done_text(p):
    return f"Read every file of prompt {p + 1}; answer {p + 1:02d}-DONE."


def prompt_text(first, last):
    return (f"Read f{first:03d}.txt to f{last - 1:03d}.txt in this folder, one file a turn, "
            f"then say you are done.")


# --- running one agent ----------------------------------------------------------------------

def command(side, model, binary, fmt="json"):
    if side == "cli":
        return [str(binary), "-p", "--output-format", fmt, "--permission-mode", "bypassPermissions",
                "--model", model] + ["--verbose"] * (fmt == "stream-json")
    return [sys.executable, str(ROOT / "agent_full.py"), "-p", "--output-format", fmt,
            "--permission-mode", "bypassPermissions", "--model", model] + ["--verbose"] * (fmt == "stream-json")


def environment(side, api, home):
    if side == "cli":
        return cli_env(api, home)
    env = {k: v for k, v in os.environ.items() if k in ("PATH", "LANG", "NO_PROXY", "no_proxy")}
    return env | {"HOME": str(home), "ANTHROPIC_API_KEY": "bench", "ANTHROPIC_BASE_URL": api.url,
                  "AGENT_AUTO_MEMORY": "0", "AGENT_MAX_TURNS": "200"}


def spans(files, prompts):
    per = files // prompts
    return [(p * per, files if p == prompts - 1 else (p + 1) * per) for p in range(prompts)]


def run_resumed(side, model, binary, api, brain, work, home, files, prompts):
    """Each prompt its own process, the later ones with -c. Returns the log index of each prompt's start."""
    starts = []
    for p, (first, last) in enumerate(spans(files, prompts)):
        api.settle()
        starts.append(len(api.requests))
        brain.start_prompt(p, first, last)
        cmd = command(side, model, binary) + ["-c"] * (p > 0) + [prompt_text(first, last)]
        proc = subprocess.run(cmd, cwd=work, env=environment(side, api, home), stdin=subprocess.DEVNULL,
                              capture_output=True, text=True, timeout=TIMEOUT)
        if proc.returncode != 0 or done_text(p) not in proc.stdout:
            raise RuntimeError(f"{side} prompt {p + 1} failed ({proc.returncode}): "
                               f"{proc.stderr[-1500:]} {proc.stdout[-1500:]}")
    api.settle()
    return starts


def run_one_process(side, model, binary, api, brain, work, home, files, prompts):
    """The prompts as user messages into one process, each after the previous result."""
    cmd = command(side, model, binary, "stream-json") + ["--input-format", "stream-json"]
    proc = subprocess.Popen(cmd, cwd=work, env=environment(side, api, home), stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, bufsize=1)
    err = []
    threading.Thread(target=lambda: err.append(proc.stderr.read()), daemon=True).start()
    timer = threading.Timer(TIMEOUT, proc.kill)
    timer.start()
    starts = []
    try:
        for p, (first, last) in enumerate(spans(files, prompts)):
            api.settle()
            starts.append(len(api.requests))
            brain.start_prompt(p, first, last)
            proc.stdin.write(json.dumps({"type": "user", "session_id": "", "parent_tool_use_id": None,
                                         "message": {"role": "user", "content": prompt_text(first, last)}})
                             + "\n")
            proc.stdin.flush()
            for line in proc.stdout:
                if line.startswith("{") and json.loads(line).get("type") == "result":
                    if done_text(p) not in line:
                        raise RuntimeError(f"{side} prompt {p + 1}: {line[:1500]}")
                    break
            else:
                raise RuntimeError(f"{side} ended before prompt {p + 1} was done: {''.join(err)[-1500:]}")
        proc.stdin.close()
        proc.wait(timeout=60)
    finally:
        timer.cancel()
        if proc.poll() is None:
            proc.kill()
    api.settle()
    return starts


def run(side, model, mode, binary, files, prompts):
    """One agent, one window, one mode: the logged requests, tagged, split by prompt."""
    with tempfile.TemporaryDirectory(prefix=f"bench-{side}-") as tmp, ScriptedAPI() as api:
        work, home = Path(tmp) / "work", Path(tmp) / "home"
        work.mkdir()
        home.mkdir()
        make_files(work, files, FILE_BYTES)
        brain = Model(side, work.resolve())
        api.script([brain] * 100_000)   # every request asks the one model
        began = time.monotonic()
        runner = run_resumed if mode == "resumed" else run_one_process
        starts = runner(side, model, binary, api, brain, work, home, files, prompts)
        seconds = time.monotonic() - began
        entries = [e for e in api.requests if e["path"].split("?")[0] == "/v1/messages" and e["valid"]]
        # "prompt is too long" is the API's answer to a request over the window: both
        # agents recover from it (a compaction), and it is not billed
        refused = [e["error"] for e in api.invalid()]
        if any("prompt is too long" not in why for why in refused):
            raise RuntimeError(f"{side}: the scripted API refused a request: {refused[0]}")
        if len(entries) != len(brain.tags):
            raise RuntimeError(f"{side}: {len(entries)} requests but {len(brain.tags)} answered")
        return {"side": side, "model": model, "mode": mode, "seconds": seconds, "files": files,
                "prompts": prompts, "refused": len(refused), "requests": [
                    {"prompt": p, "kind": kind, "usage": e["usage"], "body": e["body"]}
                    for e, (p, kind) in zip(entries, brain.tags)]}


# --- figures and checks ---------------------------------------------------------------------

def figures(requests):
    """Sums over requests: tokens sent, read, written, peak, cost (loop + side, and summaries)."""
    out = {"tokens": 0, "reads": 0, "writes": 0, "peak": 0, "cost": 0.0, "summary_cost": 0.0,
           "requests": 0, "summaries": 0}
    for r in requests:
        u = r["usage"]
        total = u["input_tokens"] + u["cache_read_input_tokens"] + u["cache_creation_input_tokens"]
        cost = priced(u) * PRICE_INPUT / 1e6
        if r["kind"] == "summary":
            out["summaries"] += 1
            out["summary_cost"] += cost
            continue
        out["requests"] += 1
        out["tokens"] += total
        out["reads"] += u["cache_read_input_tokens"]
        out["writes"] += u["cache_creation_input_tokens"]
        out["peak"] = max(out["peak"], total)
        out["cost"] += cost
    return out


def result_texts(body):
    """(tool_use_id, text) of every tool_result in a request."""
    for m in body.get("messages") or []:
        if m.get("role") != "user" or isinstance(m["content"], str):
            continue
        for b in m["content"]:
            if isinstance(b, dict) and b.get("type") == "tool_result":
                c = b.get("content")
                text = c if isinstance(c, str) else " ".join(
                    x.get("text", "") for x in c or [] if isinstance(x, dict))
                yield b.get("tool_use_id"), text


def read_calls(body):
    """tool_use id -> file number, for the read calls in a request."""
    calls = {}
    for m in body.get("messages") or []:
        if m.get("role") == "assistant" and not isinstance(m["content"], str):
            for b in m["content"]:
                if b.get("type") == "tool_use" and b.get("name") in ("Read", "read_file"):
                    path = b["input"].get("file_path") or b["input"].get("path") or ""
                    if found := re.search(r"f(\d{3})\.txt$", path):
                        calls[b["id"]] = int(found[1])
    return calls


def checks(result):
    """The three "not by seeing less" conditions: (passed, detail) each."""
    requests = [r for r in result["requests"] if r["kind"] != "side"]
    whole, cleared, lost = set(), 0, []
    for r in requests:
        calls = read_calls(r["body"])
        for use_id, text in result_texts(r["body"]):
            if use_id not in calls:
                continue
            i = calls[use_id]
            if f"BEGIN-{i:03d}" in text and f"END-{i:03d}" in text and len(text) >= FILE_BYTES:
                whole.add(i)
            elif f"BEGIN-{i:03d}" not in text:
                cleared += 1
                if not WAY_BACK.search(text):
                    lost.append(text[:80])
    missing = sorted(set(range(result["files"])) - whole)
    seen = (not missing, f"{len(whole)}/{result['files']} files whole at least once"
            + (f" (never: f{missing[0]:03d}...)" if missing else ""))
    carried, notes = True, []
    for p in range(1, result["prompts"]):
        first = next((r for r in result["requests"] if r["prompt"] == p and r["kind"] == "loop"), None)
        text = json.dumps(first["body"]) if first else ""
        ok = done_text(p - 1) in text or "<summary>" in text or "Work so far" in text
        carried &= ok
        notes.append(f"{p + 1}:{'yes' if ok else 'NO'}")
    way_back = (not lost, f"{cleared:,} placeholders sent, {len(lost)} without a way back"
                + (f" ({lost[0]!r})" if lost else ""))
    return {"seen": seen, "carried": (carried, "previous prompt in prompt " + " ".join(notes)),
            "way_back": way_back}


# --- printing --------------------------------------------------------------------------------

def k(n):
    return f"{n / 1000:,.0f}K"


def table(runs, window, mode):
    cli, full = runs.get(("cli", window, mode)), runs.get(("full", window, mode))
    print(f"\n{window} window ({WINDOWS[window]}), {mode}"
          + ("  (agent_full: -c, CLI: -c)" if mode == "resumed" else "  (all prompts in one process)"))
    head = (f"{'prompt':>6} {'side':>10} {'requests':>8} {'input tok':>10} {'cache read':>10} "
            f"{'cache write':>11} {'peak req':>9} {'cost':>8} {'+summaries':>11} {'full/CLI':>9}")
    print(head + "\n" + "-" * len(head))
    totals = {}
    if not (cli or full):
        return
    for p in range(max(r["prompts"] for r in (cli, full) if r)):
        costs = {}
        for name, res in (("CLI", cli), ("agent_full", full)):
            if not res:
                continue
            f = figures([r for r in res["requests"] if r["prompt"] == p])
            costs[name] = f
            ratio = ""
            if name == "agent_full" and "CLI" in costs:
                ratio = f"{f['cost'] / costs['CLI']['cost']:.2f}"
            print(f"{p + 1:>6} {name:>10} {f['requests']:>8} {k(f['tokens']):>10} {k(f['reads']):>10} "
                  f"{k(f['writes']):>11} {k(f['peak']):>9} {'$' + format(f['cost'], '.3f'):>8} "
                  f"{'$' + format(f['cost'] + f['summary_cost'], '.3f'):>11} {ratio:>9}")
    for name, res in (("CLI", cli), ("agent_full", full)):
        if res:
            totals[name] = figures(res["requests"])
            f = totals[name]
            print(f"{'all':>6} {name:>10} {f['requests']:>8} {k(f['tokens']):>10} {k(f['reads']):>10} "
                  f"{k(f['writes']):>11} {k(f['peak']):>9} {'$' + format(f['cost'], '.3f'):>8} "
                  f"{'$' + format(f['cost'] + f['summary_cost'], '.3f'):>11}"
                  f"  ({f['summaries']} summary calls, {res['refused']} refused as too long, "
                  f"{res['seconds']:.0f} s)")
    if len(totals) == 2:
        c, a = totals["CLI"], totals["agent_full"]
        print(f"agent_full / CLI input cost: {a['cost'] / c['cost']:.2f} "
              f"({(a['cost'] + a['summary_cost']) / (c['cost'] + c['summary_cost']):.2f} with the "
              f"summary calls)   (goal <= 0.50)")
    for name, res in (("CLI", cli), ("agent_full", full)):
        if res:
            marks = checks(res)
            print(f"  {name:>10} not by seeing less: " + "; ".join(
                f"[{'ok' if ok else 'FAIL'}] {detail}" for ok, detail in marks.values()))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--files", type=int, default=100)
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--windows", default="200K,1M")
    ap.add_argument("--modes", default=",".join(MODES))
    ap.add_argument("--sides", default=",".join(SIDES))
    ap.add_argument("--json", metavar="FILE", help="also save every run's figures (no bodies)")
    args = ap.parse_args()
    modes, sides = args.modes.split(","), args.sides.split(",")
    windows = []
    for word in args.windows.split(","):   # 1M, or 1M=another-model-id
        name, _, model = word.partition("=")
        WINDOWS[name] = model or WINDOWS[name]
        windows.append(name)
    binary, why = cli_binary() if "cli" in sides else (None, None)
    if "cli" in sides and binary is None:
        print(f"the real CLI cannot run here: {why}; agent_full alone")
        sides = [s for s in sides if s != "cli"]
    version = subprocess.run([str(binary), "--version"], capture_output=True, text=True).stdout.strip() \
        if binary else "none"
    print(f"Scenario L: {args.files} distinct {FILE_BYTES // 1024} KB files, {args.prompts} prompts of "
          f"{args.files // args.prompts} reads; Claude Code {version}; tokens = request bytes / 4; "
          f"${PRICE_INPUT:g}/M input, cache reads 0.1x, writes 1.25x, 20-block lookback")
    runs, saved = {}, []
    for window in windows:
        for mode in modes:
            for side in sides:
                try:
                    runs[(side, window, mode)] = run(side, WINDOWS[window], mode, binary, args.files,
                                                     args.prompts)
                except (RuntimeError, subprocess.TimeoutExpired) as e:
                    print(f"{side} {window} {mode}: could not run: {str(e)[:2000]}")
                    continue
                res = runs[(side, window, mode)]
                saved.append({"side": side, "window": window, "mode": mode, "seconds": res["seconds"],
                              "per_prompt": [figures([r for r in res["requests"] if r["prompt"] == p])
                                             for p in range(args.prompts)],
                              "checks": checks(res)})
            table(runs, window, mode)
    if args.json:
        Path(args.json).write_text(json.dumps(saved, indent=1))
    return 0 if runs else 1


if __name__ == "__main__":
    sys.exit(main())
