#!/usr/bin/env python3
"""s02_tools.py - a tool system: registry, file tools, path sandbox, parallel reads.

New since s01: register, TOOL_FLAGS, check_input, safe_path, read_file,
write_file, edit_file, write_inside (the one door for the agent's writes: no
link followed, no gap between check and use), glob_files, grep (ripgrep or
Python), walk_files, glob_regex, normalize_messages, run_parallel.

    model reply: [read_file a, read_file b, grep x, edit_file a]
        |  each call: check_input (its schema), then its handler by name
    run_tools: batch neighbours that are concurrency-safe
        [read a | read b | grep x]  -> threads, results kept in call order
        [edit a]                    -> alone (writes never overlap)
        |
    every file tool: safe_path() resolves symlinks, refuses paths outside
    edit_file: old_string unique + file read first and unchanged since
        |
        v  results join the history; normalize_messages(history) makes the
           next request one the API accepts, whatever happened

Run:
    python s02_tools.py                   # REPL, prompt "s02 >> "
    python s02_tools.py "task"            # one task, then exit
    python tests/demo.py s02 --show-requests   # offline, no key: scripted model

Try:
    find the TODOs and fix the one in app.py
                        (the demo runs this one, plus a read of /etc/passwd
                        that the path sandbox refuses)
    find every TODO in this project and list them by file        (real model)
    write notes.md with three typos, then fix each with edit_file
                        (real model; watch the read-before-edit rule)

Key insight: adding a tool never touches the loop. A tool is a schema the model
reads, a handler the loop calls, and flags that say how it may be scheduled.
"""

# --- imports ---
import contextlib
import contextvars
import json
import os
import re
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
        self.files = {}  # s02: resolved path -> (mtime_ns, size) when last read or written


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
        if problem := check_input(block.name, block.input):  # s02: schema check first
            raise ToolError(f"Invalid input for {block.name}: {problem}. Fix the call and retry.")
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
    f = safe_path(path)
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


def call_model(client, messages):
    """One streamed model call; text is printed the moment it arrives."""
    with client.messages.stream(model=model_id(), max_tokens=MAX_TOKENS, system=system_prompt(),
                                tools=TOOLS, messages=normalize_messages(messages)) as stream:
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
