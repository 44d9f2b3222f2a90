#!/usr/bin/env python3
"""s06_compact.py - context management: big results to disk, old results cleared in
batches, auto-compaction near the window, error recovery, prompt caching.

New since s05: persist_large, persist_prompt, fit_results, clear_old_results,
batch_minimum, context_tokens, request_tokens, compact, compact_now, SUMMARY_PROMPT,
call_with_recovery, recover, LineWatch, request_messages, cached, the compact tool
and /compact, update_view (the view kept between calls, so no call passes over the
whole history).

    tool result --> persist_large: > 30K chars -> .agent/tool-results/ (the model
         |          gets preview + path); one message's results > 90K -> the
         |          largest to disk, read_file's -> "read it in parts"
         |   prompt --> persist_prompt: a text > 200K chars (a paste) -> the same,
         |              before its first request (whole, it may never fit)
    call_with_recovery(history)
         |-- manage_context: size = last reported usage + estimate since
         |     results > WORKING_BUDGET above the floor, if the batch repays
         |     its cache rewrite (batch_minimum), or cache cold -> clear old
         |     results, one batch
         |     > 167K (> 177K even with the breaker open) -> compact:
         |        transcript.jsonl -> 9-section summary + verbatim tail + files
         |-- call_model: cache breakpoints on tools, system, newest messages
         '-- recover: 429/529/5xx -> backoff, retry; a cut stream continues
             the reply (prefill) | prompt too long -> compact, retry once |
             no room for max_tokens -> lower it, or compact | max_tokens ->
             "continue" | else: one line

Run:
    python s06_compact.py                 # REPL, prompt "s06 >> "; /compact [focus]
    python s06_compact.py "task"          # one task, then exit
    python tests/demo.py s06 --show-requests   # offline, no key: scripted model
    python tests/bench_s06_context.py     # cost of three context policies

Try:
    How many ERROR lines are in app.log, and which service logs most of them?
                        (the demo runs this one: --show-requests shows the saved
                        result, the batch clear and the compaction)
    run `seq 1 100000` and tell me the sum of the last 10 lines
                        (real model; watch the preview and .agent/tool-results/)
    read every .py file here one by one and summarise each
                        (real model, in a folder with code; watch the status line)
    /compact keep the list of files we changed                   (real model)

Key insight: the history is an append-only log the cache can reuse; change its
prefix rarely and on purpose (a batch clear, a compaction), never every turn.
"""

# --- imports ---
import difflib
import contextlib
import contextvars
import hashlib
import json
import os
import random
import re
import shlex
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

try:  # requirements.txt's packages: missing, one line says how (a venv first: PEP 668), no traceback
    import anthropic
    import yaml
    from dotenv import dotenv_values, find_dotenv, load_dotenv
    from rich.console import Console
    from rich.text import Text
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
        self.files = {}  # s02: resolved path -> (mtime_ns, size) when last read or written
        self.plan = {"items": [], "rounds_since_update": 0}  # s03: items is replaced, never mutated
        self.client = self.messages = self.tools = None  # s04: its loop (tools None: every tool)
        self.label = ""  # s04: a subagent's name, on each of its progress lines
        self.skills = {}  # s05: SKILL.md files as last parsed, by folder and source (parsed_skill)
        self.compaction = {"failures": 0, "requested": False, "focus": None}  # s06: of its history
        self.session = {"cost": 0.0}  # s06: the session's bill, shared with its subagents
        self.view = new_view()  # s06: its history as last shown to the API (update_view)


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
    return f"{SYSTEM}\nWorking directory: {agent_state().workdir}" + skills_prompt()  # s05: skill list

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
        out = read_head(sink, KEEP_BASH_CHARS) or "(no output)"  # s06: big output goes to disk
    if p.returncode >= 2 or p.returncode < 0:
        raise ToolError(f"{out}\n[exit status {p.returncode}]")
    return out if p.returncode == 0 else f"{out}\n[exit status {p.returncode}]"


TOOLS = [{
    "name": "bash",
    "description": (
        "Run a shell command in the project directory and return its combined "
        "stdout and stderr. Use it to list, inspect, build, test and change files. "
        "Output over 30,000 characters is saved to a file; you get a preview and the path, "  # s06: to disk
        "so filter noisy commands "  # s06
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
        if problem := check_input(block.name, block.input):  # s02: schema check first
            raise ToolError(f"Invalid input for {block.name}: {problem}. Fix the call and retry.")
        content, is_error = TOOL_HANDLERS[block.name](**block.input), False
    except ToolError as e:
        content, is_error = str(e), True
    except Exception as e:  # a handler bug must not kill the loop
        content, is_error = f"{block.name} failed: {type(e).__name__}: {e}", True
    content = str(content or "(empty)").encode("utf-8", "replace").decode("utf-8")  # no lone surrogates
    result = {"type": "tool_result", "tool_use_id": block.id, "content": content}
    persist_large(block, result)  # s06: a huge result goes to disk before it is shown
    return result | ({"is_error": True} if is_error else {})


def preview(content, is_error=False):
    """One line of what the tool returned, for the human watching."""
    lines = str(content).strip().removeprefix("<persisted-output>\n").splitlines() or [""]  # s06: its note
    more = f"  (+{len(lines) - 1} lines)" if len(lines) > 1 else ""
    return f"  {'error: ' if is_error else ''}{lines[0][:120]}{more}"

# --- s02: tool system ---
# The registry is three tables keyed by tool name: TOOLS (what the model sees),
# TOOL_HANDLERS (what runs) and TOOL_FLAGS (how it may run). Adding a tool is one
# register() call; the loop never changes.

# --- s02.1: the registry and the input check [core] ---
# The loop finds a call's handler by name, and check_input holds the model's input
# to the tool's own schema before the handler runs.
TOOL_FLAGS = {"bash": {"read_only": False, "concurrency_safe": False}}


def register(name, description, schema, handler, read_only=False, concurrency_safe=False):
    """Add a tool. read_only: it changes no file (the permission chapter lets such
    calls run without asking); concurrency_safe: it may run beside other safe calls."""
    TOOLS.append({"name": name, "description": description, "input_schema": schema})
    TOOL_HANDLERS[name] = handler
    TOOL_FLAGS[name] = {"read_only": read_only, "concurrency_safe": concurrency_safe}


def params(required, **fields):
    """JSON schema for an object: fields are name=(type, description)."""
    props = {k: {"type": t, "description": d} for k, (t, d) in fields.items()}
    return {"type": "object", "properties": props, "required": list(required)}


JSON_TYPES = {"string": str, "integer": int, "boolean": bool, "array": list,
              "object": dict, "number": (int, float)}


def check_input(name, args):
    """Required keys present, no unknown keys, simple types right; else say which."""
    schema = next(t["input_schema"] for t in TOOLS if t["name"] == name)
    props = schema.get("properties", {})
    if not isinstance(args, dict):
        return "input must be a JSON object"
    for key in schema.get("required", []):
        if key not in args:
            return f"missing required field '{key}'"
    for key, value in args.items():
        if key not in props:
            return f"unknown field '{key}' (allowed: {', '.join(props)})"
        want = JSON_TYPES.get(props[key].get("type"))
        if want and (not isinstance(value, want) or (want is int and isinstance(value, bool))):
            return f"field '{key}' must be of type {props[key]['type']}"
    return None


# --- s02.2: the path sandbox [core] ---
# Path sandbox (seed: second line of defence). resolve() follows every symlink on
# the existing part of the path, so "link -> /etc" and "linkdir/new.txt" both
# resolve outside and are refused; a path that does not exist yet is judged by
# its resolved parent.
def safe_path(p):
    root = agent_state().workdir
    try:
        path = (root / os.path.expanduser(p)).resolve()
    except (OSError, RuntimeError) as e:  # symlink loops
        raise ToolError(f"Cannot resolve {p}: {e}.")
    if not path.is_relative_to(root):
        raise ToolError(f"{p} is outside the workspace ({root}). Only paths inside it "
                        f"can be used; pass a relative path.")
    return path


def rel(path):
    """A path as the human reads it: relative inside the workspace, absolute outside
    (a path the human allowed for one call, or an additional directory)."""
    path = Path(path)
    return path.relative_to(agent_state().workdir).as_posix() or "." \
        if path.is_relative_to(agent_state().workdir) else str(path)


# --- s02.3: read, write and edit [core] ---
# The three file tools, each registered right after its handler. An edit needs a
# read first, and the file unchanged since (the stamp read_file recorded).
READ_LINES = 2_000          # lines per read_file call when no limit is given
MAX_LINE = 2_000            # characters shown per line; longer lines are cut
BINARY_SNIFF = 512          # bytes checked for NUL before reading (seed rule)


def stamp(path):
    st = path.stat()
    return (st.st_mtime_ns, st.st_size)


def check_fresh(path, shown):
    """Edits need a read first, and the file must not have changed since."""
    seen = agent_state().files.get(str(path))
    if seen is None:
        raise ToolError(f"Read {shown} with read_file before changing it.")
    if seen != stamp(path):
        raise ToolError(f"{shown} changed on disk since you read it; read it again first.")


def read_file(path, offset=1, limit=None):
    f = skill_file(path) or safe_path(path)  # s05: skill folders are readable too
    if not f.is_file():
        raise ToolError(f"{path} is not a file. Use glob to find the right path.")
    with open(f, "rb") as fh:
        if b"\0" in fh.read(BINARY_SNIFF):
            raise ToolError(f"{path} is a binary file. Inspect it with bash (file, xxd, strings).")
    total = count_lines(f)
    agent_state().files[str(f)] = stamp(f)
    if not total:
        return f"({path} is empty)"
    start = max(offset, 1) - 1
    if start >= total:
        raise ToolError(f"offset {offset} is past the end: {path} has {total} lines.")
    out, size, end = [], 0, min(total, start + (limit or READ_LINES))
    with open(f, encoding="utf-8", errors="replace", newline="\n") as fh:  # streamed, up to end
        for n in range(end):
            line, cut = next_line(fh)
            if n < start:
                continue
            row = f"{n + 1:6}\t{line}" + (f" [line cut: {cut} more characters; read them with "
                                          f"bash, e.g. cut -c{MAX_LINE + 1}-]" if cut else "")
            if size + len(row) > MAX_OUTPUT and out:
                end = n
                break
            out.append(row)
            size += len(row) + 1
    if end < total:  # large file: say how to get the rest instead of dumping it
        out.append(f"[showing lines {start + 1}-{end} of {total}; continue with "
                   f"offset={end + 1}, or grep for what you need]")
    return "\n".join(out)


def write_file(path, content):
    f = safe_path(path)
    if f.is_dir():
        raise ToolError(f"{path} is a directory; give a file path.")
    if f.exists():
        check_fresh(f, path)
    data = content.encode("utf-8")
    write_or_say(f, data, path)
    agent_state().files[str(f)] = stamp(f)
    return f"Wrote {len(data)} bytes to {rel(f)}"


def to_crlf(text):
    return text.replace("\r\n", "\n").replace("\n", "\r\n")


def not_found(path, data):
    """Why old_string matched nothing. read_file shows bytes that are not UTF-8 as
    U+FFFD, so a copy of such a line can never match: say so, and what works."""
    try:
        data.decode("utf-8")
    except UnicodeDecodeError as e:
        return (f"old_string was not found in {path}, which is not valid UTF-8 (byte "
                f"0x{data[e.start]:02x} at offset {e.start}): read_file shows such bytes as "
                f"\ufffd, which matches nothing. Change it with bash (sed, or python on the "
                f"bytes), or replace the whole file with write_file (it is saved as UTF-8).")
    return (f"old_string was not found in {path}. Copy it exactly from read_file output "
            f"(without line numbers), whitespace included.")


def edit_file(path, old_string, new_string, replace_all=False):
    if old_string == new_string:
        raise ToolError("old_string and new_string are identical; there is nothing to change.")
    if not old_string:
        raise ToolError("old_string is empty. To create a file use write_file.")
    f = safe_path(path)
    if not f.is_file():
        raise ToolError(f"{path} is not a file. Use write_file to create it.")
    check_fresh(f, path)
    data = f.read_bytes()
    text = data.decode("utf-8", "surrogateescape")  # bytes that are not UTF-8 survive the edit
    crlf = text.count("\r\n") > text.count("\n") / 2  # most lines end in CRLF
    if "\r\n" in text and old_string not in text:  # copied from read_file, which hides CR
        old_string, crlf = to_crlf(old_string), True
    if crlf:  # new lines end as the file's lines do
        new_string = to_crlf(new_string)
    count = text.count(old_string)
    if count == 0:
        raise ToolError(not_found(path, data))
    if count > 1 and not replace_all:
        raise ToolError(f"old_string occurs {count} times in {path}. Include more surrounding "
                        f"lines to make it unique, or set replace_all to change every one.")
    text = text.replace(old_string, new_string, -1 if replace_all else 1)
    write_or_say(f, text.encode("utf-8", "surrogateescape"), path)
    agent_state().files[str(f)] = stamp(f)
    return f"Edited {rel(f)}: {count if replace_all else 1} replacement(s)."


register("read_file", (
    "Read a text file from the workspace and return it with line numbers (cat -n style). "
    "Use it before editing a file, and to study code you found with grep or glob. "
    "For large files pass offset (1-based first line) and limit (line count); long "
    "output is cut with a hint saying where to continue. Binary files are refused: "
    "use bash (file, xxd) for them. Do not use bash cat for reading; this tool is cheaper."),
    params(["path"], path=("string", "File path, relative to the workspace or absolute inside it."),
           offset=("integer", "First line to read, 1-based (default 1)."),
           limit=("integer", "Number of lines to read (default 2000).")),
    read_file, read_only=True, concurrency_safe=True)
register("write_file", (
    "Create a file, or replace the whole content of one, creating parent directories "
    "as needed. Returns the number of bytes written. Use it for new files or complete "
    "rewrites; for changing part of a file use edit_file, which costs far fewer tokens. "
    "An existing file must have been read with read_file first."),
    params(["path", "content"], path=("string", "File path inside the workspace."),
           content=("string", "The complete new content of the file.")),
    write_file)
register("edit_file", (
    "Replace an exact piece of text in a file with new text. old_string must match the "
    "file exactly (whitespace included, without read_file's line numbers) and exactly "
    "once, unless replace_all is true. The file must have been read with read_file and "
    "be unchanged since; include enough surrounding lines to make the match unique."),
    params(["path", "old_string", "new_string"],
           path=("string", "File path inside the workspace."),
           old_string=("string", "Exact text to replace."),
           new_string=("string", "Replacement text (must differ from old_string)."),
           replace_all=("boolean", "Replace every occurrence (default false).")),
    edit_file)


# --- s02.4: parallel calls [core] ---
# Parallel tools: neighbouring concurrency-safe calls (reads, searches) run
# together in threads; anything that writes runs alone, so order of effects is
# the model's order. Results always come back in call order.
MAX_PARALLEL = 8            # worker threads for concurrency-safe calls


def run_parallel(batch, results):
    """Run a batch; results join `results` in call order. Returns a new empty batch.

    Each worker runs in a copy of this thread's context, so its tool sees this
    agent's state. On Ctrl+C the calls that finished keep their results.
    """
    if len(batch) <= 1:
        for b in batch:
            add_result(run_tool(b), results)
        return []
    with ThreadPoolExecutor(max_workers=min(MAX_PARALLEL, len(batch))) as pool:
        futures = [pool.submit(contextvars.copy_context().run, run_tool, b) for b in batch]
        kept = 0
        try:
            for f in futures:  # in call order, whatever order they finish in
                add_result(f.result(), results)
                kept += 1
        except KeyboardInterrupt:
            pool.shutdown(cancel_futures=True)  # waits for the running ones
            results += [f.result() for f in futures[kept:] if f.done() and not f.cancelled()]
            raise
    return []


def is_concurrency_safe(block):
    return TOOL_FLAGS.get(block.name, {}).get("concurrency_safe", False)


# --- s02.5: message normalisation [core] ---
# Message normalisation: the history we keep is ours; what the API sees is a
# cleaned copy that obeys its rules, whatever happened (Ctrl+C, a failed call,
# a dropped block). Private keys start with "_" (a later chapter marks blocks
# with some) and never leave the process.
def as_blocks(content):
    return [{"type": "text", "text": content}] if isinstance(content, str) else content


def api_blocks(m):
    """One message's blocks as the API may see them: fresh copies without the
    private keys, empty text blocks left out."""
    blocks = [{k: v for k, v in b.items() if not k.startswith("_")} for b in as_blocks(m["content"])]
    return [b for b in blocks if b["type"] != "text" or b["text"].strip()]


def normalize_messages(messages):
    out = []
    for m in messages:
        if not (blocks := api_blocks(m)):
            continue
        if out and out[-1]["role"] == m["role"]:
            out[-1]["content"] += blocks
        else:
            out.append({"role": m["role"], "content": blocks})
    if not out or out[0]["role"] != "user":
        out.insert(0, {"role": "user", "content": [{"type": "text", "text": "(continuing)"}]})
    if out[-1]["role"] == "assistant" and any(b["type"] == "tool_use" for b in out[-1]["content"]):
        out.append({"role": "user", "content": []})
    for prev, m in zip([None] + out, out):
        if m["role"] == "user":
            m["content"] = pair_results(prev, m["content"])
    return out


def pair_results(prev, blocks):
    """Exactly one result per call of the previous reply, in call order, first."""
    calls = [b["id"] for b in prev["content"] if b["type"] == "tool_use"] if prev else []
    found = {b["tool_use_id"]: b for b in blocks if b["type"] == "tool_result"}
    results = [found.get(i) or {"type": "tool_result", "tool_use_id": i, "is_error": True,
                                "content": "(no result: the call was cancelled)"} for i in calls]
    rest = [b for b in blocks if b["type"] != "tool_result"]
    return results + rest or [{"type": "text", "text": "(continuing)"}]


# --- s02.6: one door for every write [hardening: skip on first read] ---
# Stops: a link swapped in after the path was judged, so a write lands outside the workspace
# Test: tests/test_s02_door.py::test_a_folder_swapped_for_a_link_after_the_judge_is_not_written_through
# write_file and edit_file call write_or_say: every whole file the agent writes,
# in this chapter and later ones, goes through write_inside.
def open_folder(folder):
    """A descriptor of `folder` (absolute, resolved: no link on it when judged),
    reached from / one name at a time with O_NOFOLLOW, each made when missing. A
    link swapped in on the way after the path was judged fails the walk (ELOOP,
    ENOTDIR), so nothing is written where the judge never looked."""
    fd = os.open("/", os.O_RDONLY | os.O_DIRECTORY)
    try:
        for part in folder.parts[1:]:
            with contextlib.suppress(FileExistsError):
                os.mkdir(part, dir_fd=fd)
            fd, parent = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd), fd
            os.close(parent)
        return fd
    except BaseException:
        os.close(fd)
        raise


def write_inside(path, data, fresh=0o666):
    """The one door for a whole file the agent writes: the judged path, as judged,
    through a new file in the same folder and a rename. Whatever stands at the path
    (a link planted since, a hard link to a file elsewhere) is replaced, never
    written through; a file there keeps its mode (a script stays executable), a new
    one gets `fresh` less the umask (0o600 for the agent's private records)."""
    fd, tmp = open_folder(path.parent), f".agent-write-{os.urandom(6).hex()}"
    try:
        try:
            st = os.stat(path.name, dir_fd=fd, follow_symlinks=False)
            mode = stat.S_IMODE(st.st_mode) if stat.S_ISREG(st.st_mode) else None  # a link's 0o777 is no file's
        except FileNotFoundError:
            mode = None  # a new file: as any editor's
        out = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, fresh, dir_fd=fd)
        with open(out, "wb") as f:
            f.write(data)
            if mode is not None:
                os.fchmod(f.fileno(), mode)
        os.rename(tmp, path.name, src_dir_fd=fd, dst_dir_fd=fd)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp, dir_fd=fd)
        raise
    finally:
        os.close(fd)


def write_or_say(path, data, shown):
    """write_inside for a tool: a failure is the model's to hear, in one line."""
    try:
        write_inside(path, data)
    except OSError as e:
        raise ToolError(f"Could not write {shown}: {e.strerror or e}. If a folder on the way was "
                        f"just replaced by a link, nothing was written; check the path and retry.")


# --- s02.7: reading a huge file in constant memory [hardening: skip on first read] ---
# Stops: a multi-gigabyte file or one endless line filling the agent's memory
# Test: tests/test_s02_limits.py::test_a_huge_single_line_is_cut_and_never_held
# read_file counts the lines and reads them one by one through these two.
READ_CHUNK = 1 << 20        # bytes (or characters) a streamed read takes at a time


def count_lines(f):
    r"""Lines of a file as grep counts them ("\n"-ended, plus an unended last one),
    counted in binary chunks: memory stays flat whatever the file's size."""
    count, last = 0, b"\n"
    with open(f, "rb") as fh:
        while chunk := fh.read(READ_CHUNK):
            count, last = count + chunk.count(b"\n"), chunk[-1:]
    return count + (last != b"\n")


def next_line(fh):
    r"""The next line of a file opened with newline="\n" ("\n" only ends a line, as
    grep counts; splitlines would also split on \f and U+2028), without its line
    end or a CR before it, cut to MAX_LINE characters; and how many it had past
    those. The rest of a long line is counted piece by piece, never held."""
    head = piece = fh.readline(MAX_LINE + 1)
    size, tail = len(head), head[-2:]
    while piece and not piece.endswith("\n"):
        piece = fh.readline(READ_CHUNK)
        size, tail = size + len(piece), (tail + piece)[-2:]
    size -= len(tail) - len(tail.removesuffix("\n").removesuffix("\r"))
    line = head.removesuffix("\n").removesuffix("\r")[:MAX_LINE]
    return line, size - len(line)


# --- s02.8: glob and .gitignore [extra] ---
# Plumbing: skip on first read. Glob patterns and .gitignore rules share one
# translation: * and ? stay inside a path segment, ** spans any number of
# segments, {a,b} is alternation.
GLOB_LIMIT = 200            # paths returned by glob, newest first
AGENT_DIR = ".agent"        # the agent's own files (saved results, transcripts): not searched unless asked


def glob_regex(pattern):
    out, i, depth = "", 0, 0
    while i < len(pattern):
        c, step = pattern[i], 1
        if pattern.startswith("**/", i):
            piece, step = "(?:.*/)?", 3
        elif pattern.startswith("**", i):
            piece, step = ".*", 2
        elif c == "[" and "]" in pattern[i + 2:]:
            body = pattern[i + 1:pattern.index("]", i + 2)]
            piece, step = "[" + re.sub(r"^!", "^", body).replace("\\", "\\\\") + "]", len(body) + 2
        elif c == "{":
            piece, depth = "(?:", depth + 1
        elif c == "}" and depth:
            piece, depth = ")", depth - 1
        elif c == "," and depth:
            piece = "|"
        elif c == "\\" and i + 1 < len(pattern):
            piece, step = re.escape(pattern[i + 1]), 2  # \# \! \* \? stand for themselves
        else:
            piece = {"*": "[^/]*", "?": "[^/]"}.get(c) or re.escape(c)
        out, i = out + piece, i + step
    return re.compile(out + ")" * depth)


def gitignore_patterns(directory):
    """Rules of directory/.gitignore as (negated, pattern, dir_only)."""
    try:
        text = (directory / ".gitignore").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return []
    rules = []
    for line in text.splitlines():
        line = re.sub(r"(?<!\\)\s+$", "", line)  # trailing spaces go unless escaped ("\ ")
        if not line or line.startswith("#"):
            continue
        negated, line = line.startswith("!"), line.lstrip("!")
        dir_only, line = line.endswith("/"), line.rstrip("/")
        rules.append((negated, line, dir_only))
    return rules


def anchor(pattern):
    """A slash before the end anchors a pattern to its folder; else it matches at any depth."""
    return pattern.lstrip("/") if "/" in pattern else "**/" + pattern


def read_gitignore(directory):
    """Rules of directory/.gitignore as (base, regex, negated, dir_only)."""
    return [(directory, glob_regex(anchor(pattern)), negated, dir_only)
            for negated, pattern, dir_only in gitignore_patterns(directory)]


def is_ignored(path, is_dir, rules):
    ignored = False  # the last matching rule wins, as in git
    for base, rx, negated, dir_only in rules:
        if (is_dir or not dir_only) and path.is_relative_to(base):
            if rx.fullmatch(path.relative_to(base).as_posix()):
                ignored = not negated
    return ignored


def repo_root(path):
    """The nearest folder at or above path holding .git; its .gitignore rules apply."""
    return next((d for d in [path, *path.parents] if (d / ".git").exists()), None)


def ignore_parents(root):
    """The folders above root whose .gitignore applies inside it, outermost first:
    from the repository root down, as git reads them; with no repository, from
    the workspace down (a .gitignore above the workspace is someone else's)."""
    top = repo_root(root) or agent_state().workdir
    return [d for d in reversed(root.parents) if d.is_relative_to(top)]


def walk_files(root):
    """Regular files under root, minus .git, .gitignored paths, symlinks (never
    followed) and the agent's own folder (unless root is inside it). Rules come
    from the repository root down, as git applies them; a nested repository
    starts with its own."""
    own = agent_state().workdir / AGENT_DIR
    rules = {root: [r for d in ignore_parents(root) for r in read_gitignore(d)]}
    for dirpath, dirnames, filenames in os.walk(root):
        here = Path(dirpath)
        inherited = rules.pop(here)
        nested = here != root and (here / ".git").exists()  # a repository inside: own rules
        active = ([] if nested else inherited) + read_gitignore(here)
        keep = [d for d in sorted(dirnames) if d != ".git" and here / d != own
                and not (here / d).is_symlink() and not is_ignored(here / d, True, active)]
        dirnames[:] = keep
        rules.update({here / d: active for d in keep})
        for name in sorted(filenames):
            f = here / name  # a .git file (worktree, submodule) is git's, not the project's
            if name != ".git" and f.is_file() and not f.is_symlink() \
                    and not is_ignored(f, False, active):
                yield f


def check_pattern(pattern):
    if pattern.startswith(("/", "~")) or ".." in pattern.split("/"):
        raise ToolError("The pattern must be relative, without '..'; pass the directory "
                        "to search as path instead (it must be inside the workspace).")


def glob_files(pattern, path="."):
    root = safe_path(path)
    if not root.is_dir():
        raise ToolError(f"{path} is not a directory.")
    check_pattern(pattern)
    rx = glob_regex(pattern.removeprefix("./"))
    hits = [f for f in walk_files(root) if rx.fullmatch(f.relative_to(root).as_posix())]
    if not hits:
        return f"No files match {pattern!r} under {rel(root)!r}."
    hits.sort(key=lambda f: f.stat().st_mtime_ns, reverse=True)
    shown = [rel(f) for f in hits[:GLOB_LIMIT]]
    if len(hits) > GLOB_LIMIT:
        shown.append(f"[{len(hits) - GLOB_LIMIT} more not shown; narrow the pattern or path]")
    return "\n".join(shown)


register("glob", (
    "Find files by name pattern, e.g. '**/*.py' or 'src/**/test_*.{js,ts}'. Returns "
    "workspace-relative paths, most recently modified first, at most 200. Files ignored "
    "by .gitignore and the agent's own .agent folder are skipped (pass path '.agent' to "
    "list it). Use it to locate files by name; to search inside files use grep instead."),
    params(["pattern"], pattern=("string", "Glob pattern relative to path; ** spans directories."),
           path=("string", "Directory to search (default: the workspace root).")),
    glob_files, read_only=True, concurrency_safe=True)


# --- s02.9: grep, with ripgrep or in Python [extra] ---
# Plumbing: skip on first read. ripgrep when installed (fast, and .gitignore-aware),
# else the same walk in Python. Both produce records that one formatter turns into
# identical text.
GREP_LIMIT = 250            # result lines returned by grep
GREP_MODES = ("files_with_matches", "content", "count")


def rooted(folder, top):
    """folder as a gitignore pattern anchored at top, ending in "/" (glob characters escaped)."""
    where = folder.relative_to(top).as_posix()
    return "/" if where == "." else "/" + re.sub(r"([][*?{}\\!])", r"\\\1", where) + "/"


@contextlib.contextmanager
def rg_walk_args(root):
    """rg's arguments to search the files walk_files yields, run in the workspace.

    In a repository rg's own reading of the .gitignore files above root is
    git's when git is required (rg's default): it stops at the repository root,
    and a nested repository has its own rules. Outside one it would read them
    up to /, so it reads none (--no-ignore-parent); the rules of the workspace's
    folders above root come in an --ignore-file instead, rewritten relative to
    the workspace. rg anchors those to its working folder, and places them
    right only when root is given relative to it too.
    """
    workdir = agent_state().workdir
    args = ["-g", f"!/{AGENT_DIR}/"] if root == workdir else []  # as walk_files skips it
    if repo_root(root):
        yield args + ["--", str(root)]
        return
    lines = ["!" * negated + rooted(d, workdir) + anchor(pattern) + "/" * dir_only
             for d in ignore_parents(root) for negated, pattern, dir_only in gitignore_patterns(d)]
    with tempfile.NamedTemporaryFile("w", suffix=".gitignore", encoding="utf-8") as rules:
        rules.write("\n".join(lines) + "\n")
        rules.flush()
        yield args + ["--no-require-git", "--no-ignore-parent", "--ignore-file", rules.name,
                      "--", rel(root)]


def grep_rg(pattern, root, glob, ignore_case, mode):
    # --no-config: a user's ripgreprc (say, --follow) must not widen the sandbox;
    # only .gitignore files count, as in the Python walk. A line longer than
    # --max-columns bytes comes back as its head (enough for MAX_LINE characters).
    workdir = agent_state().workdir
    cmd = ["rg", "--no-config", "--null", "--with-filename", "--line-number", "--no-heading",
           "--color=never", "--hidden", "--no-ignore-dot", "--no-ignore-global",
           "--no-ignore-exclude", "--no-messages", "-g", "!.git",
           "--max-columns", str(4 * MAX_LINE + 4), "--max-columns-preview"]
    cmd += ["-i"] * ignore_case  # no -g: rg's globs override .gitignore, so filter after
    cmd += {"files_with_matches": ["-l"], "count": ["-c"], "content": []}[mode]
    with rg_walk_args(root) as args:
        p = subprocess.run(cmd + ["-e", pattern] + args, cwd=workdir, capture_output=True,
                           env=child_env())
    if p.returncode >= 2 and not p.stdout:  # 2 with output: some file was unreadable
        raise ToolError(f"grep failed: {p.stderr.decode('utf-8', 'replace').strip()[:500]}")
    out = p.stdout.decode("utf-8", "replace")
    if mode == "files_with_matches":  # -l --null: names end with NUL, no newline
        rows = [(name, "") for name in out.split("\0") if name]
    else:  # a row without NUL is rg's "stopped searching binary file" note
        binary = {row.split(": WARNING: ")[0] for row in out.split("\n") if "\0" not in row}
        rows = [row.partition("\0")[::2] for row in out.split("\n") if "\0" in row]
        rows = [(name, rest) for name, rest in rows if name not in binary]
    keep, records = glob_filter(glob, root), []
    for name, rest in rows:
        f = workdir / name  # absolute or workspace-relative; no resolve() per row
        if keep(f):
            path = f.relative_to(workdir).as_posix()
            records.append((path,) if mode == "files_with_matches" else (path, *rest.split(":", 1)))
    return records


def glob_filter(glob, root):
    """grep's glob: a bare name pattern matches the file name, else the path under
    root; a leading ! excludes instead."""
    if not glob:
        return lambda f: True
    exclude, glob = glob.startswith("!"), glob.lstrip("!").removeprefix("./")
    rx = glob_regex(glob)
    def keep(f):
        name = f.name if "/" not in glob else f.relative_to(root).as_posix()
        return (rx.fullmatch(name) is None) == exclude
    return keep


def grep_python(pattern, root, glob, ignore_case, mode):
    try:
        rx = re.compile(pattern, re.IGNORECASE if ignore_case else 0)
    except re.error as e:
        raise ToolError(f"Invalid regex {pattern!r}: {e}.")
    keep = glob_filter(glob, root)
    records = []
    for f in [root] if root.is_file() else walk_files(root):
        if not keep(f):
            continue
        try:
            data = f.read_bytes()
        except OSError:
            continue  # unreadable: skipped, as ripgrep does
        if b"\0" in data:
            continue  # binary, as ripgrep skips it
        lines = data.decode("utf-8", "replace").split("\n")
        if lines[-1] == "":
            lines.pop()  # the text after a final newline is not a line
        hits = [(str(n), line) for n, line in enumerate(lines, 1) if rx.search(line)]
        if hits and mode == "content":
            records += [(rel(f), *h) for h in hits]
        elif hits:
            records.append((rel(f), str(len(hits))) if mode == "count" else (rel(f),))
    return records


def grep(pattern, path=".", glob=None, ignore_case=False, output_mode="files_with_matches"):
    if output_mode not in GREP_MODES:
        raise ToolError(f"output_mode must be one of {', '.join(GREP_MODES)}.")
    root = safe_path(path)
    if not root.exists():
        raise ToolError(f"{path} does not exist.")
    if glob:
        check_pattern(glob.lstrip("!"))
    search = grep_rg if shutil.which("rg") else grep_python
    records = sorted(search(pattern, root, glob, ignore_case, output_mode),
                     key=lambda r: (r[0], int(r[1]) if output_mode == "content" else 0))
    if not records:
        return f"No matches for {pattern!r}."
    if output_mode == "content":  # one rule for both backends: a long line keeps its head
        records = [(f, n, text[:MAX_LINE] + f" [line cut at {MAX_LINE} characters]"
                    if len(text) > MAX_LINE else text) for f, n, text in records]
    lines = [":".join(r) for r in records]
    if len(lines) > GREP_LIMIT:
        lines = lines[:GREP_LIMIT] + [f"[{len(lines) - GREP_LIMIT} more not shown; narrow "
                                      f"the pattern, path or glob]"]
    return clip("\n".join(lines))


register("grep", (
    "Search file contents with a regular expression (ripgrep syntax) and list matching "
    "files, matching lines with line numbers (output_mode 'content'), or match counts "
    "('count'). Files ignored by .gitignore, binary files and the agent's own .agent "
    "folder are skipped (pass path '.agent' to search it); lines longer than 2,000 "
    "characters are cut. Narrow big searches with path or glob (e.g. '*.py'). Prefer it "
    "over running grep in bash."),
    params(["pattern"], pattern=("string", "Regular expression to search for."),
           path=("string", "File or directory to search (default: the workspace root)."),
           glob=("string", "Only search files matching this glob, e.g. '*.py'."),
           ignore_case=("boolean", "Case-insensitive search (default false)."),
           output_mode=("string", "files_with_matches (default), content or count.")),
    grep, read_only=True, concurrency_safe=True)

# --- s03: todo plan ---
# The plan is the agent's own state (AgentState.plan), kept beside `messages`,
# not inside it: the model rewrites it whole with todo_write, the human sees it
# as a checklist, and the loop counts tool rounds since the last update. Invariants: at most MAX_TODOS
# items, at most one in_progress. Not persisted: a new session starts without one.

# --- s03.1: todo_write: the plan and its rules [core] ---
# The model sends the whole plan each time; check_plan holds it to the rules, the
# human sees a checklist, the model gets the same list back as text.
MAX_TODOS = 20              # items per plan: long plans are brittle (seed ch5)
TODO_STATUSES = ("pending", "in_progress", "completed")
TODO_MARKS = {"pending": "[ ]", "in_progress": "[>]", "completed": "[x]"}
TODO_STYLES = {"pending": "", "in_progress": "bold yellow", "completed": "dim green"}
TODO_FIELDS = ("content", "status", "active_form")


def check_plan(items):
    """Return the plan as clean dicts, or raise ToolError naming the broken rule."""
    if not isinstance(items, list):
        raise ToolError("items must be a list of {content, status, active_form?} objects.")
    if len(items) > MAX_TODOS:
        raise ToolError(f"A plan holds at most {MAX_TODOS} items; you sent {len(items)}. "
                        f"Merge small steps into bigger ones and send the whole plan again.")
    plan = [check_item(n, item) for n, item in enumerate(items, 1)]
    busy = [str(n) for n, item in enumerate(plan, 1) if item["status"] == "in_progress"]
    if len(busy) > 1:
        raise ToolError(f"Only one item may be in_progress at a time (items {', '.join(busy)} "
                        f"are). Finish one first: mark it completed, or set the others to pending.")
    return plan


def check_item(n, item):
    if not isinstance(item, dict):
        raise ToolError(f"Item {n} must be an object {{content, status, active_form?}}.")
    if extra := [k for k in item if k not in TODO_FIELDS]:
        raise ToolError(f"Item {n} has unknown field '{extra[0]}' "
                        f"(allowed: {', '.join(TODO_FIELDS)}).")
    content, status = item.get("content"), item.get("status")
    if not isinstance(content, str) or not content.strip():
        raise ToolError(f"Item {n} needs a non-empty content string saying what the step is.")
    if status not in TODO_STATUSES:
        raise ToolError(f"Item {n} has unknown status {status!r}; use one of: "
                        f"{', '.join(TODO_STATUSES)}.")
    form = item.get("active_form", "")
    if not isinstance(form, str):
        raise ToolError(f"Item {n}: active_form must be a string, e.g. 'Running the tests'.")
    return {"content": content.strip(), "status": status, "active_form": form.strip()}


def plan():
    """The running agent's plan: {"items": [...], "rounds_since_update": n}."""
    return agent_state().plan


def plan_lines():
    """One checklist line per item; the current one says what is happening now."""
    lines = []
    for item in plan()["items"]:
        line = f"{TODO_MARKS[item['status']]} {item['content']}"
        if item["status"] == "in_progress" and item["active_form"]:
            line += f" ({item['active_form']})"
        lines.append(line)
    return lines


def plan_summary():
    items = plan()["items"]
    return f"({sum(item['status'] == 'completed' for item in items)}/{len(items)} completed)"


def plan_text():
    """What the model gets back: the count first (the human's one-line preview
    shows it), then the checklist as plain text."""
    if not plan()["items"]:
        return "The plan is empty."
    return "\n".join([plan_summary()] + plan_lines())


def show_plan():
    """The same checklist for the human, on stderr (stdout carries only answers).

    Text(), not markup strings: "[x]" or a "[bold]" inside an item would
    otherwise be read as rich markup and vanish.
    """
    out = Text()
    for item, line in zip(plan()["items"], plan_lines()):
        out.append(printable(line, newlines=False) + "\n", style=TODO_STYLES[item["status"]])
    out.append(plan_summary() if plan()["items"] else "(plan cleared)", style="dim")
    Console(stderr=True, highlight=False).print(out)


def todo_write(items):
    # a new list: the old one is never edited in place
    plan().update(items=check_plan(items), rounds_since_update=0)
    show_plan()
    return plan_text()


register("todo_write", (
    "Write the plan for the current task as a checklist; each call replaces the whole "
    "plan, so always send every item. Use it for multi-step work (3 or more distinct "
    "steps) or when the user gives a list of things to do, so you and the user can see "
    "progress; do not use it for trivial one-step tasks or plain questions. Mark an item "
    "in_progress before you start it (only one at a time) and completed right after it "
    "is done, not in batches; add, drop or reorder items as you learn more. At most 20 "
    "items, each a meaningful step."),
    {"type": "object", "properties": {"items": {
        "type": "array", "maxItems": MAX_TODOS,
        "description": "The complete plan in order; it replaces the previous one.",
        "items": {"type": "object", "properties": {
            "content": {"type": "string", "description": "The step, imperative: 'Run the tests'."},
            "status": {"type": "string", "enum": list(TODO_STATUSES)},
            "active_form": {"type": "string",
                            "description": "Shown while in progress: 'Running the tests'."}},
            "required": ["content", "status"]}}},
     "required": ["items"]},
    todo_write, read_only=True)  # touches no file; concurrency-unsafe: calls apply in order


# --- s03.2: the reminder [core] ---
# After each tool round the loop asks plan_reminder whether the plan went stale.
PLAN_REMINDER_INTERVAL = 3  # tool rounds without a plan update before a reminder


def has_open_items():
    return any(item["status"] != "completed" for item in plan()["items"])


def plan_reminder(calls, results):
    """Count one tool round; return the reminder blocks to append after its results.

    A round with a successful todo_write is an update (the handler already reset
    the counter). Otherwise the count grows, and every PLAN_REMINDER_INTERVAL-th
    round, while the plan has unfinished items, the model gets a nudge. Text
    after the tool_result blocks keeps the request valid (results come first).
    """
    ok = {r["tool_use_id"] for r in results if not r.get("is_error")}
    if any(b.name == "todo_write" and b.id in ok for b in calls):
        return []
    plan()["rounds_since_update"] += 1
    rounds = plan()["rounds_since_update"]
    if not has_open_items() or rounds % PLAN_REMINDER_INTERVAL:
        return []
    say(f"[plan reminder: {rounds} tool rounds without todo_write]")
    return [{"type": "text", "text": (
        f"<system-reminder>\nThe plan has not been updated for {rounds} tool rounds. "
        f"Refresh it with todo_write before continuing: mark finished items completed, "
        f"mark the item you are working on in_progress, and change the plan if the work "
        f"has changed. Do not mention this reminder to the user.\nCurrent plan:\n"
        f"{plan_text()}\n</system-reminder>")}]

# --- s04: subagents ---
# A subagent is a tool whose handler runs the same agent_loop on a new message
# list: its own history, a narrower tool list (never `agent`, so no recursion),
# a turn cap and its own system prompt. The parent gets one tool_result: the
# child's final text. Every step in between stays in the child and is dropped.

# --- s04.1: the agent tool: a child loop, one report back [core] ---
# At each loop start prepare_agent_tool notes the client and the history on the
# running agent; a call to `agent` then runs run_subagent, which runs agent_loop
# for a child agent and returns its last text.
SUBAGENT_MAX_TURNS = 30     # model calls per subagent run: a stuck child costs at most this

SUBAGENT_SYSTEM = (
    "You are a subagent: another agent gave you one self-contained task. Work on your own "
    "with the tools (nobody will answer questions), stay within the task, and finish with "
    "a concise report of what you found or changed, naming files and lines: that report "
    "is the only thing the other agent will see.")


def prepare_agent_tool(client, messages, tools):
    """At every agent_loop start: note the loop on its agent, refresh the agent types.

    The agent handler is called like any tool, with its input only, so the
    client and the history (for fork) come from the running agent's state. The
    description is rebuilt here, sorted, not per call: it is part of the prompt
    prefix and changes only when a definition file does. Only the main agent
    (tools None) rewrites it: a child has no agent tool.
    """
    state = agent_state()
    state.client, state.messages, state.tools = client, messages, tools
    if tools is None:
        desc = describe_agents(load_agents())
        TOOLS[:] = [t | {"description": desc} if t["name"] == "agent" else t for t in TOOLS]


def run_subagent(prompt, description=None, agent_type=None, fork=False):
    """The agent tool: run a child loop to the end and return only its final text."""
    client = agent_state().client
    if client is None:
        raise ToolError("The agent tool only works inside a running agent loop.")
    if not prompt.strip():  # "" is also how a label marks the main agent
        raise ToolError("The prompt is empty: write the complete task (goal, where to look, what to report).")
    spec, usage = pick_agent(agent_type, fork), {"calls": 0, "input": 0, "output": 0}
    settings = child_settings(spec, fork, usage)
    label = " ".join(str(description or "").split()) or " ".join(prompt.split())[:40]  # one line, never ""
    fresh = [{"role": "user", "content": prompt}]  # exactly one message: the task
    history = fork_messages(agent_state().messages, prompt) if fork else fresh
    say(f"[agent {label}: {agent_type or ('fork' if fork else 'general-purpose')}, started]")
    reason = run_child(client, history, child_state(fork, label[:24]), settings)
    if reason == "interrupted":
        raise KeyboardInterrupt  # Ctrl+C cancels the whole turn, not only the child
    note = (f"[subagent {label}: {usage['calls']} model calls, "
            f"{usage['input']} input + {usage['output']} output tokens]")
    say(note)
    text = last_text(history)
    if reason != "end_turn":
        why = CHILD_STOPS.get(reason, "stop reason " + reason).format(turns=settings["max_turns"])
        raise ToolError(f"The subagent stopped early: {why}. "
                        f"Its last words: {text or '(none)'}\n{note}")
    if history[-1]["role"] != "assistant":  # its final reply was empty: no report to pass on
        text = "(the subagent finished without a report)"
    return f"{text}\n\n{note}"


def child_settings(spec, fork, usage):
    """agent_loop keywords for a child; a fork keeps the parent's prompt and model."""
    system = f"{spec.get('system', SUBAGENT_SYSTEM)}\nWorking directory: {agent_state().workdir}"
    system += skills_prompt() if has_tool(spec, "load_skill") else ""  # s05: skills it may load
    return {"tools": child_tools(spec), "max_turns": spec.get("max_turns", SUBAGENT_MAX_TURNS),
            "system": None if fork else system, "model": spec.get("model"),
            "out": sys.stderr, "usage": usage}  # the child's text is progress, not the answer


def child_state(fork, label):
    """A subagent's own AgentState: the same workspace, a plan of its own, and
    file-read records of its own (a fork starts from a copy of the parent's).

    File-read records are runtime state, not infrastructure (seed): a fresh
    child must read a file before editing it, and when the child changes a file
    the parent read, the parent's stamp no longer matches, so it must re-read.
    """
    parent = agent_state()
    child = AgentState(parent.workdir)
    child.label = label
    if fork:
        child.files = dict(parent.files)
    child.session = parent.session  # s06: one bill for the whole session
    return child


def run_child(client, history, child, settings):
    """agent_loop for a child, run as its own agent: nothing of the parent's
    state is swapped out or has to be restored."""
    with acting_as(child):
        return agent_loop(client, history, **settings)


CHILD_STOPS = {  # agent_loop stop reason -> what the parent model should hear
    "max_turns": "it used all {turns} turns without finishing: give it a narrower task, "
                 "or do the rest yourself",
    "unknown_tools": "it kept calling tools it does not have: rephrase the task for its tools",
    "api_error": "the model API failed: retry later, or do the task yourself",
}


def add_usage(usage, message):
    """Add one call's tokens to a subagent's bill (None: nobody is counting)."""
    if usage is None:
        return
    u = message.usage
    usage["calls"] += 1
    usage["input"] += (u.input_tokens + (u.cache_read_input_tokens or 0)  # s06: cached tokens
                       + (u.cache_creation_input_tokens or 0))  # s06: were sent too, billed cheaper
    usage["output"] += u.output_tokens


def last_text(messages):
    """The text of the newest assistant message that has any."""
    if report := whole_reply(messages):  # s06: parts cut by max_tokens belong to the report
        return report  # s06
    for m in reversed(messages):
        texts = [b["text"] for b in as_blocks(m["content"]) if b["type"] == "text"]
        if m["role"] == "assistant" and texts:
            return "\n".join(texts).strip()
    return ""


# --- s04.2: the child's tools [core] ---
# A child gets the parent's tools minus `agent`, narrowed by its definition; a
# call to any other tool is answered as an unknown tool, never run.
def child_tools(spec):
    """The parent's tools as they are now (later chapters add some), minus agent,
    then narrowed by the definition: tools is an allow list, disallowed_tools a deny list."""
    tools = [t for t in TOOLS if t["name"] != "agent"]
    if spec.get("tools") is not None:
        if missing := sorted(set(spec["tools"]) - {t["name"] for t in tools}):
            warn_once(f"[agent {spec['name']}: no tool {', '.join(missing)} for subagents]")
        tools = [t for t in tools if t["name"] in spec["tools"]]
    return [t for t in tools if t["name"] not in spec.get("disallowed_tools", [])]


def allowed_names(tools):
    """What a loop may run: every handler for the main agent, its own list for a child."""
    return TOOL_HANDLERS if tools is None else {t["name"] for t in tools}


def run_allowed(calls, tools, results):
    """run_tools, but a call to a tool the child was not given is an unknown tool.

    The schema list only says what the model should call; this is what it can
    call. Refused calls never run and are answered first; normalize_messages
    puts every result back in call order for the API.
    """
    if tools is not None:
        names = allowed_names(tools)
        results += [refused(b, tools) for b in calls if b.name not in names]
        calls = [b for b in calls if b.name in names]
    return run_tools(calls, results)


def refused(block, tools):
    say(f"> {block.name} (not available to this agent)")
    names = ", ".join(t["name"] for t in tools) or "(none)"
    return {"type": "tool_result", "tool_use_id": block.id, "is_error": True,
            "content": f"Unknown tool '{block.name}': it is not available to this agent. "
                       f"Use one of: {names}."}


# --- s04.3: fork mode [core] ---
# fork: true runs a copy of the parent instead of a fresh agent.

# Fork mode (seed: Fork Boilerplate). The child is a copy of the parent: same
# history, system prompt and tools (minus agent). Every call still open in the
# parent's last reply, this agent call included, gets a placeholder result so
# the inherited history stays valid; the task comes last, wrapped in rules.
# Unlike the seed's forks it runs in the foreground (background work comes in
# a later chapter), and it loses `agent` like any child; Claude Code keeps the
# identical tool list instead, so the fork's request starts with the same bytes
# as the parent's (a later chapter's prompt cache can then reuse them).
FORK_PLACEHOLDER = ("(placeholder: the main agent is still running this call; "
                    "the fork does not get its result)")
FORK_BOILERPLATE = """<fork_boilerplate>
You are a forked worker, not the main agent. The conversation above is the main
agent's, shared with you as context.
Rules (not negotiable):
1. Do not fork or start other agents.
2. Do not chat, ask questions or wait for confirmation.
3. Use the tools directly: read files, search code, make changes.
4. Stay strictly within the task below.
5. Keep the final report under 500 words and begin it with "Scope:".
</fork_boilerplate>

Task: {task}"""


def fork_messages(history, task):
    """The parent's history, its open calls answered by placeholders, then the task.

    The parent's last message holds the results its current reply has so far
    (the loop appends it before the calls run): those stay, real results.
    """
    current = bool(history) and history[-1]["role"] == "user" and isinstance(history[-1]["content"], list)
    done, history = (history[-1]["content"], history[:-1]) if current else ([], history)
    last = history[-1] if history else {"role": "user", "content": ""}
    answered = {b.get("tool_use_id") for b in done}
    calls = as_blocks(last["content"]) if last["role"] == "assistant" else []
    results = list(done) + [{"type": "tool_result", "tool_use_id": b["id"], "content": FORK_PLACEHOLDER}
                            for b in calls if b["type"] == "tool_use" and b["id"] not in answered]
    brief = {"type": "text", "text": FORK_BOILERPLATE.format(task=task)}
    return shown_messages(history + [{"role": "user", "content": results + [brief]}])  # s06: as sent


# --- s04.4: agent types [core] ---
# Built-in, user (~/.agent/agents/) and project (.agent/agents/) definitions, the
# later winning a name; the agent tool's description lists them.
AGENT_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")  # type names, safe to list in a description
AGENT_FIELDS = {"name", "description", "tools", "disallowed_tools", "max_turns", "model"}  # known
FIELD_ALIASES = {"disallowedTools": "disallowed_tools", "maxTurns": "max_turns"}  # seed spelling
FRONTMATTER = re.compile(r"---[ \t]*\n(.*?\n)?---[ \t]*(?:\n(.*))?", re.S)  # YAML head, body
WARNED = set()               # warnings shown once: definitions are re-read at every loop start
EXPLORE_SYSTEM = (
    "You are explore, a read-only investigation subagent. Find what the task asks about "
    "with glob, grep and read_file; use bash only for commands that change nothing (ls, "
    "wc, git log, git diff). Never create, edit or delete files. Report your findings "
    "concisely: the answer first, then the evidence as path:line references. Your final "
    "message is the only thing the other agent will see.")
# Built-in types; a user or project definition with the same name replaces one.
# "Read-only" is the tool list plus the prompt: bash can still write, and only
# a later chapter's OS sandbox makes that impossible.
BUILTIN_AGENTS = {"explore": {
    "name": "explore", "system": EXPLORE_SYSTEM,
    "description": ("Read-only investigation: finds files, searches and reads code, and "
                    "reports what it found. It does not change files."),
    "tools": ["read_file", "glob", "grep", "bash"], "disallowed_tools": [],
    "max_turns": SUBAGENT_MAX_TURNS, "model": None}}

AGENT_TOOL_HELP = (
    "Delegate a self-contained task to a subagent: it works in a fresh context with its "
    "own tool calls and you get back only its final report. Use it for investigations "
    "or chores that need many searches and reads whose details you do not need to keep "
    "(e.g. 'find where X is configured and how it is used'), so your own context stays "
    "small. The subagent sees none of this conversation and cannot ask you questions, so "
    "write prompt as a complete brief: the goal, where to look, what to report. Do not "
    "use it for a single read or search (call that tool yourself), and do not start an "
    "agent from inside a subagent (it has no agent tool). fork: true instead runs a copy "
    "of you that inherits this conversation (not combinable with agent_type).\n"
    "Agent types (agent_type; omit it for a general-purpose agent with your tools):")


def warn_once(text):
    if text not in WARNED:
        WARNED.add(text)
        say(text)


def name_list(meta, field):
    """A tools field: a YAML list or a comma-separated string; None when absent."""
    value = meta.get(field)
    if isinstance(value, str):
        value = [v.strip() for v in value.split(",") if v.strip()]
    if value is not None and not (isinstance(value, list)
                                  and all(isinstance(v, str) for v in value)):
        raise ValueError(f"{field} must be a list of tool names")
    return value


def split_frontmatter(text):
    """(meta dict, body) of a markdown file with a YAML head; ValueError says what is wrong."""
    match = FRONTMATTER.fullmatch(text.lstrip("\ufeff").replace("\r\n", "\n"))
    if not match:
        raise ValueError("no YAML frontmatter (the file must start with a --- block)")
    try:
        meta = yaml.safe_load(match[1] or "") or {}
    except yaml.YAMLError as e:
        raise ValueError(f"bad YAML frontmatter: {' '.join(str(e).split())[:200]}")
    if not isinstance(meta, dict):
        raise ValueError("the frontmatter must be a mapping of key: value lines")
    return meta, (match[2] or "").strip()


def parse_agent_file(path):
    """One .agent/agents/*.md file -> an agent spec; ValueError says what is wrong."""
    meta, body = split_frontmatter(path.read_text(encoding="utf-8"))
    meta = {FIELD_ALIASES.get(k, k): v for k, v in meta.items()}
    # Strict on purpose: a misspelt disallowed_tools would hand the agent the very
    # tools it was meant to lose, so an unknown field rejects the whole file.
    if unknown := sorted(set(map(str, meta)) - AGENT_FIELDS):
        raise ValueError(f"unknown field {unknown[0]!r} (known: {', '.join(sorted(AGENT_FIELDS))})")
    name, description = meta.get("name", path.stem), meta.get("description")
    if not isinstance(name, str) or not AGENT_NAME.match(name):
        raise ValueError("name must be 1-64 letters, digits, '-' or '_'")
    if not isinstance(description, str) or not description.strip():
        raise ValueError("description is required: it tells the model when to use this agent")
    turns, model = meta.get("max_turns", SUBAGENT_MAX_TURNS), meta.get("model")
    if type(turns) is not int or turns < 1:
        raise ValueError("max_turns must be a positive integer")
    if model is not None and not isinstance(model, str):
        raise ValueError("model must be a model id, or 'inherit'")
    return {"name": name, "description": " ".join(description.split()),
            "tools": name_list(meta, "tools"),
            "disallowed_tools": name_list(meta, "disallowed_tools") or [],
            "max_turns": turns, "model": None if model == "inherit" else model,
            "system": body or SUBAGENT_SYSTEM}


def agent_dirs():
    """User level first, project last: a later definition of the same name wins."""
    return [Path.home() / ".agent" / "agents", agent_state().workdir / ".agent" / "agents"]


def load_agents():
    """Every agent type by name: built-in < user < project. Bad files are skipped."""
    agents = dict(BUILTIN_AGENTS)
    for folder in agent_dirs():
        for path in sorted(folder.glob("*.md")) if folder.is_dir() else []:
            try:
                spec = parse_agent_file(path)
            except Exception as e:  # a bad file never stops the loop
                warn_once(f"[skipped agent definition {path}: {e}]")
                continue
            agents[spec["name"]] = spec
    return agents


def describe_agents(agents):
    """The agent tool's description: fixed help, then one line per type, sorted."""
    return AGENT_TOOL_HELP + "".join(f"\n- {n}: {agents[n]['description']}" for n in sorted(agents))


def pick_agent(agent_type, fork):
    """The definition to run ({}: general-purpose, or a fork); ToolError says why not."""
    if fork and agent_type:
        raise ToolError("fork and agent_type cannot be combined: a fork is a copy of you. "
                        "Drop one of them.")
    agents = load_agents()
    if agent_type and agent_type not in agents:
        raise ToolError(f"Unknown agent_type '{agent_type}'. Use one of: "
                        f"{', '.join(sorted(agents))}; or omit it for a general-purpose agent.")
    return agents.get(agent_type, {})


register("agent", describe_agents(BUILTIN_AGENTS), params(
    ["prompt"], prompt=("string", "The complete task: goal, where to look, what to report back."),
    description=("string", "A 3-5 word label for the task, shown to the user."),
    agent_type=("string", "One of the agent types listed above; omit for a general-purpose agent."),
    fork=("boolean", "Run a copy of you that inherits this conversation (default false).")),
    run_subagent)

# --- s05: skills and slash commands ---
# A skill is a folder holding SKILL.md (YAML frontmatter + Markdown body) and any
# files the body links to: the open Agent Skills format, so a public skill folder
# copied into .agent/skills/ works unchanged. Progressive disclosure: only
# "- name: description" lines sit in the system prompt; a body enters the context
# when the model calls load_skill or the human types /name. The folders are
# scanned on every model call (a few small reads), so a skill written mid-session
# is usable at once, and the list is sorted so the prompt stays byte-identical
# while nothing changes on disk (a later chapter's prompt cache needs that).

# --- s05.1: finding skills, listing them in the prompt [core] ---
# Every model call scans the three skill folders; the prompt lists name and
# description of each skill the model may load, sorted.
MAX_DESCRIPTION = 1_024     # characters of a skill description kept (Agent Skills limit)
SKILL_NAME = re.compile(r"[\w.:-]+")  # one word, so it works as /name


def skill_dirs():
    """Where skills live, lowest precedence first: a later source wins a name."""
    return [("built-in", Path(__file__).parent / "skills"),
            ("user", Path.home() / ".agent" / "skills"),
            ("project", agent_state().workdir / ".agent" / "skills")]


def hint_text(hint):
    """argument-hint: [issue-number] is YAML for a list; show it as the user wrote it."""
    return f"[{', '.join(map(str, hint))}]" if isinstance(hint, list) else str(hint or "")


def flag(meta, key, default):
    """A yes/no frontmatter field; YAML gives a bool, hand-written ones may be strings."""
    value = meta.get(key)
    if value is None:
        return default
    return value if isinstance(value, bool) else str(value).strip().lower() in ("true", "yes", "1")


def parse_skill(folder, source):
    """One skill as a plain dict; unknown frontmatter keys are kept, never refused."""
    raw = (folder / "SKILL.md").read_bytes()  # one read: the hash is of the body that runs
    meta, body = split_frontmatter(raw.decode("utf-8", "replace"))
    name, description = str(meta.get("name") or folder.name), meta.get("description")
    if not isinstance(description, str) or not description.strip():
        raise ValueError("no description (it tells the model what the skill does and when)")
    if not SKILL_NAME.fullmatch(name):
        raise ValueError(f"name {name!r} must be one word (letters, digits, - _ . :)")
    return {"name": name, "description": " ".join(description.split())[:MAX_DESCRIPTION],
            "body": body, "path": folder.resolve(), "source": source, "meta": meta,
            "file": folder / "SKILL.md", "sha256": hashlib.sha256(raw).hexdigest(),
            "arg_hint": hint_text(meta.get("argument-hint")),
            "model": not flag(meta, "disable-model-invocation", False),
            "user": flag(meta, "user-invocable", True)}


def discover_skills():
    """name -> skill from every source. A broken SKILL.md is skipped with a warning."""
    skills, parsed = {}, {}  # parsed: the agent's next cache, only the files seen now (bounded)
    for source, root in skill_dirs():
        try:
            folders = sorted(root.iterdir()) if root.is_dir() else []
        except OSError as e:  # an unreadable folder must not stop the session
            warn_once(f"[skills: cannot read {root}: {e}]")
            folders = []
        for folder in folders:
            if folder.name.startswith(".") or not (folder / "SKILL.md").is_file():
                continue
            try:
                skill = parsed_skill(folder, source, parsed)
            except (OSError, ValueError) as e:
                warn_once(f"[skipped skill {folder / 'SKILL.md'}: {e}]")
                continue
            if skill["name"] in skills:  # a later source wins; say whose skill it replaced
                skill["replaces"] = skills[skill["name"]]["source"]
            skills[skill["name"]] = skill
    agent_state().skills = parsed
    return skills


def skills_prompt():
    """The system prompt's skill list: names and descriptions only, sorted by name."""
    lines = [f"- {name}: {s['description']}" for name, s in sorted(discover_skills().items())
             if s["model"]]
    if not lines:
        return ""
    return ("\n\nSkills (call load_skill with the name before a task that matches one, "
            "then follow what it says):\n" + "\n".join(lines))


def has_tool(spec, name):
    return any(t["name"] == name for t in child_tools(spec))


# --- s05.2: load_skill and the template [core] ---
# load_skill returns the body with its !`commands` run and its $ARGUMENTS filled
# in, in one scan of the body as written.
DYNAMIC_TIMEOUT = 30        # seconds for each !`command` in a skill body
ARGUMENT_REF = re.compile(r"\$ARGUMENTS\[(\d+)\]|\$ARGUMENTS|\$(\d+)")
# !`git diff` -> the command's output. The ! opens a line or follows a space, so
# prose such as "add `!` after the type" is never taken for a command.
DYNAMIC = re.compile(r"(?<!\S)!`([^`\n]+)`")
TEMPLATE = re.compile(f"{DYNAMIC.pattern}|{ARGUMENT_REF.pattern}")  # both, in one scan


def arg_words(args):
    """Shell-like words: '"Ada Lovelace" Bob' -> ['Ada Lovelace', 'Bob']."""
    try:
        return shlex.split(args)
    except ValueError:  # an unbalanced quote: plain words are good enough
        return args.split()


def run_dynamic(command, words, allowed=True):
    """One !`command`'s output via run_bash (blocklist and timeout apply), or why not."""
    if not allowed:
        return (f"[command `{command}` not run: the human did not allow this project "
                f"skill's commands, so their output is missing]")
    try:
        line = command_line(command, words)
        say(f"> !{line}")
        return clip(run_bash(line, DYNAMIC_TIMEOUT).rstrip("\n"), MAX_OUTPUT)
    except ToolError as e:
        return f"[command `{command}` failed: {e}]"


def substitute(body, args, allowed=True):
    """!`cmd` -> its output; $ARGUMENTS = all arguments; $0, $1 (or $ARGUMENTS[0]...) =
    shell-like words. args None (load_skill without arguments) leaves the text's as written.

    One scan of the body as written, commands and placeholders alike: neither a
    command's output nor an argument is scanned again, so neither can smuggle in
    a !`cmd` or a placeholder. A body without any placeholder gets the arguments
    appended, so they are never lost.
    """
    words = arg_words(args or "")

    def one(m):
        if m[1] is not None:
            return run_dynamic(m[1], words, allowed)
        if args is None:
            return m[0]
        index = m[2] or m[3]
        if index is None:
            return args
        return words[int(index)] if int(index) < len(words) else ""
    text = TEMPLATE.sub(one, body)
    if args and args.strip() and not ARGUMENT_REF.search(body):
        return f"{text}\n\nARGUMENTS: {args}"
    return text


def render_skill(skill, args=None, allowed=True):
    """The body as the model sees it; path lets it read the files the body links to."""
    body = substitute(skill["body"], args, allowed)
    return f'<skill name="{skill["name"]}" path="{skill["path"]}">\n{body}\n</skill>'


def load_skill(name, arguments=None):
    skills = discover_skills()
    visible = sorted(n for n, s in skills.items() if s["model"])
    if name not in skills:
        raise ToolError(f"Unknown skill '{name}'. Available skills: "
                        f"{', '.join(visible) or '(none)'}. Use one of these names exactly.")
    if not skills[name]["model"]:
        raise ToolError(f"Skill '{name}' can only be started by the user (as /{name}); "
                        f"carry on without it.")
    return render_skill(skills[name], arguments, may_run(skills[name]))


def skill_file(path):
    """An absolute path to a file in a discovered skill folder, else None.

    read_file uses it so a loaded skill's linked files can be read although the
    built-in and user folders lie outside the workspace. Only reads: writes
    still go through safe_path alone. Only folders holding a SKILL.md count,
    never a whole skills root (a cloned repository can make .agent/skills a
    link to /), and the file, symlinks resolved, must lie inside its folder.
    """
    p = Path(os.path.expanduser(str(path)))
    if not p.is_absolute():
        return None
    try:
        p = p.resolve()
    except (OSError, RuntimeError):
        return None
    # A skill folder that is itself a link (ln -s ~/src/my-skill ~/.agent/skills/)
    # is allowed, not refused: people keep their skills that way. Reads stay inside
    # the folder it points to (its "path"), and that folder must hold a SKILL.md, so
    # a link to /etc or ~ is no skill: the most a link reaches is one skill folder.
    return p if any(p.is_relative_to(s["path"]) for s in discover_skills().values()) else None


register("load_skill", (
    "Load a skill: the full instructions of one of the skills listed under 'Skills' in "
    "the system prompt. Call it first when a task matches a skill's description, then "
    "follow the instructions it returns. Files the skill mentions are relative to the "
    "path attribute of the returned <skill> tag; read them with read_file when the "
    "instructions say so. Pass arguments (a path, a git range, a topic) when the skill "
    "works on something specific. Do not call it for names that are not listed."),
    params(["name"], name=("string", "The skill's name exactly as listed."),
           arguments=("string", "Optional arguments for the skill, e.g. a path or git range.")),
    load_skill, read_only=False, concurrency_safe=False)  # runs !`commands`; may ask the human


# --- s05.3: slash commands [core] ---
# The REPL hands a line starting with / to handle_slash; every user-invocable
# skill is a command too.
HELP_DESCRIPTION = 72       # characters of a description shown per /help or /skills row
COMMANDS = {}               # name -> command dict, filled by command()


# Slash commands (seed: "Slash Command 命令框架"). Input starting with / is taken
# by the command registry before anything reaches the model. kind "local": the
# handler does the work and the model never sees it; kind "prompt": the handler
# returns the text that is sent to the model as the user's message. ctx carries
# what handlers may need (client, history) and gets "error" when a command fails.
def command(name, description, handler, aliases=(), arg_hint="", kind="local"):
    """Register /name; a later chapter adds its command with one call."""
    COMMANDS[name] = {"name": name, "description": description, "handler": handler,
                      "aliases": tuple(aliases), "arg_hint": arg_hint, "kind": kind}


def skill_command(skill):
    return {"name": skill["name"], "description": skill["description"], "aliases": (),
            "arg_hint": skill["arg_hint"], "kind": "prompt",
            "handler": lambda args, ctx: render_skill(skill, args, typed_consent(skill))}


def all_commands():
    """Registered commands, then every user-invocable skill whose name is still free."""
    cmds = dict(COMMANDS)
    taken = set(cmds) | {a for c in COMMANDS.values() for a in c["aliases"]}
    for name, skill in sorted(discover_skills().items()):
        if skill["user"] and name not in taken:
            cmds[name] = skill_command(skill)
    return cmds


def parse_slash(line):
    """'/name  some args' -> ('name', 'some args')."""
    name, args = (line.strip()[1:].split(None, 1) + ["", ""])[:2]
    return name, args.strip()


def handle_slash(line, ctx):
    """Run a /command. Returns the text to send to the model, or None when done here."""
    name, args = parse_slash(line)
    cmds = all_commands()
    cmd = next((c for c in cmds.values() if name in (c["name"], *c["aliases"])), None)
    if cmd is None and name:
        names = list(cmds) + [a for c in cmds.values() for a in c["aliases"]]
        close = difflib.get_close_matches(name, names, n=1)
        hint = f" Did you mean /{close[0]}?" if close else ""
        ctx["error"] = f"Unknown command /{name}.{hint}"
        say(ctx["error"] + " Type /help for the list.")
        return None
    try:
        out = (cmd or COMMANDS["help"])["handler"](args, ctx)
    except KeyboardInterrupt:  # Ctrl+C during a slow !`cmd`: cancel the command only
        ctx["error"] = f"/{name} cancelled"
        say(f"\n[{ctx['error']}]")
        return None
    except Exception as e:  # a broken command must not end the session
        ctx["error"] = f"/{name} failed: {type(e).__name__}: {e}"
        say(ctx["error"])
        return None
    return (out or None) if cmd and cmd["kind"] == "prompt" else None


def clip_row(text, width=HELP_DESCRIPTION):
    return text if len(text) <= width else text[:width - 3] + "..."


def show_help(args, ctx):
    """Every command, aligned, with its argument hint and aliases."""
    rows = []
    for c in all_commands().values():
        aliases = f" (/{', /'.join(c['aliases'])})" if c["aliases"] else ""
        usage = f"/{c['name']} {c['arg_hint']}".rstrip()
        rows.append((usage, clip_row(c["description"]) + aliases))
    width = max(len(usage) for usage, _ in rows)
    print(printable("\n".join(f"  {usage:<{width}}  {text}" for usage, text in rows)))  # a SKILL.md's words
    print("  Anything else is sent to the model; q or exit quits.")


def show_skills(args, ctx):
    """Every skill with its source and who may start it."""
    skills = discover_skills()
    if not skills:
        print("No skills. Add one as .agent/skills/<name>/SKILL.md in the project.")
        return
    width = max(len(name) for name in skills)
    for name, s in sorted(skills.items()):
        who = "+".join(w for w, on in (("model", s["model"]), ("user", s["user"])) if on)
        print(printable(f"  {name:<{width}}  {s['source']:<8}  {who or '-':<10}  "
                        f"{clip_row(s['description'])}", newlines=False))


def run_slash_once(client, line):
    """One-shot mode with a slash command: run it, and the agent loop if it made a prompt."""
    history = []
    ctx = {"client": client, "history": history}
    text = handle_slash(line, ctx)
    if text is None:
        return 1 if ctx.get("error") else 0
    if client is None:  # a prompt for the model, and no key to send it with
        print(no_key_message(), file=sys.stderr)
        return 2
    add_user_text(history, text)
    return 0 if agent_loop(client, history) == "end_turn" else 1


command("help", "List commands and skills (skills send their instructions to the model)",
        show_help, aliases=("h", "?"))
command("skills", "List skills: where each comes from and who may start it", show_skills)


# --- s05.4: a project skill's commands need a yes [hardening: skip on first read] ---
# Stops: a cloned repository's SKILL.md running commands at model load without the human's yes
# Test: tests/test_s05_skill_safety.py::test_project_commands_do_not_run_without_a_yes
# load_skill and a typed /name call may_run before any !`command` of a project
# skill runs.
TRUSTED = Path(".agent") / "trusted.yaml"  # under home: {workspaces: {path: {file: sha256}}}


def ask_human(question):
    """One question to the human: the prompt on stderr, the answer read from stdin,
    a pipe too (printf 'task\\ny\\n' | python sNN_x.py answers yes). End of
    input, or no stdin at all, answers no."""
    print(printable(question), end="", file=sys.stderr, flush=True)
    try:
        answer = input()
    except (EOFError, OSError, RuntimeError):
        print(file=sys.stderr)
        return "no"
    if not sys.stdin.isatty():  # a piped answer is not echoed: show it
        print(answer, file=sys.stderr)
    return answer


# Trust (seed: a cloned repository is untrusted input). What the human said yes
# to is kept in ~/.agent/trusted.yaml as {workspaces: {<workspace>: {<file
# relative to it>: <sha256 of its content>}}}: a changed file is a new question.
# Project skills' commands use it here; a later chapter adds other project files.
def load_trusted():
    """{workspace: {relative file: sha256}}; {} when absent, or corrupt (one warning)."""
    path = Path.home() / TRUSTED
    if not path.exists():
        return {}
    try:
        spaces = (yaml.safe_load(path.read_text("utf-8")) or {}).get("workspaces") or {}
        if all(isinstance(files, dict) for files in spaces.values()):
            return spaces
    except (OSError, ValueError, yaml.YAMLError, AttributeError):  # unreadable, not a map
        pass
    warn_once(f"[{path} is corrupt, so nothing in it is trusted; the next yes rewrites it]")
    return {}


def is_trusted(rel_path, digest):
    """Did the human say yes to this workspace file with exactly this content?"""
    return load_trusted().get(str(agent_state().workdir), {}).get(rel_path) == digest


def trust(rel_path, digest):
    """Record a yes, through s02's door: a new file renamed over the old one, so a
    crash never leaves half a file and no link is written through."""
    path = Path.home() / TRUSTED
    spaces = load_trusted()
    spaces.setdefault(str(agent_state().workdir), {})[rel_path] = digest
    try:  # ~/.agent resolved once: a link there is the user's own (dotfiles); none below it is followed
        write_inside(path.parent.resolve() / path.name, yaml.safe_dump({"workspaces": spaces}).encode(), 0o600)
    except OSError as e:  # the yes still holds for this call
        warn_once(f"[could not record the yes in {path}: {e}]")


def may_run(skill):
    """May a model's load_skill run this skill's !`commands`? A project skill's come
    from whoever wrote the repository, so the human is asked first, once per
    workspace and SKILL.md content. Built-in and user skills are the human's own."""
    commands = DYNAMIC.findall(skill["body"])
    if skill["source"] != "project" or not commands:
        return True
    rel_path = skill["file"].relative_to(agent_state().workdir).as_posix()
    if is_trusted(rel_path, skill["sha256"]):
        return True
    listed = "".join(f"\n    {c}" for c in commands)
    answer = ask_human(f"Skill {skill['name']} from this project ({rel_path}) runs:{listed}\n"
                       f"Allow its commands (asked again if SKILL.md changes)? [y/N] ")
    if answer.strip().lower() not in ("y", "yes"):
        return False
    trust(rel_path, skill["sha256"])
    return True


def typed_consent(skill):
    """Typing /name is the human's yes, unless a project skill took over the name of
    their own (built-in or user) skill: then they may think they run that one."""
    return may_run(skill) if skill.get("replaces") else True


# --- s05.5: arguments are data in a command [hardening: skip on first read] ---
# Stops: an argument such as $(rm -rf ~) running as part of a skill's !`command`
# Test: tests/test_s05_skill_safety.py::test_placeholders_in_a_command_are_quoted_words
# run_dynamic puts the arguments into a command through command_line.
def open_quote(text):
    """What is open at the end of a shell line: a backslash, ' or ", else ''."""
    quote, escaped = "", False
    for c in text:
        if escaped:
            escaped = False
        elif quote == "'":
            quote = "" if c == "'" else quote
        elif c == "\\":
            escaped = True
        elif c == '"' or (c == "'" and not quote):
            quote = "" if quote else c
    return "\\" if escaped else quote


def command_line(command, words):
    """A command with its placeholders as shell-quoted words: arguments are data.

    $ARGUMENTS is every word, each quoted (two paths stay two); a missing $N is
    nothing. Where the shell would not expand it ('$1', \\$1) a placeholder stays
    as written, as awk '{print $1}' needs. Inside "..." the command is refused:
    the shell still runs a $(...) put there, however it is quoted.
    """
    def one(m):
        quote = open_quote(command[:m.start()])
        if quote == '"':
            raise ToolError(f'{m[0]} inside "..." is not allowed; write it bare, it is quoted '
                            f'for you')
        if quote:
            return m[0]
        index = m[1] or m[2]
        if index is None:
            return shlex.join(words)
        return shlex.quote(words[int(index)]) if int(index) < len(words) else ""
    return ARGUMENT_REF.sub(one, command)


# --- s05.6: parsing each SKILL.md once [hardening: skip on first read] ---
# Stops: the YAML of every skill parsed again on every model call (~2 ms a call)
# Test: tests/test_history_cache.py::test_a_skill_file_is_parsed_again_only_when_its_bytes_or_place_change
# discover_skills asks parsed_skill, which parses a SKILL.md again only when its
# bytes or its place changed.
def parsed_skill(folder, source, parsed):
    """parse_skill, or the agent's earlier parse of the same bytes in the same place.
    The list is built for every model call: parsing each file's YAML again cost
    ~2 ms a call, a read and a hash cost little. A copy: the caller marks it."""
    key, raw = (str(folder), source), (folder / "SKILL.md").read_bytes()
    skill = agent_state().skills.get(key)
    same = skill is not None and skill["sha256"] == hashlib.sha256(raw).hexdigest()
    if not same or skill["path"] != folder.resolve():  # a folder link may point elsewhere now
        skill = parse_skill(folder, source)
    parsed[key] = skill
    return dict(skill)

# --- s06: context compaction ---
# A 200K window fills fast, and ~85% of it is tool output (file dumps, logs,
# search hits) that goes stale once the model has read it. From free to costly:
#   layer 1  a huge result goes to disk the moment it enters the history; the
#            model keeps a preview and the path, so nothing is lost (a huge
#            paste too, before its first request: whole, it could not be sent)
#   clear    old results become placeholders: in one batch, only after the
#            model has seen them, only past WORKING_BUDGET or on a cold cache
#   layer 2  near the window the model summarises the old turns (9 sections,
#            transcript saved first); the recent tail stays verbatim
#   recover  max_tokens, prompt too long, no room for the reply, overload and
#            cut streams each get a bounded, named way out; anything else ends
#            the turn in one line. Writing .agent/ may fail (a read-only
#            checkout): that costs the disk copy, never the turn.
#
# Clearing versus caching. The API caches the request prefix up to each
# cache_control breakpoint; a cache read costs 0.1x the input price, a write
# 1.25x. Clearing an old result changes the prefix from that result on, so all
# that follows is written again. Clearing every turn keeps the context small
# but breaks the prefix every turn, so the cache cannot help; clearing in
# batches lets each turn read what the last one wrote and pays the rewrite
# once per batch.
# The floor. Part of every request no clear can lower: tools, system prompt
# and instructions, the prompts, replies and tool inputs, the placeholders,
# the files re-attached after a compaction. WORKING_BUDGET counts only what
# lies above it: the tokens the results not cleared yet would free. (A budget
# on the whole request left, over the ~26K floor of a compaction, 14K of room:
# a batch every 3 requests, each a ~30K rewrite.)
# What a batch must free. After a batch the next request finds no cache entry
# between the system prompt and the first cleared result (at worst: see below),
# so it writes all its messages again: W tokens at 1.25x that it would have
# read at 0.1x, 1.15 W more. From then on each request reads the S freed
# tokens no more, 0.1 S less. Repaid within N = CLEAR_PAYBACK requests when
#     0.1 S (N + 1) >= 1.15 W,   W = M - S   (M: the messages' tokens now)
#     S >= M x 1.15 / (0.1 (N + 1) + 1.15)  =  0.51 M for N = 10
# (batch_minimum), else the batch waits. Over a small floor the budget decides:
# 20K of results, the newest (~4K) kept, free ~16K of ~22K. Over a 20K floor
# (summary and 5 files re-attached) the rule does: a batch waits until it frees
# ~25K, 7 reads of 14 KB where the budget alone cleared 5. W is the worst case:
# the cache looks back 20 blocks from each breakpoint for an earlier entry, and
# with 1 result kept, the request after a batch wrote one at its last
# placeholder; so a batch within ~10 requests of the last writes only what
# came since.
# tests/bench_s06_context.py (100 turns, each reading a new 12 KB file; tokens
# = request bytes / 4; list prices; the cache billed by the API's documented
# rules, 20-block lookback included):
#   policy                                 input tokens  peak context  est. input cost
#   (a) no management                        17,997,212       353,902  $53.99 (> 200K)
#   (b) clear every turn, keep 3, no cache    1,642,222        20,126   $4.93
#   (c) batches past 20K, keep 1, cache       1,652,545        27,008   $1.80 = 0.37 x (b)
# 77% of (c)'s input tokens are cache reads; between its 19 batches each request
# repeats the last one byte for byte. Every file reached the model. The same
# 100 reads of 14 KB files over 4 prompts in one session: (b) $5.63, (c) $2.02
# = 0.36 x (b); with a compaction after the first prompt (its summary and 5
# re-attached files the floor of the rest): (b) $10.03, (c) $2.76 = 0.28. (The
# budget on the whole request, 40K, keep 2: 0.48, 0.47 and 0.50.)
# Why keep 1 past 20K, repaid in 10 (--sweep, every scenario, on a 200K and a
# 1M window alike): repaid in 10, keeping 1 costs 0.28-0.47 x (b) from 20K to
# 50K, keeping 2 0.36-0.49, keeping 3 0.39-0.54: each batch writes the kept
# results again and every later request reads them. 20K is the cheapest budget
# in every scenario. Repaid in 10 or 20 tie but after a compaction (0.28, 0.26),
# in 5 costs more there (0.33); 10 is the safer, as W is the worst case. The
# price: right after a batch only the newest result is verbatim, and an older
# one the model still needs is read again (the placeholder says so), a call
# the benchmark does not count.

# --- s06.1: big results to disk [core] ---
# Layer 1. It runs once per result, as the result enters the history, so the
# text the model sees never changes afterwards (a byte-stable prefix). A
# workspace that cannot be written (read-only, full disk) never fails the turn:
# the model then gets the preview alone, with a note saying nothing was saved.
PERSIST_CHARS = 30_000      # a tool result longer than this goes to disk (bash's old cap)
PREVIEW_CHARS = 2_000       # characters of a saved result the model still sees
KEEP_BASH_CHARS = 5_000_000  # bash output kept for the disk copy: only a memory guard now


def preview_of(text):
    """The first PREVIEW_CHARS of a text, ending on a whole line where one ends past half of it."""
    preview = text[:PREVIEW_CHARS]
    cut = preview.rfind("\n")
    return preview[:cut] if cut > PREVIEW_CHARS // 2 else preview


def persist_output(block):
    """Save a result's full text to disk; the block keeps a preview and the path."""
    text, path = block["content"], kept_path(block)
    preview = preview_of(text)
    try:
        save_scratch(path, text.encode("utf-8", "replace"))
    except OSError as e:
        say(f"[{len(text):,} characters of output could not be saved to {rel(path)} "
            f"({e.strerror or e}): the model gets the first {len(preview):,} only]")
        block["content"] = (
            f"{preview}\n[output too large ({len(text):,} characters) and it could not be saved "
            f"to disk ({e.strerror or e}): only the first {len(preview):,} characters are shown. "
            f"Rerun it with a filter (grep, head, tail) for the part you need.]")
        return
    say(f"[{len(text):,} characters of output saved to {rel(path)}: the model gets a "
        f"{len(preview):,}-character preview and the path]")
    block["content"] = (
        f"<persisted-output>\nOutput too large ({len(text):,} characters). Full output saved "
        f"to: {rel(path)}\nRead it with read_file (offset/limit) or search it with grep. "
        f"read_file cuts lines at {MAX_LINE:,} characters; grep (output_mode content) or bash "
        f"(cut -c, head -c) reach the rest of a longer line.\n\n"
        f"Preview (first {len(preview):,} characters):\n{preview}\n</persisted-output>")


def persist_large(block, result):
    """A result above PERSIST_CHARS goes to disk as it is made (run_tool calls
    this before the human's preview line, so that line shows what the model gets)."""
    if block.name not in PERSIST_EXEMPT and len(result["content"]) > PERSIST_CHARS:
        persist_output(result)
    return result


# --- s06.2: the call, managed [core] ---
# The loop calls call_with_recovery instead of call_model. Before the request,
# manage_context measures the context (below), clears old results in one batch
# when it is over budget, and compacts near the window; after the reply,
# after_call marks what the model saw and prints the status line. Error recovery (seed: classify, then
# a bounded way out per kind) is in the sub-sections after the core: a prompt
# too long, no room for the reply, a cut stream, transient errors, max_tokens.
def call_with_recovery(client, messages, **options):
    """call_model with the context managed first and every recoverable failure
    handled (recover): transient errors back off and retry, a cut reply is
    continued, a prompt too long is compacted and retried once, a reply without
    room gets a lower max_tokens; a reply cut by max_tokens is continued
    (MAX_CONTINUATIONS). Anything else propagates to agent_loop, which ends the
    turn with one line and a valid history. `options` go to call_model."""
    manage_context(client, messages, options)
    turn = {"retries": 0, "compacted": False, "max_tokens": MAX_TOKENS}
    continuations, line = 0, LineWatch(options.get("out"))
    while True:
        try:
            message = call_model(client, messages + line.prefill(),
                                 **{**options, "out": line, "max_tokens": turn["max_tokens"]})
        except Exception as e:
            if not recover(client, messages, e, turn, line, options):
                line.close()  # a reply cut mid-line ends before anything else is said
                raise
            continue
        after_call(messages, line.joined(message))
        if message.stop_reason != "max_tokens" or continuations >= MAX_CONTINUATIONS:
            return message
        continuations += 1
        say(f"[reply hit max_tokens: asking it to continue ({continuations}/{MAX_CONTINUATIONS})]")
        partial = assistant_message(message)
        partial["content"] = [b for b in partial["content"] if b["type"] == "text"]  # a cut call is broken
        if partial["content"]:
            messages.append(partial)
        add_user_text(messages, CONTINUE_PROMPT)


def manage_context(client, messages, options=None):
    """Before every request: a requested compaction, else a batch clear when the
    results are over budget above the floor (if it repays its rewrite) or when
    the cache went cold (a cold prefix is written again anyway, so any clear is
    free), then auto-compaction near the window. `options`: the loop's
    call_model keywords."""
    state = agent_state().compaction
    if state["requested"]:
        state["requested"] = False
        compact(client, messages, state["focus"], "requested by the model", options)
        return
    tokens = request_tokens(client, messages, options)
    anchor = last_usage(messages)
    cold = anchor is not None and time.time() - anchor["at"] > CACHE_TTL
    # the results pass the budget only in a request that does: a cheap test first
    if (tokens > WORKING_BUDGET or cold) and (n := clear_old_results(
            messages, 0 if cold else batch_minimum(messages), 0 if cold else WORKING_BUDGET)):
        why = f"{tokens:,} tokens" if tokens > WORKING_BUDGET else "the cache went cold"
        say(f"[cleared {n} old tool result(s) in one batch: {why}]")
        tokens = request_tokens(client, messages, options)
    if tokens >= FORCE_COMPACT_AT or (tokens >= AUTO_COMPACT_AT and
                                      state["failures"] < MAX_COMPACT_FAILURES):
        compact(client, messages, None, f"{tokens:,} tokens", options)


def is_api_failure(e):
    return isinstance(e, anthropic.APIError) or is_transient(e)


# --- s06.3: measuring the context [core] ---
# Context size. The API's own count for the last request (input + cache read
# + cache write) plus its reply (output) is exact; only the change since is
# estimated, at ~4 characters per token. The anchor sits on the last message
# of the request as "_usage"; a compaction drops it with the old messages.
CONTEXT_WINDOW = 200_000    # tokens the model can attend to


def estimate_tokens(obj):
    return len(json.dumps(obj, ensure_ascii=False, default=str)) // 4


def last_usage(messages):
    return next((m["_usage"] for m in reversed(messages) if "_usage" in m), None)


def context_tokens(messages):
    """Tokens the next request will carry, or None before any reported usage."""
    anchor = last_usage(messages)
    if anchor is None:
        return None
    return max(0, anchor["tokens"] + view_tokens(messages) - anchor["estimate"])


def loop_prefix(options=None):
    """(model, system, tools) of the loop being managed: a child's own, else the
    main agent's (call_model's defaults), so its summary reuses its cached prefix."""
    options = options or {}
    tools = TOOLS if options.get("tools") is None else options["tools"]
    return options.get("model") or model_id(), options.get("system") or system_prompt(), tools


def request_tokens(client, messages, options=None):
    """context_tokens, or without usage a guess; count_tokens when the guess matters."""
    if (known := context_tokens(messages)) is not None:
        return known
    model, system, tools = loop_prefix(options)
    view = shown_messages(messages)
    guess = estimate_tokens(view) + estimate_tokens([system, tools])
    if guess < WORKING_BUDGET:
        return guess
    try:  # exact, and free; a guess is still better than failing the turn
        return client.messages.count_tokens(model=model, system=system,
                                            tools=tools, messages=view).input_tokens
    except Exception as e:
        if not is_api_failure(e):
            raise
        return guess


def after_call(messages, message):
    """Mark what the model has now seen, anchor the size, print the status line."""
    view = update_view(messages)
    for b in tool_results(messages[view["sent"]:]):  # the messages before it have theirs marked
        b["_sent"] = True
    view["sent"] = len(messages)
    u = message.usage
    read, write = u.cache_read_input_tokens or 0, u.cache_creation_input_tokens or 0
    total = u.input_tokens + read + write + u.output_tokens
    messages[-1]["_usage"] = {"tokens": total, "at": time.time(), "estimate": view_tokens(messages)
                              + estimate_tokens(assistant_message(message))}
    # No `usage` here: call_model already added this call's tokens to a child's bill.
    say(f"[context {total:,}/{CONTEXT_WINDOW:,} tokens | {charge(message)}]")


# --- s06.4: clearing old results [core] ---
# Old results. The history itself keeps every result; a cleared one is only
# shown as a placeholder in the copy sent to the API. Private "_" keys never
# reach the API (normalize_messages drops them): _sent = a request that
# carried it got an answer, _cleared = show the placeholder.
WORKING_BUDGET = 20_000     # tokens the results not cleared yet would free (above the floor): past it, a batch
KEEP_RESULTS = 1            # newest tool results a batch clear leaves intact
CLEAR_PAYBACK = 10          # requests in which a batch clear must repay its cache rewrite, or it waits
CACHE_TTL = 300             # seconds the prompt cache lives without a request (5 min)


def tool_results(messages):
    return [b for m in messages if m["role"] == "user" and not isinstance(m["content"], str)
            for b in m["content"] if b["type"] == "tool_result"]


def cleared_stub(block):
    content = str(block.get("content"))  # only layer 1's own note names a saved file
    saved = content.startswith("<persisted-output>") and re.search(r"saved to: (\S+)", content)
    where = saved[1] if saved else rel(kept_path(block))  # else kept as it was cleared (s06.14)
    return {**block, "content": f"[old tool result cleared to save context; the full output is in "
                                f"{where} (read_file, with offset/limit for a long one)]"}


def clearable(b):
    """Not cleared yet, and its placeholder would be shorter."""
    return not b.get("_cleared") and len(str(b.get("content"))) > len(cleared_stub(b)["content"])


def saving(b):
    """Tokens a result's placeholder frees."""
    return estimate_tokens(b["content"]) - estimate_tokens(cleared_stub(b)["content"])


def clear_old_results(messages, min_tokens=0, budget=0):
    """One batch: every result the model has seen, except the newest few, becomes
    a placeholder. Returns how many were cleared (the prefix breaks once).

    Nothing is cleared while the results not cleared yet would free `budget`
    tokens or fewer: the rest of the context is the floor, which no clear can
    lower, and the budget counts above it. A batch that would free less than
    min_tokens clears nothing either: it waits until it repays the cache
    rewrite it causes (batch_minimum).
    """
    view = update_view(messages)  # this runs every call once over budget: the messages
    start = view["settled"]  # before "settled" hold no result that can become clearable
    results = tool_results(messages[start:])
    old = results[:-KEEP_RESULTS] if KEEP_RESULTS else results
    passed = 0  # and it moves on past the messages that hold none either
    for m in messages[start:]:
        mine = tool_results([m])
        if passed + len(mine) > len(old) or any(map(clearable, mine)):
            break  # one still among the newest few, or one that may be cleared
        passed += len(mine)
        view["settled"] += 1
    if sum(saving(b) for b in results if clearable(b)) <= budget:
        return 0  # above the floor, the results still fit: nothing to gain yet
    fresh = [b for b in old if b.get("_sent") and clearable(b)]
    if sum(map(saving, fresh)) < min_tokens:
        return 0
    fresh = [b for b in fresh if keep_cleared(b)]  # a placeholder's way back is a file
    for b in fresh:
        b["_cleared"] = True
    if fresh and CURRENT.get(None):  # older messages changed in place, which update_view
        agent_state().view = new_view()  # cannot see: the agent's view starts again
    return len(fresh)


def batch_minimum(messages):
    """Tokens a batch clear must free to repay, within CLEAR_PAYBACK requests, the
    rewrite of the messages it causes (the rule and its arithmetic: s06's notes)."""
    rewrite = CACHE_WRITE_PRICE - CACHE_READ_PRICE  # a token written again instead of read
    return view_tokens(messages) * rewrite / (CACHE_READ_PRICE * (CLEAR_PAYBACK + 1) + rewrite)


def shown(m):
    """One message with its cleared results as placeholders."""
    if isinstance(m["content"], str):
        return m
    return {**m, "content": [cleared_stub(b) if b.get("_cleared") else b for b in m["content"]]}


def shown_messages(messages):
    """The history as the API sees it: normalised, cleared results as placeholders."""
    return normalize_messages([shown(m) for m in messages])


# --- s06.5: auto-compaction [core] ---
# Layer 2: near the window, the old part of the history becomes a summary.
# The cut point keeps a verbatim tail and never separates a tool_use from its
# tool_result: the tail may not start with a user message that answers calls
# made before it. The newest message is always kept: a lone message (a first
# prompt) leaves nothing older to summarise.
OUTPUT_RESERVE = 20_000     # tokens kept free for the summary a compaction writes
SAFETY_MARGIN = 13_000      # tokens: one turn's growth plus estimation error (seed figure)
AUTO_COMPACT_AT = CONTEXT_WINDOW - OUTPUT_RESERVE - SAFETY_MARGIN  # 167K: compact from here
FORCE_COMPACT_AT = CONTEXT_WINDOW - OUTPUT_RESERVE - 3_000  # 177K: compact even with the breaker open
MAX_COMPACT_FAILURES = 3    # failed compactions in a row before auto-compact stops trying
KEEP_TAIL_TOKENS = 10_000   # a compaction keeps the newest messages verbatim up to this...
KEEP_TAIL_MESSAGES = 5      # ...or this many messages, whichever is reached first
REATTACH_FILES = 5          # recently read files re-read into the history after a compaction
REATTACH_CHARS = 20_000     # characters per re-attached file (~5K tokens)
SUMMARY_MAX_TOKENS = 16_000  # output tokens for the summary; fits in OUTPUT_RESERVE

SUMMARY_PROMPT = """\
Do NOT call any tool. Reply with plain text only.

Write a detailed summary of the conversation so far; the work will continue from \
your summary alone, so keep every fact needed to carry on.

First, inside <analysis> tags, go through the conversation in order: what the user \
asked for, what you did and found, the files and code involved, the errors and how \
they were fixed. This is your draft; it will be thrown away.

Then write the summary inside <summary> tags, with these 9 sections:
1. Primary request and intent: what the user really wants, in detail.
2. Key technical concepts: the technologies, ideas and decisions discussed.
3. Files and code sections: each file read, changed or created, why it matters, \
and the key code snippets verbatim.
4. Errors and fixes: each error met and how it was fixed, with the user's feedback.
5. Problem solving: how problems were approached and what was solved.
6. All user messages: every message the user wrote that is not a tool result, \
quoted verbatim; they carry the intent most precisely.
7. Pending tasks: everything asked for that is not done yet.
8. Current work: exactly what was being done right before this summary, with file \
names and code. Make this section the most detailed.
9. Possible next step: the next step, in line with the user's latest request; quote \
the latest messages so it is clear where the work stopped.

Only the <summary> block is kept. Remember: plain text only, no tool calls."""


def tail_start(messages):
    """Index of the first message kept verbatim; everything before is summarised
    (0: nothing to summarise)."""
    start, tokens = len(messages), 0
    while start > 1 and len(messages) - start < KEEP_TAIL_MESSAGES and tokens < KEEP_TAIL_TOKENS:
        start -= 1
        tokens += estimate_tokens(shown(messages[start]))
    if start == len(messages):
        return 0  # one message (or none): it is the tail itself
    while start > 0 and tool_results([messages[start]]):
        start -= 1  # take the assistant message that made the calls too
    return start


class SummaryFailed(Exception):
    """The summary call failed (API error, cut stream, empty summary): nothing was compacted."""


def summarize(client, older, focus=None, options=None):
    """One streamed call with the 9-section prompt; only the <summary> block is kept.

    The API wants tools defined whenever the history holds tool blocks, so the
    same (cached) tools go along, with tool_choice none: none can be called.
    Streamed (the SDK refuses long non-streamed calls for some models) but not
    printed, and billed like any call. Too long even for that, or no room left
    for the summary: drop the oldest fifth of the turns and try again. Only the
    call's own failures become SummaryFailed; a bug anywhere else propagates.
    """
    prompt = SUMMARY_PROMPT + (f"\n\nPay special attention to: {focus}" if focus else "")
    model, system, tools = loop_prefix(options)
    for attempt in range(MAX_COMPACT_FAILURES):
        request = shown_messages(older + [{"role": "user", "content": prompt}])
        try:
            with client.messages.stream(model=model, max_tokens=SUMMARY_MAX_TOKENS,
                                        system=cached(system), tools=cached(tools),
                                        tool_choice={"type": "none"}, messages=request) as stream:
                reply = stream.get_final_message()
            break
        except Exception as e:
            if not is_api_failure(e):
                raise
            too_big = is_prompt_too_long(e) or context_room(e) is not None
            if not too_big or attempt + 1 == MAX_COMPACT_FAILURES:
                raise SummaryFailed(str(e)) from e
            older = older[max(1, len(older) // 5):]
    say(f"[summary written | {charge(reply, (options or {}).get('usage'))}]")
    text = "".join(b.text for b in reply.content if b.type == "text")
    found = re.search(r"<summary>(.*?)(?:</summary>|$)", text, re.S)
    summary = (found[1] if found else re.sub(r"<analysis>.*?</analysis>", "", text, flags=re.S)).strip()
    if not summary:
        raise SummaryFailed("the model returned an empty summary")
    return summary


def reattach_files(messages, start):
    """Re-read (fresh from disk) up to REATTACH_FILES files read before the cut."""
    in_tail = {b["input"].get("path") for m in messages[start:] for b in as_blocks(m["content"])
               if b["type"] == "tool_use"}
    paths = [b["input"].get("path") for m in reversed(messages[:start]) for b in
             reversed(as_blocks(m["content"])) if b["type"] == "tool_use" and b["name"] == "read_file"]
    blocks = []
    for p in dict.fromkeys(p for p in paths if isinstance(p, str) and p not in in_tail):
        try:
            text = clip(read_file(p), REATTACH_CHARS)
        except ToolError:
            continue  # deleted or moved since: the summary still names it
        blocks.append({"type": "text", "text": f"Re-read after compaction (current content) "
                       f"of {p}:\n{text}"})
        if len(blocks) == REATTACH_FILES:
            break
    return blocks


def compact(client, messages, focus=None, why="auto", options=None):
    """Replace the old part of the history, in place, by a summary; True if done.
    `options`: the loop's call_model keywords (a child summarises with its own prefix)."""
    state, start = agent_state().compaction, tail_start(messages)
    if start == 0:
        say("[nothing to compact yet]")
        return False
    path = save_transcript(messages)
    say(f"[compacting ({why}): summarising {start} messages]")
    try:
        summary = summarize(client, messages[:start], focus, options)
    except SummaryFailed as e:
        state["failures"] += 1
        say(f"[compaction failed ({state['failures']}/{MAX_COMPACT_FAILURES} in a row): {e}]")
        return False
    saved = (f"The full transcript is saved in {rel(path)}; read it if you need an exact detail."
             if path else "The full transcript could not be saved: this summary is all there is.")
    head = [{"type": "text", "text": (
        f"This session continues from an earlier conversation that was compacted to free "
        f"context. {saved}\n\n<summary>\n{summary}\n</summary>")}] + reattach_files(messages, start)
    tail = messages[start:]
    for m in tail:
        m.pop("_usage", None)  # sizes measured before the cut mean nothing now
    fit_tail(tail)
    messages[:] = [{"role": "user", "content": head}] + tail
    state["failures"] = 0
    say(f"[compacted ({why}): {start} messages summarised, {len(tail)} kept verbatim, "
        f"{f'transcript in {rel(path)}' if path else 'transcript not saved'}]")
    return True


# --- s06.6: prompt caching [core] ---
# Prompt caching. The prefix order is tools -> system -> messages. Breakpoints
# (at most 4): end of tools, end of system, the message the previous request
# ended with (its cache entry is read back) and the newest one (written for the
# next request). They go on copies, never into TOOLS or the history.
# Three functions shape what the API sees, each calling the one before:
#   normalize_messages (s02)  roles alternate, every call has its result
#   shown_messages     (s06)  cleared results as placeholders, then normalised
#   request_messages   (s06)  shown_messages plus the cache breakpoints
EPHEMERAL = {"type": "ephemeral"}  # the only cache_control type there is


def cached(prefix):
    """A copy of the system prompt or the tool list with a breakpoint at its end."""
    if isinstance(prefix, str):
        return [{"type": "text", "text": prefix, "cache_control": EPHEMERAL}]
    return prefix[:-1] + [{**prefix[-1], "cache_control": EPHEMERAL}] if prefix else prefix


def request_messages(messages):
    out = shown_view(messages)  # its older messages are the agent's view, kept: marked on copies
    for i in (-1, -3)[:(len(out) + 1) // 2]:  # newest message, and the previous request's last one
        *blocks, last = out[i]["content"]
        out[i] = {**out[i], "content": blocks + [{**last, "cache_control": EPHEMERAL}]}
    return out


# --- s06.7: many results of one step, together [hardening: skip on first read] ---
# Stops: the results of one step together overflowing the request, each under the per-result cap
# Test: tests/test_s06_recovery.py::test_many_parallel_reads_together_fit_the_message_budget
# The loop hands each step's results to persist_large_results: largest first,
# they go to disk until the message fits MESSAGE_BUDGET_CHARS.
MESSAGE_BUDGET_CHARS = 90_000  # results of one message together, read_file's too; largest go first
PERSIST_EXEMPT = ("read_file",)  # never saved (reading the saved copy would be cut again): over
                            # the budget they become a note to read the file again in parts


def leave_out(block, args):
    """A read_file result over the message budget: a note to read it again in parts.
    The file no longer counts as read: the model has not seen it."""
    path, size = args.get("path", "the file"), len(block["content"])
    block["content"] = (
        f"[read_file output of {path} ({size:,} characters) left out: the results of this "
        f"step together passed {MESSAGE_BUDGET_CHARS:,} characters. Read it again in smaller "
        f"parts (offset/limit), or fewer files at a time.]")
    with contextlib.suppress(ToolError, TypeError):
        agent_state().files.pop(str(safe_path(path)), None)
    say(f"[read_file output of {path} ({size:,} characters) left out: too much in one message]")


def fit_results(results, calls):
    """Shrink one message's results, largest first, until together they fit
    MESSAGE_BUDGET_CHARS: first to disk (nothing is lost), then read_file's,
    which are never saved, as a note. A result moves only when that at least
    halves it. calls: tool_use id -> (tool name, input)."""
    live = [b for b in results if isinstance(b.get("content"), str) and not b.get("_cleared")]
    def total():
        return sum(len(b["content"]) for b in live)
    for reads in (False, True):
        for b in sorted(live, key=lambda b: len(b["content"]), reverse=True):
            if total() <= MESSAGE_BUDGET_CHARS:
                return results
            name, args = calls.get(b["tool_use_id"], ("", {}))
            if (name in PERSIST_EXEMPT) == reads and len(b["content"]) > 2 * PREVIEW_CHARS:
                leave_out(b, args) if reads else persist_output(b)
    return results


def persist_large_results(calls, results):
    """The results of one reply's calls (each over PERSIST_CHARS went to disk
    already): many mid-size ones add up, so the message is fitted to its budget."""
    return fit_results(results, {c.id: (c.name, getattr(c, "input", None) or {}) for c in calls})


# --- s06.8: prompt too long: compact, retry the turn [hardening: skip on first read] ---
# Stops: a request the estimate let through (prompt too long) ending the turn
# Test: tests/test_s06_compact.py::test_prompt_too_long_compacts_and_retries_the_same_turn
# call_with_recovery hands every failed call to recover(), which makes the retry
# possible or lets the error end the turn.
def recover(client, messages, error, turn, line, options):
    """After a failed call_model: make the retry possible, or return False (the
    turn ends). No room for the reply: lower max_tokens to what fits (once per
    context, never below MIN_FIT_TOKENS), else compact; prompt too long: compact
    (once); transient: back off (MAX_RETRIES), a cut reply continued by prefill."""
    room = context_room(error)
    lowered = turn["max_tokens"] < MAX_TOKENS  # already: the numbers are not what we thought
    if room is not None and MIN_FIT_TOKENS <= room < MAX_TOKENS and not lowered:
        say(f"[no room for {MAX_TOKENS:,} output tokens: retrying with max_tokens {room:,}]")
        turn["max_tokens"] = room
        return True
    if (room is not None or is_prompt_too_long(error)) and not turn["compacted"]:
        turn["compacted"], turn["max_tokens"] = True, MAX_TOKENS
        why = "prompt too long" if room is None else f"room for only {max(room, 0):,} output tokens"
        return compact_to_retry(client, messages, error, options, why)
    if not is_transient(error) or turn["retries"] >= MAX_RETRIES:
        return False
    line.retrying()
    delay = backoff_delay(turn["retries"], error)
    turn["retries"] += 1
    say(f"[{getattr(error, 'status_code', None) or type(error).__name__}: retry "
        f"{turn['retries']}/{MAX_RETRIES} in {delay:.1f}s]")
    time.sleep(delay)
    return True


def is_prompt_too_long(e):
    return isinstance(e, anthropic.APIStatusError) and (e.status_code == 413 or (
        e.status_code == 400 and re.search(r"prompt is too long", str(e), re.I) is not None))


class PromptTooLarge(Exception):
    """Prompt too long with nothing older to summarise: the newest message alone is."""


def compact_to_retry(client, messages, error, options, why="prompt too long"):
    """Prompt too long (or no room left for the reply): compact so the same turn
    can be retried; True if done. With nothing older than the newest message,
    the prompt itself is too big."""
    if tail_start(messages) == 0:
        if messages and messages[-1]["role"] == "user" and not tool_results(messages[-1:]):
            messages.pop()  # never accepted: kept, it would fail every later turn too
        raise PromptTooLarge("the prompt itself is too large for the context window and was "
                             "not kept: shorten it, or save the long part to a file and ask "
                             "for it to be read") from error
    say(f"[{why}: compacting, then retrying the turn]")
    return compact(client, messages, None, why, options)


# --- s06.9: no room left for the reply [hardening: skip on first read] ---
# Stops: a request whose prompt fits but whose max_tokens does not, refused on every retry
# Test: tests/test_s06_recovery.py::test_no_room_for_max_tokens_retries_with_max_tokens_lowered_to_fit
# recover() reads the room left from the API's error and lowers max_tokens to it.
MIN_FIT_TOKENS = 3_000      # output tokens: with less room left than this, compact instead of
                            # lowering max_tokens (a reply that small is mostly continuations)


def context_room(e):
    """Output tokens that would fit, read from the API's other context error, a 400
    "input length and `max_tokens` exceed context limit: 195112 + 8000 > 200000"
    (the prompt fits, the reply would not); None for any other error."""
    if not (isinstance(e, anthropic.APIStatusError) and e.status_code == 400):
        return None
    found = re.search(r"input length and `?max_tokens`? exceed context limit: (\d+) \+ \d+ > (\d+)",
                      str(e))
    return int(found[2]) - int(found[1]) if found else None


# --- s06.10: a stream cut mid-reply, continued [hardening: skip on first read] ---
# Stops: a reply cut mid-stream printed twice, or its first part lost, when the call is retried
# Test: tests/test_s06_recovery.py::test_a_cut_reply_is_continued_by_prefill_so_stdout_holds_one_reply
# call_with_recovery prints the reply through a LineWatch, which remembers what
# was printed, so a retry continues it by prefill.
class LineWatch:
    """Stands in for call_model's `out` (None: stdout) and remembers what it printed
    of the reply being written, so a stream cut mid-reply is continued where it
    stopped (the API completes an assistant prefill) instead of printed twice.

    `reply`: text printed by earlier attempts that were cut; `attempt`: the current
    one's; `blocks`: the kinds of block it began (reply_text reports them). Only
    an all-text reply can be a prefill: not a half-made tool call, not with
    thinking on. `echo`: whitespace the prefill dropped (the API refuses it at the
    end) that the continuation will send again; printed once, not twice.
    """

    def __init__(self, out):
        self.out, self.open = out, False
        self.reset()

    def reset(self):
        """A new reply: nothing of it printed yet."""
        self.reply = self.attempt = self.echo = ""
        self.blocks, self.skipped = [], 0  # skipped: characters of `echo` not printed again

    def write(self, text):
        if self.echo:
            same = len(os.path.commonprefix([self.echo, text]))
            self.echo = self.echo[same:] if same == len(text) else ""
            self.skipped, text = self.skipped + same, text[same:]
        self.attempt += text
        self.open = not text.endswith("\n") if text else self.open
        show_text(text, self.out)  # s06: the terminal's rule holds under the watch too
        return len(text)

    def flush(self):
        (self.out or sys.stdout).flush()

    def close(self):
        """End an unfinished line; True if there was one."""
        was, self.open = self.open, False
        if was:
            print(file=self.out)
        return was

    def prefill(self):
        """The cut reply so far, as the assistant message to continue ([] if none)."""
        kept = self.reply.rstrip()
        return [{"role": "assistant", "content": [{"type": "text", "text": kept}]}] if kept else []

    def retrying(self):
        """Before a retry: an all-text attempt joins the reply to be continued; one
        that began a tool call or thinking ends its line and the reply restarts."""
        if set(self.blocks) <= {"text"}:
            if self.attempt:
                say("[stream cut: continuing the reply where it stopped]")
            self.reply += self.attempt
        else:
            self.close()
            say("[stream cut in a reply that cannot be continued (tool call or thinking): "
                "it starts again on the next line]")
            self.reply = ""
        self.echo = self.reply[len(self.reply.rstrip()):]
        self.attempt, self.blocks, self.skipped = "", [], 0

    def joined(self, message):
        """The finished message, with the text of the cut attempts in front of its
        first text: one reply, exactly as printed. Ends its line (call_model does
        only when this call sent text); resets for the next call."""
        self.close()
        if self.reply:
            first = message.content[0] if message.content else None
            if first is not None and first.type == "text":
                first.text = self.reply + first.text[self.skipped:]
            else:  # the continuation began with a tool call
                kept = anthropic.types.TextBlock(type="text", text=self.reply.rstrip())
                message.content.insert(0, kept)
        self.reset()
        return message


def reply_text(stream, out):
    """stream.text_stream, also telling a LineWatch `out` each block that begins."""
    for event in stream:
        if event.type == "content_block_start" and isinstance(out, LineWatch):
            out.blocks.append(event.content_block.type)
        elif event.type == "content_block_delta" and event.delta.type == "text_delta":
            yield event.delta.text


# --- s06.11: a kept tail too big on its own [hardening: skip on first read] ---
# Stops: a compaction whose kept tail alone overflows the window, failing every later request
# Test: tests/test_s06_recovery.py::test_a_kept_tail_too_big_on_its_own_is_shrunk_the_same_way
# compact() fits the messages it keeps as the loop fits new results.
def fit_tail(tail):
    """A tail too big on its own (a message of many results, kept because it is
    the newest) would fail every later request: each of its messages of results
    is fitted to MESSAGE_BUDGET_CHARS as the loop does for new ones."""
    for prev, m in zip(tail, tail[1:]):
        if prev["role"] == "assistant" and tool_results([m]):
            calls = {b["id"]: (b["name"], b["input"]) for b in as_blocks(prev["content"])
                     if b["type"] == "tool_use"}
            fit_results([b for b in m["content"] if b["type"] == "tool_result"], calls)


# --- s06.12: a paste larger than the window [hardening: skip on first read] ---
# Stops: a pasted prompt too big to send failing its turn and every turn after it
# Test: tests/test_s06_paste.py::test_a_paste_larger_than_the_window_leaves_the_session_working
PERSIST_PROMPT_BYTES = CONTEXT_WINDOW // 4 * 4  # UTF-8 bytes of a prompt's text past which it goes
                            # to disk: a quarter of the window at ~4 a token (200K); bytes, as
                            # text that is not ASCII costs more tokens a character


# A paste is a big result the human brings. Kept whole, one larger than the window
# failed its turn (the older turns were summarised away, the paste kept, the retry
# refused again) and every turn after it, each new prompt joining the failed one.
# So a prompt's text over PERSIST_PROMPT_BYTES is saved as a result is, once, before
# its first request. The bar is a quarter of the window, not a result's 30K: what
# the human hands over on purpose is sent whole while the session can still hold
# it (after a compaction, summary and re-attached files add ~40K tokens, far from
# AUTO_COMPACT_AT); a longer text is a log or a dump, best read in parts.
def persist_prompt(messages):
    """The prompt about to be sent (the newest message, a user's): each of its texts
    over PERSIST_PROMPT_BYTES goes to disk; the model gets a preview and the path."""
    last = messages[-1] if messages else {}
    blocks = as_blocks(last["content"]) if last.get("role") == "user" else []
    big = [b.get("type") == "text" and len(b["text"].encode("utf-8", "replace")) > PERSIST_PROMPT_BYTES
           for b in blocks]
    if any(big):
        blocks = [{**b, "text": persist_text(b["text"])} if too_big else b for b, too_big in zip(blocks, big)]
        last["content"] = blocks[0]["text"] if isinstance(last["content"], str) else blocks


def persist_text(text):
    """Save one text of a prompt (named by its content: the same paste, one file);
    returns what the model gets instead: its head, the path and how to read the rest."""
    data = text.encode("utf-8", "replace")  # an argument may carry bytes that are no UTF-8
    path = (agent_state().workdir / ".agent" / "tool-results"
            / f"prompt-{hashlib.sha256(data).hexdigest()[:16]}.txt")
    lines, preview = text.count("\n") + 1, preview_of(text)
    try:
        save_scratch(path, data)
    except OSError as e:
        say(f"[{len(text):,} characters of the prompt could not be saved to {rel(path)} "
            f"({e.strerror or e}): too long to send whole, the model gets the first {len(preview):,} only]")
        return (f"{preview}\n[The user's message is too long to send whole ({len(text):,} characters) "
                f"and it could not be saved to disk ({e.strerror or e}): only the first "
                f"{len(preview):,} characters are shown. Ask the user for the part that matters.]")
    say(f"[{len(text):,} characters of the prompt saved to {rel(path)}: too long to send whole, "
        f"the model gets a {len(preview):,}-character preview and the path]")
    return (f"<persisted-prompt>\nThe user's message is too long to send whole ({len(text):,} "
            f"characters, {lines:,} line{'s' * (lines > 1)}). Full text saved to: {rel(path)}\n"
            f"Read it with read_file in parts (offset/limit) or search it with grep; what the user "
            f"asks may come after the preview. read_file cuts lines at {MAX_LINE:,} characters; grep "
            f"(output_mode content) or bash (cut -c, head -c) reach the rest of a longer line.\n\n"
            f"Preview (first {len(preview):,} characters):\n{preview}\n</persisted-prompt>")


# --- s06.13: the agent's scratch files, through the door [hardening: skip on first read] ---
# Stops: a link planted in .agent/ by a cloned repository, written through when a result is saved
# Test: tests/test_s06_compact.py::test_a_planted_gitignore_link_in_the_results_folder_is_not_written_through
# persist_output saves through save_scratch.
def open_inside(path, root, flags, mode=0o644):
    """os.open a file the agent keeps below root (its folders made when missing),
    through s02's door: open_folder walks every folder with O_NOFOLLOW, and the file
    is opened so too. OSError when one is a link, so nothing is written elsewhere,
    even if a link is swapped in meanwhile (a cloned repository may plant one)."""
    if not path.is_relative_to(root):
        raise OSError(f"{path} is outside {root}")
    fd = open_folder(path.parent)
    try:
        return os.open(path.name, flags | os.O_NOFOLLOW, mode, dir_fd=fd)
    finally:
        os.close(fd)


def keep_out_of_git(folder):
    """A .gitignore of "*" in folder (absolute, resolved), made once through the door:
    O_EXCL leaves a file or a planted link already there alone (even one pointing
    nowhere), and a link on the way to it is an OSError, never written through."""
    with contextlib.suppress(FileExistsError):
        with open(open_inside(folder / ".gitignore", folder, os.O_WRONLY | os.O_CREAT | os.O_EXCL), "w") as fh:
            fh.write("*\n")


def save_scratch(path, data):
    """Bytes to a file of .agent/tool-results through the door (never through a link
    a cloned repository planted in .agent/), the folder kept out of git: the agent's
    scratch, not a project file. OSError is the caller's to report."""
    keep_out_of_git(path.parent)
    with open(open_inside(path, agent_state().workdir, os.O_WRONLY | os.O_CREAT | os.O_TRUNC), "wb") as f:
        f.write(data)


# --- s06.14: a cleared result kept on disk [hardening: skip on first read] ---
# Stops: a placeholder whose way back, a rerun, gives another result (a command with effects, a subagent, an MCP call)
# Test: tests/test_s06_floor.py::test_a_cleared_result_is_kept_in_the_file_its_placeholder_names
# clear_old_results clears only what keep_cleared could save; cleared_stub and
# persist_output name the file through kept_path.
def kept_path(block):
    """The file of a result's full text: layer 1's, and keep_cleared's (one per call)."""
    name = re.sub(r"[^\w-]", "_", block["tool_use_id"])
    return agent_state().workdir / ".agent" / "tool-results" / f"{name}.txt"


def keep_cleared(block):
    """Save a result about to be cleared, unless layer 1 already did. A rerun is no way
    back for a command with effects, a subagent or an MCP call. False when it cannot be
    saved (a read-only workspace): then it is not cleared, and compaction keeps the
    window."""
    content = block.get("content")
    if str(content).startswith("<persisted-output>"):
        return True
    text = content if isinstance(content, str) else json.dumps(content, ensure_ascii=False)
    try:
        save_scratch(kept_path(block), text.encode("utf-8", "replace"))
    except OSError:
        return False
    return True


# --- s06.15: the view: each message made once [hardening: skip on first read] ---
# Stops: a turn's CPU growing with the history: the whole view made again three times a call
# Test: tests/test_history_cache.py::test_a_model_call_remakes_the_newest_messages_only

# The loop wants the view three times a model call (its size before the call,
# the request, its size after) and the history's results twice (to mark them
# sent, to look for a batch to clear), and a turn changes only the end: made
# from the whole history each time, they were most of a turn's CPU by turn 500
# (tests/bench_full.py). So each agent keeps its history as last shown
# (state.view) and makes again only what may have changed: what the history's
# newest message (the one results join) touches, and all from the first
# message that is no longer the one it saw in its place. The messages are
# compared as one list of objects, at C speed: looking into each of 2,000
# messages (or copying the list) cost ~1.5 ms a call, as each is a cache miss
# by then. So an older message changed in place goes unseen, and only two
# places do that: a later chapter puts reminders in front of the first
# message's content (that one is checked), and clear_old_results marks results
# cleared (it starts the view again). Any other code that changes an older
# message in place must start the view again too (agent_state().view = new_view()).
def new_view():
    """An empty view: state.view until the agent's first request."""
    return {"messages": [], "first": None, "done": [], "next": [], "sizes": [], "size": 0,
            "tail": [], "sent": 0, "settled": 0}


def view_mark(m):
    return m["role"], m["content"], len(m["content"])


def unchanged(view, messages):
    """How many leading messages are still the ones the view was made from;
    view["messages"] becomes a copy of messages, changing only what differs."""
    old, n = view["messages"], min(len(view["messages"]), len(messages))
    if n and view_mark(messages[0]) != view["first"]:
        n = 0
    del old[n:]
    old += messages[n:]
    if old != messages:  # one compare at C speed: it looks at no message that did not move
        n = next(i for i in range(n) if old[i] is not messages[i])
        old[n:] = messages[n:]
    view["first"] = view_mark(messages[0]) if messages else None
    return n


def json_size(obj):
    return len(json.dumps(obj, ensure_ascii=False, default=str))  # estimate_tokens' measure


def with_results(prev, m):
    """m, paired as normalize_messages pairs it with the message before it."""
    if m["role"] == "user":
        m["content"] = pair_results(prev, m["content"])
    return m


def update_view(messages):
    """The agent's view brought up to date with messages: its messages made from
    history messages before the first that may have changed are kept ("done",
    shared with later calls: never change them), and normalize_messages' steps
    make the rest ("tail"). Where no agent runs (a helper thread), the view is one
    of its own, kept by nobody."""
    view = agent_state().view if CURRENT.get(None) else new_view()
    same = min(unchanged(view, messages), max(len(messages) - 1, 0))  # the newest may change
    keep = len(view["next"])  # in place; done[j] holds while messages[:next[j] + 1] do
    while keep and view["next"][keep - 1] >= same:
        keep -= 1
    view["size"] -= sum(view["sizes"][keep:])
    for key in ("done", "next", "sizes"):
        del view[key][keep:]
    view["sent"] = min(view["sent"], same)  # messages counted by after_call and by
    view["settled"] = min(view["settled"], same)  # clear_old_results hold what they did
    done, now = view["done"], None  # now: the view's newest message, which may still grow
    for i in range(view["next"][-1] if keep else 0, len(messages)):
        role, blocks = messages[i]["role"], api_blocks(shown(messages[i]))
        if now and blocks and now["role"] == role:
            now["content"] += blocks
        elif blocks:
            if now or (not done and role == "assistant"):  # the one before is whole now
                done.append(with_results(done[-1] if done else None, now) if now
                            else normalize_messages([])[0])  # "(continuing)" opens the view
                view["next"].append(i)
                view["sizes"].append(json_size(done[-1]))
                view["size"] += view["sizes"][-1]
            now = {"role": role, "content": blocks}
    tail = [now] if now else [] if done else normalize_messages([])  # nothing at all: "(continuing)"
    if now and now["role"] == "assistant" and any(b["type"] == "tool_use" for b in now["content"]):
        tail.append({"role": "user", "content": []})  # its calls' placeholders, paired below
    prev = done[-1] if done else None
    for m in tail:
        prev = with_results(prev, m)
    view["tail"] = tail
    return view


def shown_view(messages):
    """shown_messages(messages), from the agent's view (update_view)."""
    view = update_view(messages)
    return view["done"] + view["tail"]


def view_tokens(messages):
    """estimate_tokens(shown_messages(messages)), from the agent's view (update_view)."""
    view = update_view(messages)
    size = view["size"] + sum(map(json_size, view["tail"]))  # a list's JSON: its items, ", "
    return (size + 2 * (len(view["done"]) + len(view["tail"]))) // 4  # between them, "[" and "]"


# --- s06.16: compaction on request: the compact tool and /compact [extra] ---
# The model asks with the compact tool (manage_context runs it before the next
# request); the human types /compact [focus].
def request_compaction(focus=None):
    agent_state().compaction.update(requested=True, focus=focus)
    return "Compaction scheduled: the history is summarised before your next step."


register("compact", (
    "Summarise the conversation so far and continue from the summary, which frees "
    "context. Use it when a phase of work is done and the details of earlier steps are "
    "no longer needed, or when the user asks for it. Pass focus to name what the summary "
    "must keep in detail. Do not use it in the middle of an edit: older tool output is "
    "gone afterwards (recent messages stay verbatim, the transcript is saved on disk)."),
    params([], focus=("string", "What the summary should preserve in detail (optional).")),
    request_compaction, read_only=True)


def compact_now(client, messages, focus=None):
    """/compact [focus]: compact at once, whatever the size and the breaker say.

    Mutates `messages` in place (the caller's list stays the history) and
    returns it. Ctrl+C cancels the compaction, not the session.
    """
    try:
        compact(client, messages, focus, "requested")
    except KeyboardInterrupt:
        say("[compaction cancelled]")
    return messages


command("compact", "Summarise the conversation now to free context (optional focus)",
        lambda args, ctx: compact_now(ctx["client"], ctx["history"], args or None) and None,
        arg_hint="[focus]")


# --- s06.17: transient errors: back off and retry [extra] ---
# Overload, rate limits, 5xx and lost connections are worth waiting for:
# recover() backs off (exponential, with jitter; a server's retry-after wins)
# at most MAX_RETRIES times.
MAX_RETRIES = 4             # our retries of a transient error, after the SDK's own
RETRY_BASE_DELAY = 1.0      # seconds before the first retry; doubles each time
RETRY_MAX_DELAY = 30.0      # seconds: cap on a backoff and on a server's retry-after
RETRY_JITTER = 0.25         # share of a backoff that is random, so clients spread out
RETRY_STATUSES = (408, 409, 429)  # plus every 5xx (529 = overloaded)


def is_transient(e):
    """Worth waiting for: rate limits, overload, 5xx, lost connections, cut streams."""
    if isinstance(e, anthropic.APIStatusError):
        return e.status_code in RETRY_STATUSES or e.status_code >= 500 or "overloaded" in str(e)
    # A stream cut mid-reply raises the HTTP library's own TransportError, not an
    # SDK error; matching the class name works whichever httpx the SDK ships.
    return isinstance(e, (anthropic.APIConnectionError, ConnectionError, TimeoutError)) or any(
        c.__name__ == "TransportError" for c in type(e).__mro__)


def backoff_delay(attempt, error):
    """Exponential backoff with jitter; a server's retry-after wins when it gives one."""
    headers = getattr(getattr(error, "response", None), "headers", None) or {}
    try:
        delay = float(headers.get("retry-after"))
    except (TypeError, ValueError):
        delay = RETRY_BASE_DELAY * 2 ** attempt * (1 - RETRY_JITTER * random.random())
    return min(max(delay, 0.0), RETRY_MAX_DELAY)


# --- s06.18: a reply cut by max_tokens, continued [extra] ---
# call_with_recovery asks the model to continue, at most MAX_CONTINUATIONS
# times; whole_reply joins the parts.
MAX_CONTINUATIONS = 3       # "continue" prompts after max_tokens stops, per model call

CONTINUE_PROMPT = ("Your reply hit the output token limit. Continue exactly where it "
                   "stopped: no apology, no recap. Split the remaining work into smaller steps.")


def whole_reply(messages):
    """The final reply with the parts max_tokens cut before it: the text of every
    assistant message after the last user message that is not a continue
    prompt ("" when the history ends with a user message)."""
    parts = []
    for m in reversed(messages):
        if m["role"] == "user" and m["content"] != CONTINUE_PROMPT:
            break
        if m["role"] == "assistant":  # continued exactly where it stopped: no separator
            parts.insert(0, "\n".join(b["text"] for b in as_blocks(m["content"]) if b["type"] == "text"))
    return "".join(parts).strip()


# --- s06.19: the bill [extra] ---
# after_call's status line shows each call's cost at list prices: cache reads
# cost a tenth of the input price, cache writes 1.25 times.
PRICE_INPUT = 3.00          # USD per million input tokens (list price, default model)
PRICE_OUTPUT = 15.00        # USD per million output tokens
CACHE_READ_PRICE = 0.10     # x the input price for a token read from the cache
CACHE_WRITE_PRICE = 1.25    # x the input price for a token written to the cache (5 min TTL)


def charge(message, usage=None):
    """One call's bill: its cost joins the session's; with `usage` (a subagent's
    counter) its tokens join that too. Returns the line of numbers to show."""
    u = message.usage
    read, write = u.cache_read_input_tokens or 0, u.cache_creation_input_tokens or 0
    cost = ((u.input_tokens + read * CACHE_READ_PRICE + write * CACHE_WRITE_PRICE) * PRICE_INPUT
            + u.output_tokens * PRICE_OUTPUT) / 1e6
    agent_state().session["cost"] += cost
    add_usage(usage, message)
    return (f"input {u.input_tokens:,}, cache read {read:,}, cache write {write:,}, output "
            f"{u.output_tokens:,} | ~${cost:.4f}, session ~${agent_state().session['cost']:.4f}")

# --- s06.20: the transcript kept before a compaction [extra] ---
# compact() saves the whole history here before the summary replaces it: a
# record for the human of what the summary replaced; the agent never reads it back.
def save_transcript(messages):
    """Everything, before anything is summarised away: one message per JSON line.
    None when the workspace cannot be written: the compaction goes on without it."""
    folder = agent_state().workdir / ".agent" / "transcripts"
    path = folder / f"transcript-{time.strftime('%Y%m%d-%H%M%S')}-{time.time_ns() % 10**9:09d}.jsonl"
    try:  # s02's door: a link a clone plants at .agent or transcripts/ is not followed
        write_inside(path, "".join(json.dumps(m, ensure_ascii=False, default=str) + "\n"
                                   for m in messages).encode("utf-8"))
    except OSError as e:
        say(f"[transcript not saved ({e.strerror or e}): the summary will be all that is left "
            f"of the older messages]")
        return None
    return path


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
    if label := getattr(CURRENT.get(None), "label", ""):  # s04: a subagent's lines carry its name
        text = "\n".join(f"  [{label}] {line}" for line in str(text).split("\n"))  # s04
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
    batch = []  # s02: neighbouring concurrency-safe calls, run together
    for block in calls:
        say(f"> {block.name} {json.dumps(block.input, ensure_ascii=False)[:200]}")
        if is_concurrency_safe(block):  # s02: gather neighbouring safe calls
            batch.append(block)
            continue
        batch = run_parallel(batch, results)  # s02: the gathered ones first
        add_result(run_tool(block), results)
    run_parallel(batch, results)  # s02
    return results


def call_model(client, messages, tools=None, system=None, model=None, out=None, usage=None,  # s04
               max_tokens=MAX_TOKENS):  # s06: lowered when the window has less room left
    """One streamed model call; text is printed the moment it arrives."""
    tools = TOOLS if tools is None else tools  # s04: None = the main agent's
    model, system = model or model_id(), system or system_prompt()  # s04: None = the main agent's
    with client.messages.stream(model=model, max_tokens=max_tokens, system=cached(system),  # s06: cache
                                tools=cached(tools), messages=request_messages(messages)) as stream:  # s06
        for text in reply_text(stream, out):  # s06: out learns which blocks began
            show_text(text, out)  # s04: a child's text goes to stderr
        message = stream.get_final_message()
    if any(b.type == "text" for b in message.content):
        show_text("\n", out)  # s04
    add_usage(usage, message)  # s04: a child's token bill
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


def agent_loop(client, messages, tools=None, max_turns=None, **settings):  # s04: for a child
    """Run model and tools until the model stops asking; return the stop reason.

    Invariant: on return, `messages` is a valid history (every tool_use has
    its tool_result), so the next user prompt can simply be appended.
    """
    unknown = 0
    try:
        prepare_agent_tool(client, messages, tools)  # s04: the agent tool needs this loop
        persist_prompt(messages)  # s06: a prompt's huge paste goes to disk before it is sent
        for _ in range(max_turns or turn_limit()):  # s04: a child has its own cap
            message = call_with_recovery(client, messages, tools=tools, **settings)  # s06: recovery
            messages.append(assistant_message(message))
            calls = [b for b in message.content if b.type == "tool_use"]
            if not calls:
                if not messages[-1]["content"]:
                    messages.pop()  # an empty reply adds nothing the API would accept
                return "end_turn"
            results = []  # in the history before any call runs: Ctrl+C keeps what finished
            messages.append({"role": "user", "content": results})
            run_allowed(calls, tools, results)  # s04
            persist_large_results(calls, results)  # s06: the message's results fit a budget
            results += plan_reminder(calls, results)  # s03: plan nudge
            for block in calls:
                unknown = unknown + 1 if block.name not in allowed_names(tools) else 0  # s04
            if unknown >= MAX_UNKNOWN_TOOLS:
                say(f"[stopped: {MAX_UNKNOWN_TOOLS} unknown-tool calls in a row]")
                return "unknown_tools"
        say(f"[stopped: {max_turns or turn_limit()} turns without finishing]")  # s04
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
        if line.startswith("/"):  # s05: slash commands run here or become the prompt
            line = handle_slash(line, {"client": client, "history": history}) or ""
        if line.strip():
            add_user_text(history, line)
            agent_loop(client, history)


def no_key_message():
    demo = os.path.relpath(Path(__file__).parent / "tests" / "demo.py")
    return NO_KEY_HELP.format(demo=demo, chapter=CHAPTER)


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    client = make_client()
    if client is None and not (argv and argv[0].startswith("/")):  # s05: /help needs no key
        print(no_key_message(), file=sys.stderr)
        return 2
    try:
        turn_limit()
    except ValueError as e:
        print(e, file=sys.stderr)
        return 2
    CURRENT.set(AgentState(Path.cwd()))  # the session's agent works on the current directory
    if argv and argv[0].startswith("/"):  # s05: one slash command, then exit
        return run_slash_once(client, " ".join(argv))
    if argv:
        history = [{"role": "user", "content": " ".join(argv)}]
        return 0 if agent_loop(client, history) == "end_turn" else 1
    return repl(client, f"{CHAPTER} >> ")


if __name__ == "__main__":
    sys.exit(main())
