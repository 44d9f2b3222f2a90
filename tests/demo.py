#!/usr/bin/env python3
"""Offline demo: run one chapter end to end against the bundled scripted model.

No API key and no network: a local Messages API server (tests/fake_api.py) plays
the model, following the scenario in tests/scenarios/<chapter>.py, and the real
chapter file runs against it as a subprocess, exactly as `python sNN_x.py "task"`.

    python tests/demo.py s01                   # fresh temporary workspace, removed after
    python tests/demo.py s02 --keep            # keep the workspace (and requests.jsonl)
    python tests/demo.py s06 --show-requests   # then what the model received, request by request
    python tests/demo.py all                   # every chapter's demo in order, one summary line each

The scripted model does not think: its replies are fixed in the scenario. What
is real is everything the chapter does with them: requests, streaming, tools,
files. A demo fails (non-zero exit, one line per reason) when the chapter sent
an invalid request, exited non-zero, asked for more replies than the script
has or stopped before using them all, or when the scenario's CHECK of the
outcome (the file made, the answer given, the artefact on disk) does not hold.

A scenario module defines PROMPT and STEPS (fake_api steps: replies, or
callables that look at the request first), and optionally SETUP(workspace),
ENV (extra environment for the chapter), INPUT (the human's typed answers, piped
to the chapter's stdin), FAKED (what else is faked),
CHECK(workspace, stdout), which raises AssertionError when the outcome is
wrong, and SHOW(workspace), the text to print after the run (a record the
chapter kept on disk, say); its docstring says what the demo shows and what
to watch.
"""
import argparse
import codecs
import difflib
import importlib
import json
import os
import re
import shutil
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

TIMEOUT = 300          # seconds a chapter may run before the demo gives up on it
LOCAL_HOSTS = ["127.0.0.1", "localhost"]   # the scripted server: never reached through a proxy
WIDTH = 88


def chapters():
    """Chapter names (s01, s02, ...) with a file in the repository, in order."""
    return sorted(p.stem.split("_")[0] for p in ROOT.glob("s[0-9][0-9]_*.py"))


def chapter_file(name):
    hits = sorted(ROOT.glob(f"{name}_*.py"))
    if not hits:
        sys.exit(f"no chapter named {name!r}; try one of: {', '.join(chapters())}, all")
    return hits[0]


def load_scenario(name):
    if not (TESTS / "scenarios" / f"{name}.py").exists():
        return None
    return importlib.import_module(f"scenarios.{name}")


def no_proxy(env):
    """NO_PROXY (and no_proxy, which wins where both are set) with the local hosts added."""
    for var in ("NO_PROXY", "no_proxy"):
        hosts = LOCAL_HOSTS + [h.strip() for h in env.get(var, "").split(",")]
        env[var] = ",".join(h for h in dict.fromkeys(hosts) if h)
    return env


def child_env(url, home, scenario):
    env = {k: v for k, v in os.environ.items() if not k.startswith("ANTHROPIC")}
    env |= {"ANTHROPIC_API_KEY": "offline-demo", "ANTHROPIC_BASE_URL": url,
            "HOME": str(home), "PYTHONUNBUFFERED": "1"}
    env |= getattr(scenario, "ENV", {})
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


def intro(name, path, scenario):
    doc = (scenario.__doc__ or f"{name} demo").strip()
    title, _, shows = doc.partition("\n")
    steps = list(scenario.STEPS)
    lines = [f"=== {title.strip()}", "", "What it shows:",
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
    setup = getattr(scenario, "SETUP", None)
    if setup and setup.__doc__:
        lines.append(wrap(f"The workspace starts with what the scenario writes: "
                          f"{' '.join(setup.__doc__.split())}", "  * ", "    "))
    if getattr(scenario, "FAKED", None):
        lines.append(wrap(" ".join(scenario.FAKED.split()), "  * ", "    "))
    lines += ["", "What is real:",
              wrap(f"{path.name} itself, unchanged, run as a subprocess in a fresh scratch "
                   f"workspace with an empty HOME: its requests, streaming, tools, files and "
                   f"shell commands.")]
    check = getattr(scenario, "CHECK", None)
    if check and check.__doc__:
        lines += ["", "Checked at the end:", wrap(" ".join(check.__doc__.split()))]
    shown = getattr(scenario, "SHOW", None)
    if shown and shown.__doc__:
        lines += ["", "Shown at the end:", wrap(" ".join(shown.__doc__.split()))]
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------
# Running the chapter: stdout is shown as it streams and kept for CHECK.
# --------------------------------------------------------------------------

def run_chapter(path, prompt, workspace, env, answers=None):
    """(exit status or None on timeout, stdout text); stderr goes straight to ours.
    `answers`: what the human types at the chapter's questions, one per line."""
    proc = subprocess.Popen([sys.executable, str(path), prompt], cwd=workspace, env=env,
                            stdin=subprocess.DEVNULL if answers is None else subprocess.PIPE,
                            stdout=subprocess.PIPE)
    if answers is not None:
        proc.stdin.write(answers.encode())
        proc.stdin.close()
    chunks = []

    def relay():
        binary = getattr(sys.stdout, "buffer", None)
        decode = codecs.getincrementaldecoder("utf-8")("replace").decode
        while chunk := os.read(proc.stdout.fileno(), 4096):
            chunks.append(chunk)
            if binary is not None:
                binary.write(chunk)
                binary.flush()
            else:  # a text-only stdout: never split a character
                sys.stdout.write(decode(chunk))
                sys.stdout.flush()

    sys.stdout.flush()
    reader = threading.Thread(target=relay, daemon=True)
    reader.start()
    try:
        code = proc.wait(timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        code = None
    reader.join(timeout=5)
    proc.stdout.close()
    return code, b"".join(chunks).decode("utf-8", "replace")


def problems(code, server, steps, scenario, workspace, stdout):
    """Every reason the demo did not run as scripted, one line each."""
    found = []
    if code is None:
        found.append(f"the chapter did not finish within {TIMEOUT} s and was stopped")
    elif code:
        found.append(f"the chapter exited with status {code}")
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
        try:
            check(workspace, stdout)
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


def run_demo(name, keep=False, show=False):
    """Run one chapter's demo; (ok, summary line)."""
    path = chapter_file(name)
    scenario = load_scenario(name)
    if scenario is None:
        print(f"demo {name}: FAILED: no scenario (tests/scenarios/{name}.py is missing)")
        return False, "FAILED  no scenario"
    print(intro(name, path, scenario), flush=True)
    workspace = Path(tempfile.mkdtemp(prefix=f"agent-demo-{name}-"))
    home = Path(tempfile.mkdtemp(prefix=f"agent-demo-{name}-home-"))
    if hasattr(scenario, "SETUP"):
        scenario.SETUP(workspace)
    steps = list(scenario.STEPS)
    server = ScriptedAPI().start()
    server.script(steps)
    print(f"$ python {path.name} {scenario.PROMPT!r}\n"
          f"  (scripted model at {server.url}, workspace {workspace})\n", flush=True)
    started = time.monotonic()
    try:
        code, stdout = run_chapter(path, scenario.PROMPT, workspace, child_env(server.url, home, scenario),
                                   getattr(scenario, "INPUT", None))
    finally:
        server.close()
    seconds = time.monotonic() - started
    show_after(scenario, workspace)
    if show:
        sys.stderr.flush()
        print()
        show_requests(server.requests)
    found = problems(code, server, steps, scenario, workspace, stdout)
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
        save_log(server, workspace / "requests.jsonl")
        print(f"workspace kept: {workspace} (request log: requests.jsonl)")
    else:
        shutil.rmtree(workspace, ignore_errors=True)
    return not found, (f"ok      {summary}" if not found else f"FAILED  {found[0]}")


# --------------------------------------------------------------------------
# --show-requests: what the model received, request by request.
# --------------------------------------------------------------------------

# Content that a mechanism put there and a learner should spot at once.
MARKS = [
    ("<persisted-output>", "PERSISTED (full result on disk, the model gets a preview)"),
    ("[old tool result cleared", "CLEARED (placeholder for an old result)"),
    ("This session continues from an earlier conversation that was compacted",
     "COMPACTION SUMMARY (replaces the older messages)"),
    ("Re-read after compaction", "RE-READ after compaction"),
    ("<system-reminder>", "REMINDER (added by the loop, not the user)"),
    ("<skill name=", "SKILL body"),
    ("<fork_boilerplate>", "FORK brief"),
    ("<task-notification>\n<task-id>", "NOTIFICATION (a background command ended)"),
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


def print_message(i, message, sign, before=None):
    parts = blocks(message)
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
        return
    if len(parts) == 1:
        print(f"  {sign} [{i}] {message['role']}: {describe(parts[0])}")
        return
    print(f"  {sign} [{i}] {message['role']}: {len(parts)} blocks")
    for b in parts:
        print(f"        {describe(b)}")


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
    if n == 1 or compare is None:
        print(f"  system ({len(text):,} chars, in full):")
        print_full(text)
    elif text == system_text(compare["body"]):
        print("  system: (unchanged)")
    elif text in seen:
        print(f"  system: (same as request {seen[text]})")
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


def print_tools(n, tools, compare):
    names = [t.get("name") for t in tools]
    if n == 1 or compare is None:
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


def show_requests(log):
    """What the model received: per request only what is new or changed since
    the earlier request it continues (the one sharing the longest message prefix)."""
    print(f"=== What the model received: {len(log)} request(s) ===")
    print(wrap("Per request: the messages new (+) or changed in place (~) since the earlier "
               "request it continues; the system prompt in full once, then (unchanged) or a "
               "diff; the tool names; where the cache_control breakpoints sit. <<< marks "
               "content a mechanism put there. The reply under each request is the scripted "
               "one.", ""))
    done, seen, last_opts = [], {}, None
    for n, entry in enumerate(log, 1):
        body = entry["body"] if isinstance(entry["body"], dict) else {}
        msgs = [plain(m) for m in body.get("messages") or []]
        path = entry["path"].split("?")[0]
        count_only = path.endswith("/count_tokens")
        opts = ", ".join(["stream" if body.get("stream") else "no stream",
                          f"max_tokens {body.get('max_tokens')}", f"model {body.get('model')}"])
        head = f"--- request {n}: POST {path}"
        if not count_only and opts != last_opts:  # shown when they change
            head, last_opts = f"{head}  ({opts})", opts
        print(f"\n{head}")
        if not entry["valid"]:
            print(f"  {loud('REJECTED by the API: ' + str(entry['error']))}")
        if count_only:
            print("  (a token count: the model does not answer it)")
        # The earlier request this one continues: the longest shared message prefix.
        base, shared = None, 0
        for prev in done:
            k = common_prefix(prev["msgs"], msgs)
            if k and k >= shared:
                base, shared = prev, k
        compare = base or (done[-1] if done else None)
        if body.get("tool_choice"):
            choice = body["tool_choice"]
            note = "  (no tool may be called)" if choice.get("type") == "none" else ""
            print(f"  tool_choice: {json.dumps(choice)}{note}")
        print_system(n, system_text(body), compare, seen)
        print_tools(n, body.get("tools") or [], compare)
        where = breakpoints(body)
        print(f"  cache breakpoints ({len(where)}): {' | '.join(where) or 'none'}")
        if base is None:
            note = "" if n == 1 else "  (a fresh message list: it shares no message with an earlier request)"
            print(f"  messages: {len(msgs)}{note}")
            for i, m in enumerate(msgs):
                print_message(i, m, "+")
        else:
            i, changed = shared, []
            old = base["msgs"]
            while i < min(len(msgs), len(old)) and (msgs[i] == old[i] or same_shape(msgs[i], old[i])):
                if msgs[i] != old[i]:
                    changed.append(i)
                i += 1
            dropped = len(old) - i
            parts = [f"{shared} as in request {base['n']}"]
            if changed:
                parts.append(f"{len(changed)} changed")
            if len(msgs) - i:
                parts.append(f"{len(msgs) - i} new")
            if dropped:
                parts.append(f"request {base['n']}'s last {dropped} left out")
            print(f"  messages: {len(msgs)} ({', '.join(parts)})")
            for k in changed:
                print_message(k, msgs[k], "~", before=old[k])
            for k in range(i, len(msgs)):
                print_message(k, msgs[k], "+")
        print_reply(entry.get("step"))
        done.append({"n": n, "msgs": msgs, "body": body})
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
    print(f"=== demo all: {sum(ok for _, ok, _ in results)} of {len(results)} chapters ok ===")
    for name, ok, summary in results:
        print(f"{name}  {summary}")
    return 0 if all(ok for _, ok, _ in results) else 1


if __name__ == "__main__":
    sys.exit(main())
