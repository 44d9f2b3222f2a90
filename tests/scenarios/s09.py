"""s09 demo: instructions and memory reach the model as data; a new memory is saved; a second process resumes the session.

The workspace has AGENTS.md (it includes docs/style.md with @docs/style.md) and
one project memory with its MEMORY.md index. The memory side calls are on
(AGENT_AUTO_MEMORY=1). Watch stderr and --show-requests, where each request is
headed by what sent it: the main loop, the recall side call or the extraction
side call.
  1. Recall: before the first model call, a small side call (no tools, its own
     system prompt) gets the list of memories and picks greeting-text.
  2. The first request: the system prompt holds only what stays the same all
     session (identity, rules, tool guidance, environment, skills); AGENTS.md,
     with style.md pasted where the @include was, and the MEMORY.md index open
     the first message as a <system-reminder> block. HTML comments are gone;
     `@cache` in backticks stays text. The recalled memory's body follows the
     prompt as another reminder.
  3. The model writes hello.py the way the instructions and the memory say,
     and answers. The session file (.agent/sessions/) gets each message as it goes.
  4. Extraction: the turn ended without tool use, so a background side call
     reads the turn and saves a new project memory ("[memory: saved ...]");
     MEMORY.md is rebuilt from the files, and the session waits for it at exit.
  5. A second process, `python s09_memory.py --continue "..."`, loads the
     newest session ("[resumed ...: 4 messages]"). Its first request carries
     the restored history, the first run's four messages, before the new
     prompt; recall now also lists the memory the first run saved, and picks
     it. The model answers from the restored conversation.
"""
import json
import re

from fake_api import reply, text, tool

PROMPT = ("Add hello.py that prints the project's greeting. For later: the nightly job "
          "parses its output, so it must stay one line.")
ENV = {"AGENT_AUTO_MEMORY": "1",                 # the suite and the shell may turn it off
       "AGENT_PERMISSION_MODE": "acceptEdits"}   # writing hello.py needs no question
FAKED = ("The memory side calls: recall and extraction are two more scripted replies per run, in "
         "that order (recall before the first model call, extraction after the last).")
ASK = "What must hello.py's output stay, and why? Answer from our conversation."

AGENTS_MD = """\
# Project instructions

- Indent Python with tabs, not spaces.
- Style: @docs/style.md
- A decorator such as `@cache` in backticks is text, not an include.
<!-- For the humans only: HTML comments never reach the model. -->
"""
STYLE = "Every Python file starts with a one-line docstring.\n"
MEMORY = """\
---
name: greeting-text
description: The greeting the project's scripts print
type: project
---

The greeting is "Hello from the workshop!", word for word: the README shows it.
"""
NEW_MEMORY = "hello-output-one-line"


def SETUP(workspace):
    """AGENTS.md (with @docs/style.md and an HTML comment), docs/style.md, and one project
    memory (.agent/memory/greeting-text.md) with its MEMORY.md index."""
    (workspace / "docs").mkdir()
    (workspace / "AGENTS.md").write_text(AGENTS_MD)
    (workspace / "docs" / "style.md").write_text(STYLE)
    memory = workspace / ".agent" / "memory"
    memory.mkdir(parents=True)
    (memory / "greeting-text.md").write_text(MEMORY)
    (memory / "MEMORY.md").write_text("- [greeting-text](greeting-text.md) (project): "
                                      "The greeting the project's scripts print\n")


def texts(message):
    content = message["content"]
    return [content] if isinstance(content, str) else [b.get("text", "") for b in content]


def system_text(body):
    system = body.get("system") or ""
    return system if isinstance(system, str) else "".join(b.get("text", "") for b in system)


def expect(body, checks):
    """The first check that fails, as a (demo: ...) reply, or None."""
    for ok, what in checks:
        if not ok:
            return reply(f"(demo: {what})")
    return None


def recall(body):
    listing = texts(body["messages"][0])[0]
    return expect(body, [
        (not body.get("tools") and system_text(body).startswith("Pick the memories"),
         "the first request is not the recall side call"),
        ("greeting-text (project)" in listing, "the recall call does not list greeting-text"),
    ]) or reply('{"names": ["greeting-text"]}')


def first_request(body):
    first = texts(body["messages"][0])
    context = first[0]
    return expect(body, [
        (context.startswith("<system-reminder>\n# Project context"),
         "the first message does not open with the project context reminder"),
        ("Indent Python with tabs" in context, "AGENTS.md is not in the first message"),
        (STYLE.strip() in context and "@docs/style.md" not in context, "@docs/style.md was not included"),
        ("`@cache`" in context and "For the humans only" not in context,
         "a code span was expanded or an HTML comment kept"),
        ("[greeting-text](greeting-text.md)" in context, "the MEMORY.md index is not in the first message"),
        (any("Hello from the workshop!" in t and "Memories that may help" in t for t in first[1:]),
         "the recalled memory is not attached to the prompt"),
        ("Indent Python with tabs" not in system_text(body), "the instructions went into the system prompt"),
    ]) or reply(text("AGENTS.md asks for tabs and a docstring; the greeting is in memory."),
                tool("write_file", {"path": "hello.py", "content": HELLO}))


def extraction(body):
    turn = texts(body["messages"][0])[0]
    return expect(body, [
        (system_text(body).startswith("You maintain the long-term memory"),
         "the last request is not the extraction side call"),
        ("nightly job" in turn and "greeting-text" in turn, "the extractor did not get the turn and the index"),
    ]) or reply(json.dumps({"operations": [{
        "op": "create", "name": NEW_MEMORY, "type": "project",
        "description": "hello.py's output is parsed by the nightly job: one line only",
        "body": "hello.py must print exactly one line: the nightly job parses its output."}]}))


def resumed_recall(body):
    listing = texts(body["messages"][0])[0]
    return expect(body, [
        (system_text(body).startswith("Pick the memories"), "the second run's first request is not recall"),
        (f"{NEW_MEMORY} (project)" in listing, "recall does not list the memory the first run saved"),
    ]) or reply(json.dumps({"names": [NEW_MEMORY]}))


def resumed(body):
    """The second process's first request: the first run's four messages, then the new prompt."""
    said = [json.dumps(m) for m in body["messages"]]
    return expect(body, [
        (len(said) >= 5 and "nightly job parses its output" in said[0], "the first run's prompt is not restored"),
        ("write_file" in said[1] and "Wrote 94 bytes to hello.py" in said[2], "the first run's tool call is not restored"),
        ("I added **hello.py**" in said[3], "the first run's answer is not restored"),
        (ASK in said[-1], "the new prompt is not last"),
    ]) or reply("hello.py must print exactly one line, \"Hello from the workshop!\": the nightly job "
                "parses its output (you said so when we wrote it, and it is in memory now).", delay=0.02)


def nothing_new(body):
    return expect(body, [(system_text(body).startswith("You maintain the long-term memory"),
                          "the second run's last request is not the extraction side call")]) \
        or reply(json.dumps({"operations": []}))


HELLO = '"""Print the project\'s greeting."""\n\n\ndef main():\n\tprint("Hello from the workshop!")\n\n\nmain()\n'

FIRST = [
    recall,
    first_request,
    reply("I added **hello.py**: a one-line docstring, tab indentation, and it prints "
          "\"Hello from the workshop!\" on one line.", delay=0.02),
    extraction,
]
RUNS = [
    {"title": "the first session", "prompt": PROMPT, "steps": FIRST},
    {"title": "a second process resumes it (--continue)", "args": ["--continue"], "prompt": ASK,
     "steps": [resumed_recall, resumed, nothing_new]},
]
STEPS = [step for run in RUNS for step in run["steps"]]


def SENDER(body):
    """The main loop or a memory side call, by the side calls' own system prompts."""
    system = system_text(body)
    return ("recall side call" if system.startswith("Pick the memories") else
            "extraction side call" if system.startswith("You maintain the long-term memory") else "main loop")


def session_messages(path):
    """The history a session file holds (message records by index; boundaries, truncates)."""
    messages = []
    for line in path.read_text().splitlines():
        record = json.loads(line)
        if record["type"] == "boundary":
            messages = []
        elif record["type"] == "truncate":
            del messages[record["n"]:]
        elif record["type"] == "message":
            messages[record["i"]:] = [record["message"]]
    return messages


def CHECK(workspace, stdout, runs):
    """hello.py written; the new memory saved as a file with frontmatter and indexed in
    MEMORY.md next to the old one; one session file, every line a JSON record, holding
    the first run's prompt, write_file call, result and answer, then the second run's
    prompt and answer (the second process resumed it and says so: "[resumed ...: 4
    messages]")."""
    assert "\tprint(" in (workspace / "hello.py").read_text(), "hello.py was not written"
    memory = workspace / ".agent" / "memory"
    saved = (memory / f"{NEW_MEMORY}.md").read_text()
    assert saved.startswith(f"---\nname: {NEW_MEMORY}\n") and "type: project" in saved, "bad memory file"
    index = (memory / "MEMORY.md").read_text()
    assert f"[{NEW_MEMORY}]({NEW_MEMORY}.md)" in index and "[greeting-text]" in index, \
        "MEMORY.md does not list both memories"
    (session,) = (workspace / ".agent" / "sessions").glob("*.jsonl")
    assert json.loads(session.read_text().splitlines()[0])["type"] == "mode", "no mode record first"
    messages = session_messages(session)
    assert [m["role"] for m in messages] == ["user", "assistant"] * 3, \
        "the session file does not hold both runs' turns"
    assert "tool_result" in json.dumps(messages[2]) and "hello.py" in json.dumps(messages[3])
    assert ASK in json.dumps(messages[4]) and "nightly job parses" in json.dumps(messages[5])
    assert re.search(rf"\[resumed {session.stem}: 4 messages", runs[1]["stderr"]), \
        "the second run does not say it resumed the session"
    assert "Hello from the workshop!" in runs[0]["stdout"], "the first answer was not shown"
    assert "nightly job parses its output" in runs[1]["stdout"], "the second answer was not shown"
