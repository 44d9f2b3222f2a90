#!/usr/bin/env python3
"""s01_agent_loop.py - the smallest honest agent: a model, one bash tool, a loop.

New since nothing: agent_loop, call_model, run_bash, check_dangerous, run_tool,
TOOLS, TOOL_HANDLERS, ToolError, make_client, main, printable (every byte a
file, a tool or the model controls is made harmless before the terminal).

The whole idea (ReAct: think, act, observe) fits in one while-loop:

    user prompt
        |
        v
    +-> call_model(messages, TOOLS) --- streams text to the terminal
    |       |
    |   any tool_use? -- no --> stop ("end_turn")
    |       | yes
    |   run each tool (blocklist first) -> tool_result blocks
    |       |
    +-- append results as the next user message
        (also stops on: 50 turns, 3 unknown tools in a row, Ctrl+C)

Run:
    pip install -r requirements.txt
    export ANTHROPIC_API_KEY=...          # or put it in .env
    python s01_agent_loop.py              # REPL, prompt "s01 >> "
    python s01_agent_loop.py "task"       # one task, then exit
    python tests/demo.py s01 --show-requests   # offline, no key: scripted model
  The agent reads and writes the current directory: start it in a scratch
  folder, not in this repository: cd "$(mktemp -d)" && python <repo>/s01_agent_loop.py

Try:
    make hello.txt containing hi, show me its size, then make root its owner
                        (the demo runs this one: the blocklist refuses sudo)
    what python version is installed here, and where?            (real model)
    python -c "import s01_agent_loop as s; print(s.check_dangerous('rm -rf /'))"
                        (offline: why the blocklist refuses it; nothing runs)

Key insight: the model never runs anything. It asks; the loop runs the tool
and feeds the observation back, until the model stops asking.
"""

# --- imports ---
import contextlib
import contextvars
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

try:  # requirements.txt's packages: missing, one line says how (a venv first: PEP 668), no traceback
    import anthropic
    from dotenv import dotenv_values, find_dotenv, load_dotenv
except ModuleNotFoundError as e:
    if __name__ != "__main__":
        raise  # an importer (a test, the demo) says it its own way
    venv = "" if sys.prefix != sys.base_prefix else "python3 -m venv .venv && . .venv/bin/activate && "
    if sys.version_info < (3, 10):  # no version of the packages installs there (macOS's own python3 is 3.9)
        venv = (f"a Python of 3.10 or later (this is {sys.version.split()[0]}), e.g. "
                "python3.12 -m venv .venv && . .venv/bin/activate && ")
    print(f"No module named {e.name!r}: install the packages with {venv}pip install -r "
          f"{os.path.relpath(Path(__file__).with_name('requirements.txt'))}", file=sys.stderr)
    sys.exit(2)

# --- config ---
DEFAULT_MODEL = "claude-sonnet-5-5"  # override with MODEL_ID
MAX_TOKENS = 8_000          # output tokens per model call
MAX_TURNS = 50              # model calls per user turn (AGENT_MAX_TURNS overrides): a safety net
MAX_UNKNOWN_TOOLS = 3       # unknown-tool calls in a row: the model is lost
BASH_TIMEOUT = 120          # seconds, default for one bash command
BASH_MAX_TIMEOUT = 600      # seconds: the most a model may ask for one command
BASH_OUTPUT_CAP = 8_000_000  # bytes a command may print before it is stopped: `yes` fills 1 GB in 3 s
BASH_POLL = 0.05            # seconds between checks of a running command's output size
MAX_OUTPUT = 30_000         # characters of tool output kept for the model
API_RETRIES = 2             # SDK-level retries (with its own backoff)
CHAPTER = Path(__file__).stem.split("_")[0]  # "s01": names the REPL prompt and demo
NO_KEY_HELP = ("No API key. Set ANTHROPIC_API_KEY (or ANTHROPIC_AUTH_TOKEN) in the "
               "shell or in .env, or run the offline demo: python {demo} {chapter}")

# One agent's own state. Whoever starts an agent loop makes one (main() for the
# session; a later chapter gives each subagent its own), and every tool reads
# the running agent's through agent_state(). A ContextVar, not a module global:
# two agents never see each other's, and a worker thread started with a copy
# of the context sees the agent that started it. Shared infrastructure (the
# client, the tool registry, config) stays module-level.
class AgentState:
    def __init__(self, workdir):
        self.workdir = Path(workdir).resolve()  # the workspace every tool works in


CURRENT = contextvars.ContextVar("agent_state")  # the AgentState running in this context


def agent_state():
    return CURRENT.get()


@contextlib.contextmanager
def acting_as(state):
    """Run the block as `state`; the previous agent comes back after."""
    token = CURRENT.set(state)
    try:
        yield state
    finally:
        CURRENT.reset(token)


def turn_limit():
    """AGENT_MAX_TURNS, else MAX_TURNS; ValueError names a bad value."""
    raw = os.getenv("AGENT_MAX_TURNS", "").strip()
    if not raw:
        return MAX_TURNS
    if not raw.isdigit() or int(raw) < 1:
        raise ValueError(f"AGENT_MAX_TURNS must be a whole number of model calls, 1 or more; "
                         f"got {raw!r}")
    return int(raw)


SYSTEM = ("You are a coding agent working in a project directory. Act, don't just "
          "describe: use the tools to inspect and change files, then verify. "
          "Keep answers short.")

# --- model client ---
def make_client():
    """Build the SDK client from the environment; None when no key is set.

    .env never overrides the shell. ANTHROPIC_BASE_URL lets any
    Anthropic-compatible endpoint (or the offline scripted model) stand in.
    """
    load_dotenv(override=False)
    key, token = os.getenv("ANTHROPIC_API_KEY"), os.getenv("ANTHROPIC_AUTH_TOKEN")
    if not (key or token):
        return None
    return anthropic.Anthropic(api_key=key, auth_token=None if key else token,
                               base_url=os.getenv("ANTHROPIC_BASE_URL") or None,
                               max_retries=API_RETRIES)


def model_id():
    return os.getenv("MODEL_ID") or DEFAULT_MODEL


def system_prompt():
    """Stable for the whole session: no clock, no counters (a later chapter caches it)."""
    return f"{SYSTEM}\nWorking directory: {agent_state().workdir}"

# --- tools ---
class ToolError(Exception):
    """Raised by a handler: becomes an is_error tool_result, never a crash."""


# The seed's blocklist plus obvious variants. It is a seatbelt, not a sandbox:
# a determined model can write the same thing another way (a later chapter
# adds an OS sandbox). Each entry: (regex, why it is refused).
DANGEROUS = [
    (r"\brm\s+(-\S+\s+)*[\"']?(/|~|\$HOME|\$\{HOME\})/?\*?[\"']?(\s|[;&|]|$)",
     "deleting / or the home directory"),
    (r"\brm\s+(-[a-zA-Z]*\s+)*--no-preserve-root", "rm --no-preserve-root"),
    (r"(^|[;&|(`\n]\s*)sudo\b", "sudo: the agent never escalates privileges"),
    (r"\bmkfs(\.\w+)?\b", "formatting a disk"),
    (r"\bdd\s+.*\bof=/dev/(?!null\b|zero\b|std)", "dd writing straight to a device"),
    (r"\bchmod\s+(-[a-zA-Z]*R[a-zA-Z]*\s+)+0?777\s+/(\s|$)", "chmod -R 777 on /"),
    (r":\s*\(\s*\)\s*\{.*:\s*\|\s*:.*\}", "fork bomb"),
    (r"\b(curl|wget)\b[^|]*\|\s*(sudo\s+)?(ba|z|da)?sh\b", "piping a download into a shell"),
    (r">\s*/dev/(sd|nvme|hd|vd|disk)", "overwriting a disk device"),
    (r"(^|[;&|(`\n]\s*)(\S*/)?(shutdown|reboot|halt|poweroff)(\s|[;&|)]|$)",
     "shutting down or rebooting the machine"),
    (r"(^|[;&|(`\n]\s*)(tel)?init\s+[06](\s|[;&|)]|$)", "shutting down or rebooting the machine"),
    (r"\bsystemctl\s+(-\S+\s+)*(poweroff|reboot|halt|kexec)\b", "shutting down or rebooting"),
    (r"\bcd(\s+[\"']?(/|~|\$HOME|\$\{HOME\})/?[\"']?)?\s*(;|&&|\n)\s*rm\s+(-\S+\s+)*[\"']?(\./)?\.?\*",
     "deleting everything in / or the home directory (cd there, then a glob)"),
]


def check_dangerous(command):
    """Return why a command is refused, or None when it may run."""
    for pattern, why in DANGEROUS:
        if re.search(pattern, command):
            return why
    return None


def clip(text, limit=MAX_OUTPUT):
    """Keep the head of long output with a visible marker saying what was cut."""
    if len(text) <= limit:
        return text
    return text[:limit] + f"\n... [truncated: {len(text) - limit} more characters]"


# What a command the model runs inherits. Never the agent's own configuration
# (ANTHROPIC_*, and whatever its .env set: load_dotenv put it in os.environ): a
# command, or a script in a cloned repository, has no business reading the key.
# Nor a variable whose name looks like a secret (Codex's shell environment policy):
# `env` would print the user's tokens to the model.
SECRET_NAME = re.compile(r"(^|_)([A-Z]*(KEY|TOKEN|SECRET|PASSWORD|PASSWD|PASSPHRASE|CREDENTIAL)|PASS|PAT)S?(_|$)",
                         re.I)  # a word of the name: OPENAI_API_KEY, DB_PASS, GH_PAT; not KEYMAP, TOKENIZERS
KEPT_NAMES = re.compile(r"GIT_CONFIG_(KEY|VALUE)_\d+")  # git's -c by environment: dropping half breaks git


def own_names():
    """The variables that configure the agent itself: ANTHROPIC_*, and what its .env set."""
    return {k for k in os.environ if k.startswith("ANTHROPIC_")} | set(dotenv_values(find_dotenv() or os.devnull))


def user_env():
    """The human's own environment, tokens included; only the agent's configuration goes."""
    own = own_names()
    return {k: v for k, v in os.environ.items() if k not in own}


def child_env():
    """The environment of a command the model runs: user_env() less every variable
    whose name looks like a secret."""
    return {k: v for k, v in user_env().items() if KEPT_NAMES.fullmatch(k) or not SECRET_NAME.search(k)}


def read_head(fh, limit=MAX_OUTPUT):
    """The start of an open binary file as text, clipped to `limit` characters.

    Reads at most 4 bytes per character kept (UTF-8's longest), never the whole
    file, so memory stays bounded whatever a command printed.
    """
    size = os.fstat(fh.fileno()).st_size
    fh.seek(0)
    data = fh.read(4 * limit)
    text = data.decode("utf-8", "replace")
    if len(data) == size:
        return clip(text, limit)
    return text[:limit] + f"\n... [truncated: {size} bytes in all, the first {limit} characters shown]"


def watch_command(p, sink, timeout):
    """Wait for a command, checking its output file as it grows; kill its process
    group past `timeout`, once the file passes BASH_OUTPUT_CAP, or on Ctrl+C.
    Returns None when it ended by itself, else a note saying why it was stopped."""
    deadline = time.monotonic() + timeout
    try:
        while True:
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(timeout=BASH_POLL)
            if p.returncode is not None:
                return None
            if os.fstat(sink.fileno()).st_size > BASH_OUTPUT_CAP:
                return (f"stopped: output passed {BASH_OUTPUT_CAP / 1e6:g} MB; redirect it "
                        f"to a file and read parts of it")
            if time.monotonic() >= deadline:
                return f"timed out after {timeout}s: run it in smaller steps or pass a larger timeout"
    finally:
        if p.returncode is None:  # stopped or interrupted: the whole pipeline goes
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGKILL)
            p.wait()


def run_bash(command, timeout=None):
    """Run one shell command in the workspace; stdout+stderr merged, clipped.

    Exit status 1 is ordinary (grep found nothing, diff found a difference),
    so only status >= 2 or a timeout counts as a tool error (seed rule).
    """
    if why := check_dangerous(command):
        raise ToolError(f"Refused by the blocklist ({why}). Do not retry it; "
                        f"find a safe way or ask the user to run it.")
    timeout = min(timeout or BASH_TIMEOUT, BASH_MAX_TIMEOUT)
    # Output goes to a file, not a pipe: a background job (`server &`) would hold
    # a pipe open and the call would wait for it. Own process group, so a
    # timeout, the output cap or Ctrl+C kills the whole pipeline, not just the shell.
    with tempfile.TemporaryFile() as sink:
        p = subprocess.Popen(command, shell=True, cwd=agent_state().workdir, stdin=subprocess.DEVNULL,
                             stdout=sink, stderr=subprocess.STDOUT, start_new_session=True,
                             env=child_env())
        if stopped := watch_command(p, sink, timeout):
            raise ToolError(f"{read_head(sink)}\n[{stopped}]")
        out = read_head(sink) or "(no output)"
    if p.returncode >= 2 or p.returncode < 0:
        raise ToolError(f"{out}\n[exit status {p.returncode}]")
    return out if p.returncode == 0 else f"{out}\n[exit status {p.returncode}]"


TOOLS = [{
    "name": "bash",
    "description": (
        "Run a shell command in the project directory and return its combined "
        "stdout and stderr. Use it to list, inspect, build, test and change files. "
        "Output longer than 30,000 characters is cut, so filter noisy commands "
        "(head, grep). Commands that wait for input or run forever time out; "
        "destructive system commands (sudo, rm -rf /, mkfs) are refused."),
    "input_schema": {
        "type": "object",
        "properties": {
            "command": {"type": "string", "description": "The shell command to run."},
            "timeout": {"type": "integer", "description": "Seconds before it is killed (default 120)."},
        },
        "required": ["command"],
    },
}]

TOOL_HANDLERS = {
    "bash": lambda command, timeout=None: run_bash(command, timeout),
}

def run_tool(block):
    """Execute one tool_use block and always return a tool_result block."""
    try:
        if block.name not in TOOL_HANDLERS:
            raise ToolError(f"Unknown tool '{block.name}'. Use one of: {', '.join(TOOL_HANDLERS)}.")
        content, is_error = TOOL_HANDLERS[block.name](**block.input), False
    except ToolError as e:
        content, is_error = str(e), True
    except Exception as e:  # a handler bug must not kill the loop
        content, is_error = f"{block.name} failed: {type(e).__name__}: {e}", True
    content = str(content or "(empty)").encode("utf-8", "replace").decode("utf-8")  # no lone surrogates
    result = {"type": "tool_result", "tool_use_id": block.id, "content": content}
    return result | ({"is_error": True} if is_error else {})


def preview(content, is_error=False):
    """One line of what the tool returned, for the human watching."""
    lines = str(content).strip().splitlines() or [""]
    more = f"  (+{len(lines) - 1} lines)" if len(lines) > 1 else ""
    return f"  {'error: ' if is_error else ''}{lines[0][:120]}{more}"

# --- agent loop ---
# Everything the human sees passes through a few functions, so a front end can
# take it over by redefining them: say() for progress and tool activity
# (stderr), show_text() for the model's answer as it streams (stdout), and
# read_line() for what the human types (questions get their own, ask_human(),
# in the chapter that first asks one). stdout carries nothing but answers.
#
# Every byte a file, a tool or the model controls passes printable() before it
# reaches the terminal (say() and show_text() call it, so callers need not): an
# escape sequence in a README's first line could retitle the window or rewrite
# the line above. Newlines and tabs stay, unless the text must be one line.
CONTROL_CHARS = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]")


def printable(text, newlines=True):
    """Control characters (C0, DEL, C1 such as CSI, bidi overrides) shown as escapes,
    never obeyed; newlines=False escapes line breaks too, for a one-line field."""
    text = CONTROL_CHARS.sub(lambda m: repr(m[0])[1:-1], str(text))
    return text if newlines else text.replace("\n", "\\n").replace("\t", "\\t")


def is_terminal(stream):
    return hasattr(stream, "isatty") and stream.isatty()


def say(text):
    """Progress for the human goes to stderr so stdout carries only the answer."""
    print(printable(text), file=sys.stderr, flush=True)


def show_text(text, out=None):
    """The model's text, the moment it arrives (out None: stdout). At a terminal its
    control characters are shown, not obeyed; a pipe or a file gets the bytes."""
    out = out or sys.stdout
    out.write(printable(text) if is_terminal(out) else text)
    out.flush()


def add_result(result, results):
    """A finished call's result joins the history; the human sees its first line."""
    results.append(result)
    say(preview(result["content"], result.get("is_error", False)))


def run_tools(calls, results):
    """Run one reply's tool calls; exactly one result per call, in call order.

    Each result joins `results` (already in the history) the moment its call
    finishes, so Ctrl+C never reports a call that ran as cancelled.
    """
    for block in calls:
        say(f"> {block.name} {json.dumps(block.input, ensure_ascii=False)[:200]}")
        add_result(run_tool(block), results)
    return results


def call_model(client, messages):
    """One streamed model call; text is printed the moment it arrives."""
    with client.messages.stream(model=model_id(), max_tokens=MAX_TOKENS, system=system_prompt(),
                                tools=TOOLS, messages=messages) as stream:
        for text in stream.text_stream:
            show_text(text)
        message = stream.get_final_message()
    if any(b.type == "text" for b in message.content):
        show_text("\n")
    return message


# What a reply block keeps in the history: thinking blocks (and their signature)
# must go back unchanged in later requests; citations and the like are dropped.
BLOCK_FIELDS = {"type", "text", "id", "name", "input", "thinking", "signature", "data"}


def assistant_message(message):
    """The reply as plain dicts, minus empty text blocks the API would reject."""
    blocks = [b.model_dump(exclude_none=True, include=BLOCK_FIELDS) for b in message.content]
    return {"role": "assistant",
            "content": [b for b in blocks if b["type"] != "text" or b["text"].strip()]}


def close_open_calls(messages, note="cancelled by the user"):
    """After Ctrl+C or a failure mid-tools, answer every call that has no result
    yet, so the history stays valid; the results of calls that ran are kept."""
    last = messages[-1] if messages else None
    if last and last["role"] == "assistant":
        if not last["content"]:
            messages.pop()
            return
        if any(b["type"] == "tool_use" for b in last["content"]):
            messages.append({"role": "user", "content": []})
    if len(messages) < 2 or messages[-2]["role"] != "assistant" \
            or not isinstance(messages[-1]["content"], list):
        return
    done = {b.get("tool_use_id") for b in messages[-1]["content"]}
    messages[-1]["content"] += [
        {"type": "tool_result", "tool_use_id": b["id"], "content": f"({note})", "is_error": True}
        for b in messages[-2]["content"] if b["type"] == "tool_use" and b["id"] not in done]


def agent_loop(client, messages):
    """Run model and tools until the model stops asking; return the stop reason.

    Invariant: on return, `messages` is a valid history (every tool_use has
    its tool_result), so the next user prompt can simply be appended.
    """
    unknown = 0
    try:
        for _ in range(turn_limit()):
            message = call_model(client, messages)
            messages.append(assistant_message(message))
            calls = [b for b in message.content if b.type == "tool_use"]
            if not calls:
                if not messages[-1]["content"]:
                    messages.pop()  # an empty reply adds nothing the API would accept
                return "end_turn"
            results = []  # in the history before any call runs: Ctrl+C keeps what finished
            messages.append({"role": "user", "content": results})
            run_tools(calls, results)
            for block in calls:
                unknown = unknown + 1 if block.name not in TOOL_HANDLERS else 0
            if unknown >= MAX_UNKNOWN_TOOLS:
                say(f"[stopped: {MAX_UNKNOWN_TOOLS} unknown-tool calls in a row]")
                return "unknown_tools"
        say(f"[stopped: {turn_limit()} turns without finishing]")
        return "max_turns"
    except KeyboardInterrupt:
        close_open_calls(messages)
        say("\n[interrupted: turn cancelled, you can keep typing]")
        return "interrupted"
    except Exception as e:  # API errors, and transport errors the SDK leaves unwrapped
        close_open_calls(messages, "the turn failed before this ran")
        say(f"[API error: {type(e).__name__}: {e}]")
        return "api_error"

# --- REPL / main ---
def add_user_text(messages, text):
    """Append a user prompt; after a failed turn, merge into the trailing user message."""
    if messages and messages[-1]["role"] == "user":
        content = messages[-1]["content"]
        if isinstance(content, str):
            content = [{"type": "text", "text": content}]
        messages[-1]["content"] = content + [{"type": "text", "text": text}]
    else:
        messages.append({"role": "user", "content": text})


def read_line(prompt):
    """input() at a terminal; from a pipe the prompt goes to stderr, so stdout
    holds only answers (printf 'task' | python sNN_x.py > answer.txt)."""
    if sys.stdin is None:  # started with stdin closed (<&-): that is the end of input
        raise EOFError
    if sys.stdin.isatty():
        return input(prompt)
    print(prompt, end="", file=sys.stderr, flush=True)
    return input()


def repl(client, prompt):
    history = []
    while True:
        try:
            line = read_line(prompt)
        except (EOFError, KeyboardInterrupt):
            print()
            return 0
        if line.strip() in ("q", "exit"):
            return 0
        if line.strip():
            add_user_text(history, line)
            agent_loop(client, history)


def no_key_message():
    demo = os.path.relpath(Path(__file__).parent / "tests" / "demo.py")
    return NO_KEY_HELP.format(demo=demo, chapter=CHAPTER)


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    client = make_client()
    if client is None:
        print(no_key_message(), file=sys.stderr)
        return 2
    try:
        turn_limit()
    except ValueError as e:
        print(e, file=sys.stderr)
        return 2
    CURRENT.set(AgentState(Path.cwd()))  # the session's agent works on the current directory
    if argv:
        history = [{"role": "user", "content": " ".join(argv)}]
        return 0 if agent_loop(client, history) == "end_turn" else 1
    return repl(client, f"{CHAPTER} >> ")


if __name__ == "__main__":
    sys.exit(main())
