"""s08: hooks. Real shell and Python hook scripts, a real HTTP receiver, the
loop driven through the scripted API; nothing of the hook engine is faked.

A hook is configured the way the human does it (config files read by
load_permissions) or, for most tests, with read_hooks over the same data, so
each test states its hooks next to what it checks.
"""
import copy
import http.server
import io
import json
import os
import shlex
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest
import yaml

from conftest import chapters_from, message_bodies, run_chapter, run_turn
from fake_api import error, reply, text, tool

each = pytest.mark.parametrize("mod", chapters_from("s08"), indirect=True)
PY = shlex.quote(sys.executable)

# A hook that appends what it got (argv, the JSON on stdin, a few variables, the
# transcript it was pointed at) to calls.jsonl in its working directory.
RECORD = """\
import json, os, pathlib, sys
payload = json.load(sys.stdin)
transcript = pathlib.Path(payload.get("transcript_path", ""))
env = {k: os.environ.get(k) for k in ("FILE_PATH", "TOOL_NAME", "EVENT", "TOOL_ARGS_PATH",
                                      "TOOL_ARGS_COMMAND", "ANTHROPIC_API_KEY", "CLAUDE_PROJECT_DIR")}
with open("calls.jsonl", "a", encoding="utf-8") as f:
    f.write(json.dumps({"label": sys.argv[1], "argv": sys.argv[2:], "stdin": payload, "env": env,
                        "transcript": transcript.read_text() if transcript.is_file() else None}) + "\\n")
"""


# --- helpers ----------------------------------------------------------------------

def hook(event, command=None, cond=None, **fields):
    """A hooks: entry; a string command becomes a command action."""
    item = {"event": event, "action": fields.pop("action", None) or {"type": "command", "command": command}}
    if cond is not None:
        item["if"] = cond
    return item | fields


def use_hooks(mod, *items, scope="user", file="config.yaml"):
    """Hooks as if read from a trusted config file."""
    state = mod.agent_state()
    state.permissions["hooks"] = mod.read_hooks(file, {"hooks": list(items)}, scope, True)
    return state


def script(folder, name, body):
    """A hook script file under folder/.agent/hooks; the command that runs it."""
    path = Path(folder) / ".agent" / "hooks" / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(body))
    runner = PY if name.endswith(".py") else "bash"
    return f"{runner} {shlex.quote(str(path))}"


def recorder(workspace, label):
    return f"{script(workspace, 'record.py', RECORD)} {label}"


def calls(workspace, label=None):
    path = workspace / "calls.jsonl"
    rows = [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []
    return [r for r in rows if label is None or r["label"] == label]


def emit(data):
    """A command that prints data as JSON and exits 0."""
    return f"printf '%s' {shlex.quote(json.dumps(data))}"


def pre(**spec):
    return emit({"hookSpecificOutput": {"hookEventName": "PreToolUse", **spec}})


def hooks_log(workspace):
    path = workspace / ".agent" / "hooks.log"
    return path.read_text() if path.exists() else ""


def results(body):
    """The tool_result blocks of a request's last message."""
    return [b for b in body["messages"][-1]["content"] if b.get("type") == "tool_result"]


def texts(content):
    return [b["text"] for b in (content if isinstance(content, list) else [text(content)])
            if b.get("type") == "text"]


def answers(monkeypatch, *lines):
    """The human's answers, read from stdin in order; then end of input."""
    monkeypatch.setattr(sys, "stdin", io.StringIO("".join(line + "\n" for line in lines)))


def write_config(path, data):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(data))


def asking(mod, mode="default"):
    """The chapter's own permission layer, without the OS sandbox (it would allow bash)."""
    state = mod.agent_state()
    state.mode = mode
    state.permissions["sandbox"]["enabled"] = False
    return state


def written(path, wait=10):
    """A file's text once it has some: `echo $! > f` makes the file before it writes."""
    deadline = time.monotonic() + wait
    while not (path.exists() and path.read_text().strip()):
        assert time.monotonic() < deadline, f"{path.name} was never written"
        time.sleep(0.02)
    return path.read_text()


def gone(pid):
    """A process that no longer exists, or only as a zombie nobody reaped yet."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return True
    return stat.rsplit(")", 1)[1].split()[0] in ("Z", "X")


# --- a real HTTP receiver ---------------------------------------------------------

class Receiver:
    """Records each POST (path, headers, body); replies with status and JSON. With
    hold set, a reply waits for hold (3 s at most) before it is sent."""

    def __init__(self):
        self.posts, self.status, self.answer = [], 200, {}
        self.hold, self.got, self.replied = None, threading.Event(), threading.Event()
        receiver = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self):
                raw = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                receiver.posts.append({"path": self.path, "headers": dict(self.headers.items()),
                                       "raw": raw.decode(), "body": json.loads(raw or b"null")})
                receiver.got.set()
                if receiver.hold is not None:
                    receiver.hold.wait(60)               # the fixture lets go at the end
                data = json.dumps(receiver.answer).encode()
                receiver.replied.set()                   # before the bytes: the client may be quicker
                self.send_response(receiver.status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads, self.server.block_on_close = True, False
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


@pytest.fixture
def receiver():
    r = Receiver()
    yield r
    if r.hold is not None:
        r.hold.set()
    r.server.shutdown()
    r.server.server_close()


# --- conditions and variables -----------------------------------------------------

@each
def test_parse_condition_reads_each_operator_and_the_joiner(mod):
    assert mod.parse_condition('tool == "bash"') == ("&&", [("tool", "==", "bash")])
    assert mod.parse_condition("tool == Write") == ("&&", [("tool", "==", "write_file")])   # Claude Code's name
    assert mod.parse_condition("tool == 'WriteFile'")[1][0][2] == "write_file"              # the seed's name
    assert mod.parse_condition('event != "stop" || prompt == "a b"') == (
        "||", [("event", "!=", "stop"), ("prompt", "==", "a b")])
    joiner, [(field, op, rx)] = mod.parse_condition(r'args.command =~ "^git\\s"')
    assert (joiner, field, op) == ("&&", "args.command", "=~") and rx.search("git push")
    assert mod.parse_condition('prompt == "a && b"')[1][0][2] == "a && b"                  # quoted text is text


def applies(mod, cond, **args):
    h = {"cond": mod.parse_condition(cond)}
    return mod.hook_applies(h, {"event": "pre_tool_use", "tool_name": "write_file", "tool_input": args},
                            mod.agent_state())


@each
def test_globs_star_stays_in_a_folder_and_double_star_crosses(mod, workspace):
    assert applies(mod, 'args.path ~= "src/*.py"', path="src/a.py")
    assert not applies(mod, 'args.path ~= "src/*.py"', path="src/sub/a.py")
    assert applies(mod, 'args.path ~= "src/**/*.py"', path="src/sub/deep/a.py")
    assert applies(mod, 'args.path ~= "src/**/*.py"', path="src/a.py")
    assert applies(mod, 'args.path ~= "src/*.py"', path=str(mod.agent_state().workdir / "src" / "a.py"))
    assert applies(mod, 'args.path ~= "*.lock"', path="deep/dir/yarn.lock")      # no /: the name, any depth
    assert not applies(mod, 'args.path ~= "*.lock"', path="yarn.lock.bak")
    assert not applies(mod, 'args.path ~= "src/*.py"', path="lib/src/a.py")


@each
def test_joined_clauses_and_the_other_operators(mod, workspace):
    both = 'tool == "write_file" && args.path ~= "*.lock"'
    assert applies(mod, both, path="a.lock") and not applies(mod, both, path="a.txt")
    either = 'args.path ~= "*.lock" || args.path =~ "^gen/"'
    assert applies(mod, either, path="gen/x.py") and applies(mod, either, path="b.lock")
    assert not applies(mod, either, path="src/gen/x.py")
    assert applies(mod, 'args.path != "a.txt"', path="b.txt") and not applies(mod, 'args.path != "a.txt"', path="a.txt")
    assert not applies(mod, 'args.mode == "x"', path="a")                       # a missing key is ""


@each
@pytest.mark.parametrize("cond", [
    'tool == "a" && tool == "b" || tool == "c"',     # && and || mixed
    'tool = "bash"',                                  # not an operator
    'tools == "bash"',                                # not a field
    'tool == "bash" junk',
    '&& tool == "bash"',
    'tool ==',
    '',
    'tool == "bash" &&',                              # a dangling joiner
    'args.command =~ "("',                            # a bad regex
    "tool == 'bash",                                  # an unclosed quote is not a shorter value
    'tool == "bash',
])
def test_parse_condition_refuses_bad_input_with_a_value_error(mod, cond):
    with pytest.raises(ValueError):
        mod.parse_condition(cond)


@each
def test_a_backslash_in_double_quotes_is_doubled_or_the_line_says_so(mod):
    assert mod.parse_condition(r"args.path =~ '\.py$'")[1][0][2].pattern == r"\.py$"   # single quotes: as is
    assert mod.parse_condition(r'args.path =~ "\\.py$"')[1][0][2].pattern == r"\.py$"  # double: JSON's rules
    with pytest.raises(ValueError, match="backslash"):
        mod.parse_condition(r'args.path =~ "\.py$"')


@each
def test_quote_vars_quotes_hook_variables_and_nothing_else(mod):
    q = mod.quote_vars
    assert q("lint $FILE_PATH") == 'lint "${FILE_PATH}"'
    assert q("cat $TOOL_ARGS.path") == 'cat "${TOOL_ARGS_PATH}"'          # the seed's spelling
    assert q("echo ${TOOL_ARGS_COMMAND}") == 'echo "${TOOL_ARGS_COMMAND}"'
    assert q('echo "x $FILE_PATH y"') == 'echo "x ${FILE_PATH} y"'         # already in double quotes
    assert q("echo '$FILE_PATH'") == "echo '$FILE_PATH'"                   # single quotes: literal, as in sh
    assert q(r"echo \$FILE_PATH") == r"echo \$FILE_PATH"
    assert q("echo $HOME $PATH_X $FILE_PATHS") == "echo $HOME $PATH_X $FILE_PATHS"   # not hook variables
    assert q("a $EVENT && b $TOOL_NAME") == 'a "${EVENT}" && b "${TOOL_NAME}"'


@each
def test_a_quoted_variable_is_one_word_of_data(mod, workspace):
    nasty = 'a b"; touch pwned; "$(touch pwned2)`touch pwned3`'
    command = mod.quote_vars("printf '[%s]\\n' $FILE_PATH")
    out = subprocess.run(["bash", "-c", command], env={"FILE_PATH": nasty, "PATH": os.environ["PATH"]},
                         cwd=workspace, capture_output=True, text=True).stdout
    assert out == f"[{nasty}]\n" and not list(workspace.glob("pwned*"))


# --- the config ------------------------------------------------------------------

@each
@pytest.mark.parametrize("item,key", [
    ({"event": "post_tool_usee", "action": {"type": "prompt", "message": "x"}}, "did you mean post_tool_use"),
    ({"event": "stop", "if": 'tool == "a" && tool == "b" || tool == "c"',
      "action": {"type": "prompt", "message": "x"}}, "mixes && and ||"),
    ({"event": "pre_tool_use", "async": True, "action": {"type": "command", "command": "true"}}, "async"),
    ({"event": "post_tool_use", "reject": True, "action": {"type": "command", "command": "true"}}, "reject"),
    ({"event": "stop", "iff": "x", "action": {"type": "prompt", "message": "x"}}, "hooks[0].iff"),
    ({"event": "stop", "action": {"type": "shell", "command": "x"}}, "hooks[0].action"),
    ({"event": "stop", "action": {"type": "command", "command": " "}}, "action.command"),
    ({"event": "stop", "action": {"type": "command", "cmd": "x"}}, "action.cmd"),
    ({"event": "stop", "action": {"type": "http", "url": "ftp://x"}}, "action.url"),
    ({"event": "stop", "action": {"type": "http", "url": "http://x", "allowed_env_vars": "A"}}, "allowed_env_vars"),
    ({"event": "stop", "timeout": 0, "action": {"type": "prompt", "message": "x"}}, "timeout"),
    ({"event": "stop", "timeout": 601, "action": {"type": "prompt", "message": "x"}}, "timeout"),
    ({"event": "stop", "once": "yes", "action": {"type": "prompt", "message": "x"}}, "once"),
    ({"event": "stop", "if": 5, "action": {"type": "prompt", "message": "x"}}, "hooks[0].if"),
    ({"event": "stop", "if": 'prompt =~ "("', "action": {"type": "prompt", "message": "x"}}, "hooks[0].if"),
])
def test_a_broken_hook_is_refused_naming_file_and_key(mod, workspace, item, key):
    path = Path.home() / ".agent" / "config.yaml"
    write_config(path, {"hooks": [item]})
    with pytest.raises(mod.ConfigError) as e:
        mod.load_permissions(mod.agent_state().workdir)
    assert str(path) in str(e.value) and key in str(e.value)


@each
def test_hooks_must_be_a_list(mod, workspace):
    write_config(Path.home() / ".agent" / "config.yaml", {"hooks": {"event": "stop"}})
    with pytest.raises(mod.ConfigError, match="hooks must be a list"):
        mod.load_permissions(mod.agent_state().workdir)


MALFORMED = [
    ({"event": "pre_tool_usee", "action": {"type": "command", "command": "true"}}, "did you mean pre_tool_use?"),
    ({"event": "stop", "if": 'tool == "a" && tool == "b" || tool == "c"',
      "action": {"type": "command", "command": "true"}}, "mixes && and ||"),
    ({"event": "pre_tool_use", "async": True, "action": {"type": "command", "command": "true"}}, "hooks[0].async"),
    ({"event": "post_tool_use", "reject": True, "action": {"type": "command", "command": "true"}}, "hooks[0].reject"),
]


@each
@pytest.mark.parametrize("item,words", MALFORMED)
def test_a_malformed_hooks_config_is_one_line_naming_the_problem(mod, workspace, item, words):
    write_config(Path.home() / ".agent" / "config.yaml", {"hooks": [item]})
    with pytest.raises(mod.ConfigError) as e:
        mod.load_permissions(mod.agent_state().workdir)
    assert words in str(e.value) and "config.yaml" in str(e.value) and "\n" not in str(e.value)


@pytest.mark.e2e("s08")
@each
def test_a_malformed_hooks_config_stops_the_start_with_one_line(mod, api, workspace):
    """What the start does with such a config (each case is checked in-process above)."""
    item, words = MALFORMED[0]
    home = workspace.parent / "home"
    write_config(home / ".agent" / "config.yaml", {"hooks": [item]})
    r = run_chapter(mod.__name__, "hi", api=api, cwd=workspace, env={"HOME": str(home)})
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert words in r.stderr and "config.yaml" in r.stderr
    assert not api.requests


# --- tool hooks: lint after write, block before -------------------------------------

@each
def test_a_lint_hook_runs_after_write_file_with_the_path_and_the_payload(mod, api, client, workspace,
                                                                          monkeypatch):
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-never-for-hooks")
    use_hooks(mod, hook("post_tool_use", f"{recorder(workspace, 'lint')} $FILE_PATH",
                        cond='tool == "write_file" && args.path ~= "**/*.py"'))
    write = tool("write_file", {"path": "src/app.py", "content": "import os\n"})
    other = tool("write_file", {"path": "notes.txt", "content": "n"})
    run_turn(mod, api, client, [reply(write, other)])
    [call] = calls(workspace)                                    # the .txt write did not match
    state = mod.agent_state()
    app = str(state.workdir / "src" / "app.py")
    assert call["argv"] == [app] and call["env"]["FILE_PATH"] == app
    p = call["stdin"]
    assert p["hook_event_name"] == "PostToolUse" and p["tool_name"] == "write_file"
    assert p["tool_input"] == write["input"] and p["tool_use_id"] == write["id"]
    assert "Wrote 10 bytes" in p["tool_response"]
    assert p["session_id"] == state.run_id and p["cwd"] == str(state.workdir)
    assert p["permission_mode"] == "bypassPermissions"
    assert "do the work" in call["transcript"]                   # transcript_path: the history as JSONL
    assert call["env"]["ANTHROPIC_API_KEY"] is None              # the agent's key is not the hook's
    assert "post_tool_use user#1 command" in hooks_log(workspace)


@each
def test_a_pre_tool_use_hook_blocks_a_lock_file_and_the_model_hears_why(mod, api, client, workspace):
    use_hooks(mod, hook("pre_tool_use", "echo 'generated: run npm install' >&2; exit 2",
                        cond='tool == "write_file" && args.path ~= "*.lock"'))
    lock = tool("write_file", {"path": "deps/yarn.lock", "content": "x"})
    fine = tool("write_file", {"path": "deps/readme.md", "content": "x"})
    run_turn(mod, api, client, [reply(lock, fine)])
    assert not (workspace / "deps" / "yarn.lock").exists() and (workspace / "deps" / "readme.md").exists()
    blocked, ok = results(message_bodies(api)[1])
    assert blocked["tool_use_id"] == lock["id"] and blocked["is_error"]
    assert "generated: run npm install" in blocked["content"] and not ok.get("is_error")


@each
@pytest.mark.parametrize("command", [
    "echo 'not on main' >&2; exit 2",
    emit({"decision": "block", "reason": "not on main"}),
    pre(permissionDecision="deny", permissionDecisionReason="not on main"),
])
def test_each_way_of_saying_no_blocks(mod, api, client, workspace, command):
    use_hooks(mod, hook("pre_tool_use", command))
    run_turn(mod, api, client, [reply(tool("bash", {"command": "touch made"}))])
    [result] = results(message_bodies(api)[1])
    assert result["is_error"] and "not on main" in result["content"]
    assert not (workspace / "made").exists()


@each
def test_reject_blocks_and_the_later_hooks_do_not_run(mod, api, client, workspace):
    use_hooks(mod, hook("pre_tool_use", "echo 'frozen until Monday'", reject=True),
              hook("pre_tool_use", "touch later-hook-ran"))
    run_turn(mod, api, client, [reply(tool("write_file", {"path": "a.txt", "content": "x"}))])
    [result] = results(message_bodies(api)[1])
    assert result["is_error"] and "frozen until Monday" in result["content"]
    assert not (workspace / "a.txt").exists() and not (workspace / "later-hook-ran").exists()


# --- updatedInput --------------------------------------------------------------------

@each
def test_updated_input_is_the_command_that_runs(mod, api, client, workspace):
    use_hooks(mod, hook("pre_tool_use", pre(updatedInput={"command": "echo rewritten > out.txt"}),
                        cond='tool == "bash"'),
              hook("post_tool_use", recorder(workspace, "after")))
    run_turn(mod, api, client, [reply(tool("bash", {"command": "echo original > out.txt"}))])
    assert (workspace / "out.txt").read_text() == "rewritten\n"
    assert calls(workspace, "after")[0]["stdin"]["tool_input"] == {"command": "echo rewritten > out.txt"}


@each
def test_a_rewrite_into_a_blocklisted_command_is_still_refused(mod, api, client, workspace, monkeypatch):
    ran = []   # if the blocklist ever failed, nothing real runs
    monkeypatch.setitem(mod.TOOL_HANDLERS, "bash", lambda command, timeout=None: ran.append(command) or "ran")
    use_hooks(mod, hook("pre_tool_use", pre(updatedInput={"command": "rm -rf /"})))
    run_turn(mod, api, client, [reply(tool("bash", {"command": "ls"}))])
    [result] = results(message_bodies(api)[1])
    assert result["is_error"] and "blocklist" in result["content"] and ran == []


@each
@pytest.mark.parametrize("updated", [{"command": 42}, {"timeout": 5}, {"command": "ls", "shell": "zsh"}])
def test_an_updated_input_that_breaks_the_schema_blocks_the_call(mod, api, client, workspace, monkeypatch,
                                                                 updated):
    ran = []
    monkeypatch.setitem(mod.TOOL_HANDLERS, "bash", lambda command, timeout=None: ran.append(command) or "ran")
    use_hooks(mod, hook("pre_tool_use", pre(updatedInput=updated)))
    run_turn(mod, api, client, [reply(tool("bash", {"command": "ls"}))])
    [result] = results(message_bodies(api)[1])
    assert result["is_error"] and "rewrote the input badly" in result["content"] and ran == []
    assert "updatedInput refused" in hooks_log(workspace)


# --- permission decisions -----------------------------------------------------------

@pytest.mark.permissions
@each
def test_a_hooks_allow_answers_the_question(mod, api, client, workspace, monkeypatch, capsys):
    asking(mod)
    answers(monkeypatch)                                         # nobody there: a question would say no
    use_hooks(mod, hook("pre_tool_use", pre(permissionDecision="allow", permissionDecisionReason="safe")))
    run_turn(mod, api, client, [reply(tool("bash", {"command": "touch made"}))])
    assert (workspace / "made").exists()
    assert "permission needed" not in capsys.readouterr().err


@pytest.mark.permissions
@each
@pytest.mark.parametrize("call,layer", [
    (tool("bash", {"command": "touch made"}), "rule"),
    (tool("write_file", {"path": ".agent/config.yaml", "content": "hooks: []"}), "protected path"),
    (tool("bash", {"command": "sudo touch made"}), "blocklist"),
])
def test_a_hooks_allow_never_overrides_a_deny(mod, api, client, workspace, monkeypatch, call, layer):
    state = asking(mod)
    answers(monkeypatch, "y")
    state.permissions["rules"] = [mod.parse_rule("bash(touch *)") | {"effect": "deny", "scope": "user",
                                                                    "file": "config.yaml"}]
    use_hooks(mod, hook("pre_tool_use", pre(permissionDecision="allow")))
    run_turn(mod, api, client, [reply(call)])
    [result] = results(message_bodies(api)[1])
    assert result["is_error"] and f"Permission denied ({layer})" in result["content"]
    assert not (workspace / "made").exists() and not (workspace / ".agent" / "config.yaml").exists()


@pytest.mark.permissions
@each
@pytest.mark.parametrize("decisions,outcome", [
    ([], "ran"),
    (["allow"], "ran"),
    (["ask"], "asked"),
    (["allow", "ask"], "asked"),
    (["ask", "allow"], "asked"),
    (["allow", "deny"], "denied"),
    (["deny", "allow"], "denied"),
    (["ask", "deny", "allow"], "denied"),
])
def test_deny_beats_ask_beats_allow(mod, api, client, workspace, monkeypatch, capsys, decisions, outcome):
    asking(mod, "bypassPermissions")                             # no question unless a hook asks one
    answers(monkeypatch, "n")
    use_hooks(mod, *[hook("pre_tool_use", pre(permissionDecision=d, permissionDecisionReason=f"hook says {d}"))
                     for d in decisions])
    run_turn(mod, api, client, [reply(tool("bash", {"command": "touch made"}))])
    [result] = results(message_bodies(api)[1])
    err = capsys.readouterr().err
    assert (workspace / "made").exists() == (outcome == "ran")
    assert ("permission needed: hook says ask" in err) == (outcome == "asked")
    if outcome == "asked":
        assert "the user said no" in result["content"]
    if outcome == "denied":
        assert "Permission denied (hook" in result["content"] and "hook says deny" in result["content"]


@pytest.mark.permissions
@each
@pytest.mark.parametrize("behavior,ran", [("allow", True), ("deny", False)])
def test_a_permission_request_hook_answers_for_the_human(mod, api, client, workspace, monkeypatch, capsys,
                                                         behavior, ran):
    asking(mod)
    answers(monkeypatch, "y")                                    # a question would say yes
    use_hooks(mod, hook("permission_request", f"{recorder(workspace, 'asked')}; " + emit(
        {"hookSpecificOutput": {"hookEventName": "PermissionRequest", "decision": {"behavior": behavior}}})))
    run_turn(mod, api, client, [reply(tool("bash", {"command": "touch made"}))])
    assert (workspace / "made").exists() == ran
    assert "Allow bash?" not in capsys.readouterr().err         # nobody was asked
    assert calls(workspace, "asked")[0]["stdin"]["hook_event_name"] == "PermissionRequest"


# --- the other events -----------------------------------------------------------------

@each
def test_post_hooks_see_failures_and_a_post_block_reaches_the_model(mod, api, client, workspace):
    (workspace / "folder").mkdir()
    use_hooks(mod, hook("post_tool_use", "echo 'the file has 2 lint errors' >&2; exit 2"),
              hook("post_tool_failure", recorder(workspace, "failed")),
              hook("pre_tool_use", "echo 'no' >&2; exit 2", cond='args.path == "denied.txt"'),
              hook("post_tool_failure", recorder(workspace, "failed-denied"), cond='args.path == "denied.txt"'))
    good = tool("write_file", {"path": "a.py", "content": "x"})
    bad = tool("write_file", {"path": "folder", "content": "x"})
    denied = tool("write_file", {"path": "denied.txt", "content": "x"})
    run_turn(mod, api, client, [reply(good, bad, denied)])
    [failure] = calls(workspace, "failed")                       # the denied call never ran: no post hook
    assert failure["stdin"]["tool_use_id"] == bad["id"] and "is a directory" in failure["stdin"]["error"]
    assert failure["stdin"]["hook_event_name"] == "PostToolUseFailure" and not calls(workspace, "failed-denied")
    got = texts(message_bodies(api)[1]["messages"][-1]["content"])
    assert any("<system-reminder>" in t and "the file has 2 lint errors" in t for t in got)


@each
def test_subagent_hooks_fire_for_a_child(mod, api, client, workspace):
    use_hooks(mod, hook("subagent_start", recorder(workspace, "start")),
              hook("subagent_stop", recorder(workspace, "stop")),
              hook("user_prompt_submit", recorder(workspace, "prompt")))
    run_turn(mod, api, client, [reply(tool("agent", {"prompt": "look around", "description": "scout"})),
                                reply("child done")])
    [start], [stop] = calls(workspace, "start"), calls(workspace, "stop")
    assert start["stdin"]["prompt"] == "look around" and start["stdin"]["agent_name"] == "scout"
    assert stop["stdin"]["hook_event_name"] == "SubagentStop"
    assert stop["stdin"]["last_assistant_message"] == "child done"
    assert len(calls(workspace, "prompt")) == 1                  # the child's prompt is not the user's


@each
def test_compact_hooks_fire_around_a_compaction(mod, api, client, workspace):
    use_hooks(mod, hook("pre_compact", recorder(workspace, "pre")), hook("post_compact", recorder(workspace, "post")))
    history = [{"role": "user", "content": "start"}]
    for n in range(6):
        call = tool("bash", {"command": f"echo {n}"})
        history += [{"role": "assistant", "content": [call]},
                    {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call["id"], "content": "x"}]}]
    history.append({"role": "assistant", "content": [text("done")]})
    api.script([reply("<summary>1. Primary request: SUMMARY-TEXT</summary>")])
    mod.compact_now(client, history, "the tests")
    [before], [after] = calls(workspace, "pre"), calls(workspace, "post")
    assert before["stdin"]["trigger"] == "manual" and before["stdin"]["custom_instructions"] == "the tests"
    assert "SUMMARY-TEXT" in after["stdin"]["summary"]


# --- values reach a hook as data ------------------------------------------------------

@each
@pytest.mark.parametrize("name", ['x"; touch pwned; ".txt', "$(touch pwned).txt", "a b `touch pwned`.txt",
                                  "it's; touch pwned.txt"])
def test_a_hostile_file_name_reaches_the_hook_as_one_argument(mod, api, client, workspace, name):
    command = f"{recorder(workspace, 'seen')} $FILE_PATH $TOOL_ARGS.path \"$TOOL_ARGS_PATH\"; echo $FILE_PATH > seen.txt"
    use_hooks(mod, hook("post_tool_use", command))
    run_turn(mod, api, client, [reply(tool("write_file", {"path": name, "content": "x"}))])
    full = str(mod.agent_state().workdir / name)
    assert calls(workspace, "seen")[0]["argv"] == [full, name, name]
    assert (workspace / "seen.txt").read_text() == full + "\n"
    assert not [p for p in workspace.rglob("*") if p.name == "pwned"]


# --- context for the model ------------------------------------------------------------

@each
def test_additional_context_reaches_the_next_request_as_a_reminder(mod, api, client, workspace):
    use_hooks(mod, hook("pre_tool_use", pre(additionalContext="PRE: the lint config is strict")),
              hook("post_tool_use", emit({"hookSpecificOutput": {"hookEventName": "PostToolUse",
                                                                 "additionalContext": "POST: 3 warnings"}})),
              hook("post_tool_use", action={"type": "prompt", "message": "check $FILE_PATH for style"}))
    run_turn(mod, api, client, [reply(tool("write_file", {"path": "a.py", "content": "x"}))])
    first, second = message_bodies(api)
    assert "PRE:" not in json.dumps(first)
    got = texts(second["messages"][-1]["content"])
    path = mod.agent_state().workdir / "a.py"
    assert "<system-reminder>\npre_tool_use hook: PRE: the lint config is strict\n</system-reminder>" in got
    assert any(t.startswith("<system-reminder>") and "POST: 3 warnings" in t for t in got)
    assert any(t.startswith("<system-reminder>") and f"check {path} for style" in t for t in got)


@each
def test_a_prompt_hooks_plain_stdout_is_context_in_the_first_request(mod, api, client, workspace):
    use_hooks(mod, hook("user_prompt_submit", "echo 'branch: main, 2 files changed'"))
    run_turn(mod, api, client, [], prompt="what changed?")
    got = texts(message_bodies(api)[0]["messages"][0]["content"])
    assert got[0] == "what changed?"
    assert any("<system-reminder>" in t and "branch: main, 2 files changed" in t for t in got[1:])


@each
def test_session_start_context_reaches_the_first_request(mod, api, client, workspace):
    use_hooks(mod, hook("session_start", "echo 'today is release day'"))
    mod.begin_session()
    run_turn(mod, api, client, [])
    assert "today is release day" in json.dumps(message_bodies(api)[0]["messages"][0])


# --- async, once, timeout, failures, output size ------------------------------------------

@each
def test_an_async_http_hook_does_not_hold_up_the_turn(mod, api, client, workspace, receiver):
    receiver.hold = threading.Event()                            # the receiver answers only when told
    state = use_hooks(mod, hook("post_tool_use", action={"type": "http", "url": receiver.url}, **{"async": True}))
    run_turn(mod, api, client, [reply(tool("write_file", {"path": "a.txt", "content": "x"}))])
    assert receiver.got.wait(5)
    assert not receiver.replied.is_set()                         # the turn ended before the hook did
    receiver.hold.set()
    for job in state.hooks["jobs"]:
        job.join(5)
    assert receiver.replied.is_set() and receiver.posts[0]["body"]["hook_event_name"] == "PostToolUse"
    assert "post_tool_use user#1 http" in hooks_log(workspace)


@each
def test_once_fires_once_in_a_session(mod, api, client, workspace):
    use_hooks(mod, hook("user_prompt_submit", "echo once >> once.txt", once=True),
              hook("user_prompt_submit", "echo every >> every.txt"))
    run_turn(mod, api, client, [])
    run_turn(mod, api, client, [])
    assert (workspace / "once.txt").read_text() == "once\n" and (workspace / "every.txt").read_text() == "every\n" * 2


@pytest.mark.slow("s08")
@each
def test_a_hook_past_its_timeout_is_killed_with_its_children(mod, api, client, workspace):
    command = script(Path.home(), "slow.sh", "sleep 60 &\necho $! > child.pid\nsleep 30\n")
    use_hooks(mod, hook("pre_tool_use", command.replace(str(Path.home()), "~"), timeout=3))  # time to start
    run_turn(mod, api, client, [reply(tool("write_file", {"path": "a.txt", "content": "x"}))])
    assert (workspace / "a.txt").exists()                        # the call went ahead, the loop went on
    pid = int(written(workspace / "child.pid"))
    deadline = time.monotonic() + 5
    while not gone(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert gone(pid)
    assert "killed: still running after its timeout of 3s" in hooks_log(workspace)


@each
@pytest.mark.parametrize("body,words", [
    ("echo broken >&2; exit 1", "exit status 1: broken"),
    ("printf '{not json'", "not JSON"),
    ("PY", "RuntimeError"),
    (emit({"hookSpecificOutput": {"permissionDecision": "maybe"}}), "permissionDecision 'maybe'"),
])
def test_a_failing_hook_is_logged_and_changes_nothing(mod, api, client, workspace, capsys, body, words):
    if body == "PY":
        body = script(workspace, "crash.py", "raise RuntimeError('hook bug')\n")
    use_hooks(mod, hook("pre_tool_use", body), hook("post_tool_use", body))
    run_turn(mod, api, client, [reply(tool("write_file", {"path": "a.txt", "content": "x"}))])
    assert (workspace / "a.txt").read_text() == "x"
    log = hooks_log(workspace)
    assert "pre_tool_use user#1 command" in log and "post_tool_use user#2 command" in log
    assert "failed" in log and words in log
    assert "failed and was skipped" in capsys.readouterr().err
    assert not results(message_bodies(api)[1])[0].get("is_error")


@each
def test_a_hook_that_prints_without_end_is_stopped(mod, api, client, workspace):
    use_hooks(mod, hook("user_prompt_submit", "yes"),
              hook("user_prompt_submit", "head -c 20000000 /dev/zero | tr '\\0' x"))
    run_turn(mod, api, client, [])
    log = hooks_log(workspace)
    assert "user_prompt_submit user#1 command" in log and "killed: its output passed 8 MB" in log
    assert "user_prompt_submit user#2 command" in log
    assert len(json.dumps(message_bodies(api)[0])) < 50_000      # what reached the model is clipped


@each
def test_a_huge_argument_still_reaches_the_hook(mod, api, client, workspace):
    # One variable over 128 KiB makes exec fail (E2BIG): the variable is cut, stdin has it all.
    content = "x" * 300_000
    use_hooks(mod, hook("post_tool_use", f"printf '%s' \"$TOOL_ARGS_CONTENT\" | wc -c > env.txt; "
                                         f"{recorder(workspace, 'big')}"))
    run_turn(mod, api, client, [reply(tool("write_file", {"path": "a.txt", "content": content}))])
    assert calls(workspace, "big")[0]["stdin"]["tool_input"]["content"] == content
    assert 30_000 < int((workspace / "env.txt").read_text()) < 40_000


@each
def test_the_hooks_log_keeps_one_old_copy(mod, api, client, workspace):
    log = workspace / ".agent" / "hooks.log"
    log.parent.mkdir()
    log.write_text("old line\n" * 150_000)                      # past HOOK_LOG_BYTES
    use_hooks(mod, hook("user_prompt_submit", "true"))
    run_turn(mod, api, client, [])
    assert (workspace / ".agent" / "hooks.log.1").read_text().startswith("old line")
    assert log.read_text().count("\n") == 1 and "user_prompt_submit user#1" in log.read_text()


@each
def test_the_session_end_stops_async_hooks_still_running(mod, api, client, workspace, monkeypatch):
    monkeypatch.setattr(mod, "HOOK_EXIT_WAIT", 0.2)
    state = use_hooks(mod, hook("session_start", "sleep 60 & echo $! > child.pid; sleep 60", **{"async": True}))
    mod.begin_session()
    pid = int(written(workspace / "child.pid"))
    mod.end_session("exit")
    for job in state.hooks["jobs"]:
        job.join(5)
    deadline = time.monotonic() + 5                 # SIGKILL is sent; the kernel ends it a moment later
    while not gone(pid) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert gone(pid) and not any(job.is_alive() for job in state.hooks["jobs"])


@each
def test_an_api_error_fires_the_error_hook(mod, api, client, workspace):
    use_hooks(mod, hook("error", recorder(workspace, "error")))
    api.script([error(400, "scripted refusal")])
    assert mod.agent_loop(client, [{"role": "user", "content": "go"}]) == "api_error"
    [call] = calls(workspace, "error")
    assert call["stdin"]["hook_event_name"] == "Error" and "scripted refusal" in call["stdin"]["error"]


@each
def test_hooks_of_a_parallel_batch_each_reach_the_model(mod, api, client, workspace):
    for name in ("a.txt", "b.txt"):
        (workspace / name).write_text(name)
    use_hooks(mod, hook("post_tool_use", action={"type": "prompt", "message": "read $TOOL_ARGS.path"}),
              hook("pre_tool_use", "exit 2", cond='args.path == "c.txt"'))
    reads = [tool("read_file", {"path": n}) for n in ("a.txt", "b.txt", "c.txt")]
    run_turn(mod, api, client, [reply(*reads)])
    content = message_bodies(api)[1]["messages"][-1]["content"]
    assert [b.get("is_error", False) for b in results({"messages": [{"content": content}]})] == [False, False, True]
    got = texts(content)
    assert any("read a.txt" in t for t in got) and any("read b.txt" in t for t in got)
    assert not any("read c.txt" in t for t in got)


# --- the turn: prompt, stop, continue ---------------------------------------------------

@each
def test_a_blocked_prompt_is_dropped_and_the_history_stays_valid(mod, api, client, workspace, capsys):
    use_hooks(mod, hook("user_prompt_submit", "echo 'no passwords in prompts' >&2; exit 2",
                        cond='prompt =~ "(?i)password"'))
    history = run_turn(mod, api, client, [], prompt="hello")
    before = copy.deepcopy(history)
    capsys.readouterr()
    mod.add_user_text(history, "my password is hunter2")
    assert mod.agent_loop(client, history) == "prompt_blocked"
    assert history == before and len(message_bodies(api)) == 1
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert err == ["[prompt blocked by hook user#1: no passwords in prompts]"]
    mod.add_user_text(history, "go on")
    api.script([reply("ok")])
    assert mod.agent_loop(client, history) == "end_turn"
    assert "hunter2" not in json.dumps(api.requests)


@each
def test_a_blocked_prompt_after_a_failed_turn_keeps_the_tool_results(mod, api, client, workspace):
    use_hooks(mod, hook("user_prompt_submit", "exit 2", cond='prompt == "bad"'))
    call = tool("bash", {"command": "true"})
    history = [{"role": "user", "content": "start"}, {"role": "assistant", "content": [call]},
               {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call["id"], "content": "ok"}]}]
    before = copy.deepcopy(history)
    mod.add_user_text(history, "bad")                          # merged into the results message
    assert mod.agent_loop(client, history) == "prompt_blocked" and history == before
    mod.add_user_text(history, "good")
    api.script([reply("ok")])
    assert mod.agent_loop(client, history) == "end_turn"


@each
def test_a_stop_hook_sends_the_model_back_until_it_lets_go(mod, api, client, workspace, capsys):
    """Each block is one more model call, and every stop hook after the first block
    reads stop_hook_active: true (Claude Code's protocol): this one lets go on its third look."""
    counter = script(workspace, "count.sh", """\
        n=$(( $(cat .agent/stop-count 2>/dev/null || echo 0) + 1 )); echo $n > .agent/stop-count
        [ $n -ge 3 ] || { echo "run the tests first ($n)" >&2; exit 2; }
        """)
    use_hooks(mod, hook("stop", recorder(workspace, "stop")), hook("stop", counter))
    api.script([reply("Done."), reply("Tests run. Done."), reply("Tests pass. Done.")])
    history = [{"role": "user", "content": "fix it"}]
    assert mod.agent_loop(client, history) == "end_turn"
    assert api.remaining() == 0 and api.exhausted == 0           # exactly two extra model calls
    second, third = message_bodies(api)[1:]
    assert any("<system-reminder>" in t and "run the tests first (1)" in t for t in texts(second["messages"][-1]["content"]))
    assert any("run the tests first (2)" in t for t in texts(third["messages"][-1]["content"]))
    assert [c["stdin"]["stop_hook_active"] for c in calls(workspace, "stop")] == [False, True, True]
    assert [c["stdin"]["last_assistant_message"] for c in calls(workspace, "stop")] == \
        ["Done.", "Tests run. Done.", "Tests pass. Done."]
    assert "overruled" not in capsys.readouterr().err
    history.append({"role": "user", "content": "next"})            # a new prompt starts a new count
    (workspace / ".agent" / "stop-count").write_text("5")
    api.script([reply("Next done.")])
    assert mod.agent_loop(client, history) == "end_turn"
    assert calls(workspace, "stop")[-1]["stdin"]["stop_hook_active"] is False


@each
def test_a_stop_hook_that_never_lets_go_is_overruled_at_the_cap(mod, api, client, workspace, capsys):
    use_hooks(mod, hook("stop", "echo 'not yet' >&2; exit 2"))
    cap = mod.STOP_BLOCK_CAP
    api.script([reply(f"Attempt {i}.") for i in range(cap + 1)])
    history = [{"role": "user", "content": "fix it"}]
    assert mod.agent_loop(client, history) == "end_turn"
    assert api.remaining() == 0 and api.exhausted == 0           # the cap's blocks honoured, the next overruled
    err = capsys.readouterr().err
    said = [line for line in err.splitlines() if "overruled" in line]
    assert len(said) == 1 and f"blocked the stop {cap} times in a row" in said[0] and "stop_hook_active" in said[0]
    assert f"blocked the stop {cap} times in a row" in hooks_log(workspace)


@each
def test_a_hook_gets_claude_codes_keys_for_each_event(mod, api, client, workspace):
    """The top-level keys of the JSON on stdin are the ones the real Claude Code CLI
    sends for the event (tests/test_cli_hooks.py holds agent_full to the CLI itself);
    our own event name is not among them."""
    rec = recorder(workspace, "k")
    use_hooks(mod, *[hook(e, rec) for e in ("user_prompt_submit", "pre_tool_use", "post_tool_use",
                                            "post_tool_failure", "stop", "session_start", "session_end")])
    (workspace / "a.txt").write_text("alpha\n")
    mod.begin_session()
    run_turn(mod, api, client, [reply(tool("read_file", {"path": "a.txt"})),
                                reply(tool("read_file", {"path": "missing.txt"}))])
    mod.end_session("exit")
    base = {"session_id", "transcript_path", "cwd", "hook_event_name"}
    turn = base | {"prompt_id", "permission_mode"}
    tool_keys = turn | {"tool_name", "tool_input", "tool_use_id"}
    stop = turn | {"stop_hook_active", "last_assistant_message"}
    stop |= {"background_tasks", "session_crons"} if hasattr(mod, "work_in_flight") else set()  # s10 on
    want = {"SessionStart": base | {"source"}, "UserPromptSubmit": turn | {"prompt"},
            "PreToolUse": tool_keys, "PostToolUse": tool_keys | {"tool_response", "duration_ms"},
            "PostToolUseFailure": tool_keys | {"error", "is_interrupt", "duration_ms"},
            "Stop": stop, "SessionEnd": base | {"prompt_id", "reason"}}
    got = {}
    for c in calls(workspace, "k"):
        got.setdefault(c["stdin"]["hook_event_name"], set(c["stdin"]))
        assert set(c["stdin"]) == got[c["stdin"]["hook_event_name"]]   # the same keys each time
    assert got == want
    ids = {c["stdin"]["prompt_id"] for c in calls(workspace, "k") if "prompt_id" in c["stdin"]}
    assert len(ids) == 1 and all(c["env"]["CLAUDE_PROJECT_DIR"] == str(workspace) for c in calls(workspace, "k"))


@each
def test_continue_false_ends_the_turn(mod, api, client, workspace, capsys):
    use_hooks(mod, hook("post_tool_use", emit({"continue": False, "stopReason": "budget reached"})))
    api.script([reply(tool("write_file", {"path": "a.txt", "content": "x"}))])
    history = [{"role": "user", "content": "go"}]
    assert mod.agent_loop(client, history) == "hook_stop"
    assert api.remaining() == 0 and "turn ended by a hook: budget reached" in capsys.readouterr().err
    mod.add_user_text(history, "carry on")                       # the history is valid for the next prompt
    api.script([reply("ok")])
    assert mod.agent_loop(client, history) == "end_turn"


@each
def test_continue_false_before_a_call_stops_that_call_too(mod, api, client, workspace):
    use_hooks(mod, hook("pre_tool_use", emit({"continue": False, "stopReason": "over budget"}),
                        cond='args.path == "a.txt"'))
    first = tool("write_file", {"path": "a.txt", "content": "x"})
    second = tool("write_file", {"path": "b.txt", "content": "x"})
    api.script([reply(first, second)])
    history = [{"role": "user", "content": "go"}]
    assert mod.agent_loop(client, history) == "hook_stop"
    assert not (workspace / "a.txt").exists() and not (workspace / "b.txt").exists()
    done = [b for b in history[-1]["content"] if b.get("type") == "tool_result"]
    assert [b.get("is_error") for b in done] == [True, True] and "over budget" in done[0]["content"]
    mod.add_user_text(history, "carry on")
    api.script([reply("ok")])
    assert mod.agent_loop(client, history) == "end_turn"


# --- http hooks -----------------------------------------------------------------------

@each
def test_an_http_hook_posts_the_payload_and_only_allowed_variables(mod, api, client, workspace, receiver,
                                                                   monkeypatch):
    monkeypatch.setenv("HOOK_TEST_TOKEN", "tok-123")
    monkeypatch.setenv("HOOK_TEST_SECRET", "s3cret-never-sent")
    receiver.answer = {"decision": "block", "reason": "the policy server says no"}
    use_hooks(mod, hook("pre_tool_use", action={
        "type": "http", "url": receiver.url, "allowed_env_vars": ["HOOK_TEST_TOKEN"],
        "headers": {"Authorization": "Bearer ${HOOK_TEST_TOKEN}", "X-Other": "x${HOOK_TEST_SECRET}"}}))
    call = tool("write_file", {"path": "a.txt", "content": "x"})
    run_turn(mod, api, client, [reply(call)])
    [post] = receiver.posts
    assert post["body"]["hook_event_name"] == "PreToolUse" and post["body"]["tool_input"] == call["input"]
    assert post["headers"]["Authorization"] == "Bearer tok-123" and post["headers"]["X-Other"] == "x"
    assert post["headers"]["Content-Type"] == "application/json"
    assert "s3cret" not in json.dumps(post)
    [result] = results(message_bodies(api)[1])
    assert result["is_error"] and "the policy server says no" in result["content"]
    assert not (workspace / "a.txt").exists()


@each
def test_an_http_error_reply_is_a_logged_failure_not_a_block(mod, api, client, workspace, receiver):
    receiver.status, receiver.answer = 500, {"decision": "block", "reason": "x"}
    use_hooks(mod, hook("pre_tool_use", action={"type": "http", "url": receiver.url}))
    run_turn(mod, api, client, [reply(tool("write_file", {"path": "a.txt", "content": "x"}))])
    assert (workspace / "a.txt").exists() and "500" in hooks_log(workspace)


@each
def test_an_http_body_template_gets_values_as_json_strings(mod, api, client, workspace, receiver):
    use_hooks(mod, hook("post_tool_use", action={
        "type": "http", "url": receiver.url, "body": '{"file": "$FILE_PATH", "text": "$TOOL_ARGS.content"}'}))
    content = 'a "quoted", x\\y\n", "evil": "1'
    run_turn(mod, api, client, [reply(tool("write_file", {"path": "a.txt", "content": content}))])
    assert receiver.posts[0]["body"] == {"file": str(mod.agent_state().workdir / "a.txt"), "text": content}


# --- agent hooks ----------------------------------------------------------------------

@each
def test_an_agent_hook_that_answers_block_blocks(mod, api, client, workspace):
    use_hooks(mod, hook("pre_tool_use", action={"type": "agent", "prompt": "Is writing $FILE_PATH safe?"}))
    call = tool("write_file", {"path": "a.txt", "content": "x"})
    run_turn(mod, api, client, [reply(call), reply("BLOCK: a.txt belongs to another team")])
    hook_request = message_bodies(api)[1]
    assert "Is writing" in json.dumps(hook_request["messages"][0])
    assert {t["name"] for t in hook_request["tools"]} <= {"read_file", "glob", "grep"}
    [result] = results(message_bodies(api)[2])
    assert result["is_error"] and "a.txt belongs to another team" in result["content"]
    assert not (workspace / "a.txt").exists()


# --- config files and trust -------------------------------------------------------------

def load(mod, *lines, monkeypatch, trust_all=False):
    answers(monkeypatch, *lines)
    state = mod.agent_state()
    state.permissions = mod.load_permissions(state.workdir, trust_all)
    state.permissions["sandbox"]["enabled"] = False
    return state


@each
def test_user_project_and_local_hooks_all_run_user_first(mod, api, client, workspace, monkeypatch):
    write_config(Path.home() / ".agent" / "config.yaml", {"hooks": [hook("user_prompt_submit", "echo user >> order.txt")]})
    write_config(workspace / ".agent" / "config.yaml", {"hooks": [hook("user_prompt_submit", "echo project >> order.txt")]})
    write_config(workspace / ".agent" / "config.local.yaml", {"hooks": [hook("user_prompt_submit", "echo local >> order.txt")]})
    load(mod, "y", "y", monkeypatch=monkeypatch)
    run_turn(mod, api, client, [])
    assert (workspace / "order.txt").read_text() == "user\nproject\nlocal\n"


@each
def test_an_untrusted_project_hook_does_not_run(mod, api, client, workspace, monkeypatch, capsys):
    write_config(workspace / ".agent" / "config.yaml", {"hooks": [
        hook("session_start", "touch pwned-start"), hook("user_prompt_submit", "touch pwned-prompt"),
        hook("pre_tool_use", "touch pwned-tool")]})
    load(mod, "n", monkeypatch=monkeypatch)
    mod.begin_session()
    run_turn(mod, api, client, [reply(tool("write_file", {"path": "a.txt", "content": "x"}))])
    mod.end_session("exit")
    assert not list(workspace.glob("pwned*")) and (workspace / "a.txt").exists()
    err = capsys.readouterr().err
    assert "runs 3 hook(s) on your machine" in err and "touch pwned-start" in err     # the question says what
    assert [line for line in err.splitlines() if "hooks" in line and "not trusted" in line] == [
        "[.agent/config.yaml is not trusted: its allow rules, directories, sandbox and wider mode settings "
        "and its hooks are ignored; its deny and ask rules apply]"]                 # one line says so


@each
def test_a_trusted_project_hook_runs_and_an_edit_asks_again(mod, api, client, workspace, monkeypatch, capsys):
    cfg = workspace / ".agent" / "config.yaml"
    write_config(cfg, {"hooks": [hook("user_prompt_submit", "echo first >> ran.txt")]})
    load(mod, "y", monkeypatch=monkeypatch)
    run_turn(mod, api, client, [])
    assert (workspace / "ran.txt").read_text() == "first\n"
    load(mod, monkeypatch=monkeypatch)                            # trusted: nobody needs to be asked
    run_turn(mod, api, client, [])
    assert (workspace / "ran.txt").read_text() == "first\n" * 2
    write_config(cfg, {"hooks": [hook("user_prompt_submit", "echo second >> ran.txt")]})  # the clone changed it
    capsys.readouterr()
    load(mod, monkeypatch=monkeypatch)                            # asked again; end of input says no
    assert "echo second >> ran.txt" in capsys.readouterr().err
    run_turn(mod, api, client, [])
    assert (workspace / "ran.txt").read_text() == "first\n" * 2


@each
def test_end_of_input_skips_project_hooks_but_user_hooks_run(mod, api, client, workspace, monkeypatch):
    write_config(Path.home() / ".agent" / "config.yaml", {"hooks": [hook("user_prompt_submit", "touch user-ran")]})
    write_config(workspace / ".agent" / "config.yaml", {"hooks": [hook("user_prompt_submit", "touch project-ran")]})
    load(mod, monkeypatch=monkeypatch)
    run_turn(mod, api, client, [])
    assert (workspace / "user-ran").exists() and not (workspace / "project-ran").exists()


@pytest.mark.permissions
@each
def test_always_does_not_trust_hooks_a_clone_shipped_in_the_local_file(mod, api, client, workspace, monkeypatch):
    local = workspace / ".agent" / "config.local.yaml"
    write_config(local, {"hooks": [hook("user_prompt_submit", "touch pwned")]})
    state = load(mod, "n", monkeypatch=monkeypatch)
    state.mode = "default"
    monkeypatch.setitem(mod.TOOL_HANDLERS, "bash", lambda command, timeout=None: "ran")
    answers(monkeypatch, "a")                                    # always: a rule goes into that file
    run_turn(mod, api, client, [reply(tool("bash", {"command": "make test"}))])
    assert "bash(make test *)" in local.read_text()
    load(mod, monkeypatch=monkeypatch)
    run_turn(mod, api, client, [])
    assert not (workspace / "pwned").exists()


@each
def test_slash_hooks_lists_each_hook_its_file_and_whether_it_runs(mod, workspace, monkeypatch, capsys):
    user, project = Path.home() / ".agent" / "config.yaml", workspace / ".agent" / "config.yaml"
    write_config(user, {"hooks": [hook("post_tool_use", "ruff check $FILE_PATH", cond='args.path ~= "**/*.py"')]})
    write_config(project, {"hooks": [hook("stop", "make test", once=True)]})
    load(mod, "n", monkeypatch=monkeypatch)
    capsys.readouterr()
    mod.handle_slash("/hooks", {"client": None, "history": []})
    out = capsys.readouterr().out
    assert out.index("user#1") < out.index("project#1")
    user_part, project_part = out.split("project#1")
    assert "runs" in user_part and "ruff check $FILE_PATH" in user_part and str(user) in user_part
    assert "NOT RUN" in project_part and "make test (once)" in project_part and str(project) in project_part


# --- subprocess runs ------------------------------------------------------------------

@pytest.mark.e2e("s08")
@each
def test_the_trust_question_does_not_swallow_a_piped_prompt(mod, api, workspace):
    home = workspace.parent / "home"
    write_config(workspace / ".agent" / "config.yaml", {"hooks": [hook("user_prompt_submit", "touch hook-ran")]})
    api.script([reply("hi there")])
    r = run_chapter(mod.__name__, api=api, cwd=workspace, input="y\nhello\n", env={"HOME": str(home)})
    assert r.returncode == 0, r.stderr
    assert (workspace / "hook-ran").exists()
    [body] = message_bodies(api)
    assert texts(body["messages"][0]["content"])[0] == "hello"


@pytest.mark.e2e("s08")
@each
def test_trust_workspace_runs_project_hooks_from_start_to_end(mod, api, workspace):
    home = workspace.parent / "home"
    write_config(workspace / ".agent" / "config.yaml", {"hooks": [
        hook("session_start", "echo start >> life.txt"), hook("session_end", "echo end >> life.txt")]})
    api.script([reply("hi")])
    r = run_chapter(mod.__name__, "--trust-workspace", "hello", api=api, cwd=workspace, input="",
                    env={"HOME": str(home)})
    assert r.returncode == 0, r.stderr
    assert (workspace / "life.txt").read_text() == "start\nend\n"
    assert "Trust this file" not in r.stderr


@pytest.mark.e2e("s08")
@each
def test_slash_hooks_runs_without_a_key(mod, workspace):
    home = workspace.parent / "home"
    write_config(home / ".agent" / "config.yaml", {"hooks": [hook("stop", "true")]})
    r = run_chapter(mod.__name__, "/hooks", cwd=workspace, input="", env={"HOME": str(home)})
    assert r.returncode == 0, r.stderr
    assert "user#1" in r.stdout and "stop -> command: true" in r.stdout
