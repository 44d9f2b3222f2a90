"""agent_full's event stream (full.1) and headless modes (full.2).

main() runs in this process as `python agent_full.py -p ...` would, against the
scripted API; the json and stream-json outputs are held against JSON schemas of
Claude Code's shapes. The exit status and the bytes on stdout are the process's:
a few runs check them in a subprocess.
"""
import io
import json
import os
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest

from conftest import message_bodies, run_chapter, run_turn
from fake_api import error, reply, tool

pytestmark = pytest.mark.parametrize("mod", ["agent_full"], indirect=True)
ROOT = Path(__file__).resolve().parents[1]

# --- the shapes -----------------------------------------------------------------------------

USAGE = {"type": "object", "required": ["input_tokens", "output_tokens", "cache_creation_input_tokens",
                                         "cache_read_input_tokens"],
         "properties": {k: {"type": "integer", "minimum": 0} for k in
                        ("input_tokens", "output_tokens", "cache_creation_input_tokens", "cache_read_input_tokens")}}
SESSION_ID = {"type": "string", "pattern": r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$"}  # full.7
TAGS = {"parent_tool_use_id": {"type": ["string", "null"]}, "session_id": SESSION_ID, "uuid": {"type": "string"}}

RESULT = {
    "type": "object",
    "required": ["type", "subtype", "is_error", "duration_ms", "num_turns", "session_id",
                 "total_cost_usd", "usage", "modelUsage", "permission_denials", "terminal_reason"],
    "properties": {
        "type": {"const": "result"},
        "subtype": {"enum": ["success", "error_max_turns", "error_during_execution"]},
        "is_error": {"type": "boolean"},
        "duration_ms": {"type": "integer", "minimum": 0},
        "num_turns": {"type": "integer", "minimum": 0},
        "result": {"type": "string"},
        "session_id": SESSION_ID,
        "total_cost_usd": {"type": "number", "minimum": 0},
        "usage": USAGE,
        "modelUsage": {"type": "object"},
        "terminal_reason": {"type": ["string", "null"]},
        "api_error_status": {"type": ["integer", "null"]},
        "permission_denials": {"type": "array", "items": {
            "type": "object", "required": ["tool_name", "tool_use_id", "tool_input"],
            "properties": {"tool_name": {"type": "string"}, "tool_use_id": {"type": "string"},
                           "tool_input": {"type": "object"}}}},
        "errors": {"type": "array", "items": {"type": "string"}, "minItems": 1},
    },
    # as Claude Code's: success has a result (an API error too, with is_error and its
    # status); a failure says what went wrong in errors, and has no result
    "if": {"properties": {"subtype": {"const": "success"}}},
    "then": {"required": ["result", "api_error_status"], "not": {"required": ["errors"]},
             "if": {"properties": {"terminal_reason": {"const": "api_error"}}},
             "then": {"properties": {"is_error": {"const": True}}},
             "else": {"properties": {"is_error": {"const": False}, "api_error_status": {"const": None}}}},
    "else": {"properties": {"is_error": {"const": True}}, "required": ["errors"], "not": {"required": ["result"]}},
}

INIT = {
    "type": "object",
    "required": ["type", "subtype", "cwd", "session_id", "tools", "mcp_servers", "model", "permissionMode",
                 "slash_commands", "uuid"],
    "properties": {
        "type": {"const": "system"}, "subtype": {"const": "init"}, "cwd": {"type": "string"},
        "session_id": SESSION_ID, "model": {"type": "string", "minLength": 1},
        "tools": {"type": "array", "items": {"type": "string"}, "minItems": 1},
        "mcp_servers": {"type": "array", "items": {"type": "object", "required": ["name", "status"]}},
        "permissionMode": {"enum": ["default", "acceptEdits", "plan", "bypassPermissions"]},
        "slash_commands": {"type": "array", "items": {"type": "string"}},
        "uuid": {"type": "string"},
    },
}

BLOCK = {"type": "object", "required": ["type"], "oneOf": [
    {"properties": {"type": {"const": "text"}, "text": {"type": "string"}}, "required": ["text"]},
    {"properties": {"type": {"const": "tool_use"}, "id": {"type": "string"}, "name": {"type": "string"},
                    "input": {"type": "object"}}, "required": ["id", "name", "input"]},
]}

ASSISTANT = {
    "type": "object", "required": ["type", "message", *TAGS],
    "properties": {"type": {"const": "assistant"}, **TAGS, "message": {
        "type": "object", "required": ["id", "type", "role", "model", "content", "stop_reason", "usage"],
        "properties": {"type": {"const": "message"}, "role": {"const": "assistant"},
                       "content": {"type": "array", "items": BLOCK, "minItems": 1},
                       "stop_reason": {"enum": ["end_turn", "tool_use", "max_tokens"]}, "usage": USAGE}}},
}

USER = {
    "type": "object", "required": ["type", "message", *TAGS],
    "properties": {"type": {"const": "user"}, **TAGS, "message": {
        "type": "object", "required": ["role", "content"],
        "properties": {"role": {"const": "user"}, "content": {"type": "array", "minItems": 1, "items": {
            "type": "object", "required": ["type", "tool_use_id", "content", "is_error"],
            "properties": {"type": {"const": "tool_result"}, "is_error": {"type": "boolean"}}}}}}},
}

SCHEMAS = {"system": INIT, "assistant": ASSISTANT, "user": USER, "result": RESULT}


def valid(obj):
    """The object against the schema of its type; returns it."""
    assert obj.get("type") in SCHEMAS, obj
    jsonschema.validate(obj, SCHEMAS[obj["type"]])
    return obj


def json_lines(out):
    """stdout as JSON lines: every line one object, nothing else."""
    return [valid(json.loads(line)) for line in out.splitlines()]


# --- running it -----------------------------------------------------------------------------

def run_main(mod, api, monkeypatch, *argv, mode="bypassPermissions"):
    """main() in this process, as `python agent_full.py ARGV` would run it. The flags that
    set the process's environment (--max-turns, --model) are undone after the test."""
    monkeypatch.setenv("ANTHROPIC_API_KEY", "test")
    monkeypatch.setenv("ANTHROPIC_BASE_URL", api.url)
    monkeypatch.setenv("AGENT_PERMISSION_MODE", mode)
    for var in ("AGENT_MAX_TURNS", "MODEL_ID"):
        monkeypatch.setenv(var, "x")
        monkeypatch.delenv(var)
    return mod.main(list(argv))


def headless(mod, api, monkeypatch, capsys, *argv, **kw):
    """(exit status, stdout, stderr) of one -p run."""
    capsys.readouterr()
    status = run_main(mod, api, monkeypatch, "-p", *argv, **kw)
    out, err = capsys.readouterr()
    return status, out, err


def sent_texts(body):
    return [b["text"] for m in body["messages"]
            for b in ([{"type": "text", "text": m["content"]}] if isinstance(m["content"], str) else m["content"])
            if b.get("type") == "text" and not b["text"].startswith("<system-reminder>")]


# --- full.1: events -------------------------------------------------------------------------

class Recorder:
    """A front end that keeps every event, and answers questions as told."""

    def __init__(self, answer=None):
        self.events, self.answer = [], answer

    def handle(self, event):
        self.events.append(event)
        return self.answer if event["kind"] == "question" else None

    def kinds(self, label=""):
        return [e["kind"] for e in self.events if e["label"] == label]

    def of(self, kind):
        return [e for e in self.events if e["kind"] == kind]


def test_a_turn_is_told_as_typed_events_and_nothing_is_printed(mod, api, client, workspace, capsys):
    seen = mod.FRONT_END["current"] = Recorder()
    (workspace / "notes.txt").write_text("alpha\n")
    history = run_turn(mod, api, client, [reply("Reading.", tool("read_file", {"path": "notes.txt"}, id="toolu_r1"))])
    assert capsys.readouterr() == ("", "")                        # the front end shows all, or nothing
    kinds = [k for k in seen.kinds() if k != "text"]
    assert kinds == ["reply", "status", "tool_start", "notice", "tool_end", "reply", "status"]
    assert seen.of("notice")[0]["text"].startswith("  allowed (mode): ")   # the layer that allowed it
    assert "".join(e["text"] for e in seen.of("text")) == "Reading.\nFinished.\n"
    start, end = seen.of("tool_start")[0], seen.of("tool_end")[0]
    assert (start["id"], start["name"], start["input"]) == ("toolu_r1", "read_file", {"path": "notes.txt"})
    assert end["id"] == "toolu_r1" and not end["is_error"] and "alpha" in end["content"]
    first = seen.of("reply")[0]
    assert first["content"] == history[1]["content"] and first["stop_reason"] == "tool_use"
    status = seen.of("status")[-1]
    assert status["text"].startswith("[context ") and status["mode"] == "bypassPermissions"
    assert status["cost"] > 0 and status["window"] == mod.CONTEXT_WINDOW
    assert set(status["usage"]) == set(mod.USAGE_KEYS)


def test_a_subagent_events_carry_its_label(mod, api, client, workspace):
    seen = mod.FRONT_END["current"] = Recorder()
    run_turn(mod, api, client, [reply(tool("agent", {"prompt": "look around", "description": "scout"})),
                                reply("The child's words.")])
    child = [e for e in seen.events if e["label"] == "scout"]
    assert "".join(e["text"] for e in child if e["kind"] == "text") == "The child's words.\n"
    assert {"reply", "status"} <= {e["kind"] for e in child}
    assert "The child's words." not in "".join(e["text"] for e in seen.of("text") if not e["label"])


def test_the_plain_front_end_prints_what_the_chapters_printed(mod, api, client, workspace, capsys):
    run_turn(mod, api, client, [reply("Look.", tool("bash", {"command": "echo hi"})),
                                reply(tool("agent", {"prompt": "go", "description": "kid"})), reply("kid done")])
    out, err = capsys.readouterr()
    assert out == "Look.\nFinished.\n"                            # stdout: only the answer
    lines = err.splitlines()
    assert '> bash {"command": "echo hi"}' in lines and "  hi" in lines
    assert any(line.startswith("  [kid] [context ") for line in lines)   # a child's lines carry its name
    assert "kid done\n" in err                                    # and its words are progress, on stderr


def test_a_question_goes_to_the_front_end_and_its_answer_counts(mod, api, client, workspace):
    mod.agent_state().mode = "default"
    seen = mod.FRONT_END["current"] = Recorder(answer="y")
    run_turn(mod, api, client, [reply(tool("write_file", {"path": "a.txt", "content": "A"}))])
    assert (workspace / "a.txt").read_text() == "A"
    assert "Allow write_file?" in seen.of("question")[0]["text"] and not seen.of("denial")
    seen.answer = "n"
    run_turn(mod, api, client, [reply(tool("write_file", {"path": "b.txt", "content": "B"}, id="toolu_b"))])
    assert not (workspace / "b.txt").exists()
    [denial] = seen.of("denial")
    assert (denial["id"], denial["name"], denial["layer"]) == ("toolu_b", "write_file", "the user")


# --- full.2: headless, in Claude Code's shapes ------------------------------------------------

def test_json_prints_one_result_object_and_progress_goes_to_stderr(mod, api, monkeypatch, capsys, workspace):
    api.script([reply("Looking.", tool("bash", {"command": "echo hi > made.txt"})), reply("All done.")])
    status, out, err = headless(mod, api, monkeypatch, capsys, "--output-format", "json", "make a file")
    assert status == 0, err
    [result] = json_lines(out)
    assert (result["subtype"], result["is_error"], result["result"]) == ("success", False, "All done.")
    assert result["num_turns"] == 2 and result["permission_denials"] == []
    assert result["session_id"] == mod.agent_state().record["path"].stem
    bodies = message_bodies(api)
    assert result["usage"]["output_tokens"] > 0 and result["total_cost_usd"] > 0
    assert len(bodies) == 2 and (workspace / "made.txt").read_text() == "hi\n"  # the tool call ran
    assert '> bash {"command": "echo hi > made.txt"}' in err and "[context " in err


def test_stream_json_streams_init_messages_and_the_result(mod, api, monkeypatch, capsys, workspace):
    api.script([reply("Looking.", tool("bash", {"command": "echo hi"}, id="toolu_s1")), reply("It says hi.")])
    status, out, err = headless(mod, api, monkeypatch, capsys, "--output-format", "stream-json", "--verbose",
                                "what does echo say")
    assert status == 0, err
    lines = json_lines(out)
    assert [line["type"] for line in lines] == ["system", "assistant", "user", "assistant", "result"]
    init, call, result, answer, end = lines
    assert init["cwd"] == str(workspace) and "bash" in init["tools"] and init["permissionMode"] == "bypassPermissions"
    assert len({line["session_id"] for line in lines}) == 1
    assert call["message"]["content"][1] == {"type": "tool_use", "id": "toolu_s1", "name": "bash",
                                             "input": {"command": "echo hi"}}
    assert result["message"]["content"][0]["tool_use_id"] == "toolu_s1"
    assert result["message"]["content"][0]["content"] == "hi\n"
    assert answer["message"]["content"] == [{"type": "text", "text": "It says hi."}]
    assert end["result"] == "It says hi." and end["num_turns"] == 2


def test_text_prints_only_the_answer_and_the_prompt_may_come_on_stdin(mod, api, monkeypatch, capsys):
    api.script([reply("Thinking aloud.", tool("bash", {"command": "true"})), reply("The answer.")])
    monkeypatch.setattr(sys, "stdin", io.StringIO("a prompt from stdin\n"))
    status, out, err = headless(mod, api, monkeypatch, capsys)
    assert status == 0, err
    assert out == "The answer.\n"
    assert sent_texts(message_bodies(api)[0]) == ["a prompt from stdin\n"]


def test_continue_and_resume_carry_the_session(mod, api, monkeypatch, capsys, workspace):
    api.script([reply("first answer")])
    first = json_lines(headless(mod, api, monkeypatch, capsys, "--output-format", "json", "the first prompt")[1])[0]
    api.script([reply("second answer")])
    status, out, _ = headless(mod, api, monkeypatch, capsys, "--output-format", "json", "--continue", "next")
    second = json_lines(out)[0]
    assert status == 0 and second["session_id"] == first["session_id"] and second["result"] == "second answer"
    assert sent_texts(message_bodies(api)[-1]) == ["the first prompt", "first answer", "next"]
    api.script([reply("other answer")])
    headless(mod, api, monkeypatch, capsys, "--output-format", "json", "another session")
    api.script([reply("third answer")])
    status, out, _ = headless(mod, api, monkeypatch, capsys, "--output-format", "json",
                              "--resume", first["session_id"], "again")
    third = json_lines(out)[0]
    assert status == 0 and third["session_id"] == first["session_id"]
    assert sent_texts(message_bodies(api)[-1]) == ["the first prompt", "first answer", "next", "second answer",
                                                  "again"]


def test_max_turns_ends_with_error_max_turns_and_exit_1(mod, api, monkeypatch, capsys):
    api.script([reply(tool("bash", {"command": f"echo {i}"})) for i in range(3)])
    status, out, err = headless(mod, api, monkeypatch, capsys, "--output-format", "json", "--max-turns", "2",
                                "loop forever")
    [result] = json_lines(out)
    assert status == 1 and (result["subtype"], result["is_error"], result["num_turns"]) == ("error_max_turns", True, 3)
    assert result["terminal_reason"] == "max_turns" and "result" not in result  # the CLI counts the turn it refused
    assert len(message_bodies(api)) == 2 and "[stopped: 2 turns without finishing]" in err


def test_a_subagent_failure_is_not_the_run_failure(mod, api, monkeypatch, capsys):
    api.script([reply(tool("agent", {"prompt": "try", "description": "kid"})), error(401, "child key refused"),
                reply(tool("bash", {"command": "true"}))])
    status, out, err = headless(mod, api, monkeypatch, capsys, "--output-format", "json", "--max-turns", "2", "go")
    [result] = json_lines(out)
    assert status == 1 and result["subtype"] == "error_max_turns" and "child key refused" in err
    assert result["errors"] == ["Reached maximum number of turns (2)"]


def test_a_question_is_a_denial_recorded_in_the_result(mod, api, monkeypatch, capsys, workspace):
    api.script([reply(tool("write_file", {"path": "x.txt", "content": "x"}, id="toolu_w")), reply("Could not.")])
    monkeypatch.setattr(sys, "stdin", io.StringIO("y\ny\n"))       # a yes on stdin is the prompt's, not an answer
    status, out, err = headless(mod, api, monkeypatch, capsys, "--output-format", "json", "write x", mode="default")
    [result] = json_lines(out)
    assert status == 0 and not (workspace / "x.txt").exists()
    assert result["permission_denials"] == [{"tool_name": "write_file", "tool_use_id": "toolu_w",
                                             "tool_input": {"path": "x.txt", "content": "x"}}]
    told = message_bodies(api)[1]["messages"][-1]["content"][0]
    assert told["is_error"] and "headless" in told["content"] and "--allowed-tools" in told["content"]
    assert "Allow write_file?" in err and sent_texts(message_bodies(api)[0]) == ["write x\n\ny\ny\n"]


def test_allowed_and_disallowed_tools_are_rules(mod, api, monkeypatch, capsys, workspace):
    api.script([reply(tool("bash", {"command": "echo ok > a.txt"}), tool("write_file", {"path": "b.txt", "content": "b"})),
                reply("done")])
    status, out, _ = headless(mod, api, monkeypatch, capsys, "--output-format", "json",
                              "--allowed-tools", "Bash(echo:*),read_file", "--allowedTools", "write_file(b.txt)",
                              "work", mode="default")
    [result] = json_lines(out)
    assert status == 0 and result["permission_denials"] == []
    assert (workspace / "a.txt").exists() and (workspace / "b.txt").exists()
    api.script([reply(tool("bash", {"command": "git log -1"})), reply("done")])
    status, out, _ = headless(mod, api, monkeypatch, capsys, "--output-format", "json",
                              "--disallowed-tools", "Bash(git log:*) glob", "look")
    [result] = json_lines(out)                                    # bypassPermissions, and still denied
    assert [d["tool_name"] for d in result["permission_denials"]] == ["bash"]


def test_an_api_error_is_claude_codes_api_error_result_and_exit_1(mod, api, monkeypatch, capsys):
    api.script([error(401, "invalid x-api-key")])
    status, out, err = headless(mod, api, monkeypatch, capsys, "--output-format", "stream-json", "hello")
    lines = json_lines(out)
    assert status == 1 and [line["type"] for line in lines] == ["system", "result"]
    result = lines[-1]
    assert (result["subtype"], result["is_error"], result["num_turns"]) == ("success", True, 1)  # as the CLI's
    assert (result["terminal_reason"], result["api_error_status"], result["api_error_type"]) == \
        ("api_error", 401, "authentication_error")
    assert "invalid x-api-key" in result["result"] and "errors" not in result and "[API error:" in err


def test_model_and_append_system_prompt_reach_the_request(mod, api, monkeypatch, capsys):
    api.script([reply("ok")])
    status, out, _ = headless(mod, api, monkeypatch, capsys, "--model", "claude-other-1",
                              "--append-system-prompt", "Always answer in French.", "hi")
    body = message_bodies(api)[0]
    assert status == 0 and out == "ok\n" and body["model"] == "claude-other-1"
    assert "".join(b["text"] for b in body["system"]).endswith("\n\nAlways answer in French.")


@pytest.mark.parametrize("argv, words", [
    (["-p", "--output-format", "xml", "hi"], "--output-format 'xml'"),
    (["--output-format", "json", "hi"], "works with -p (a headless run) only"),
    (["-p", "--bogus", "hi"], "unknown flag --bogus"),
    (["-p", "--max-turns", "0", "hi"], "--max-turns must be a whole number"),
    (["-p", "--allowed-tools", "bash(", "hi"], "--allowed-tools:"),
    (["-p", "--model"], "--model needs a value"),
    (["-p"], "-p needs a prompt"),
    (["-p", "--input-format", "stream-json"], "--input-format stream-json needs --output-format stream-json"),
    (["--input-format", "xml", "hi"], "--input-format 'xml'"),
])
def test_bad_flags_are_one_line_and_exit_2(mod, api, monkeypatch, capsys, argv, words):
    monkeypatch.setattr(sys, "stdin", io.StringIO(""))
    capsys.readouterr()
    assert run_main(mod, api, monkeypatch, *argv) == 2
    out, err = capsys.readouterr()
    assert out == "" and words in err and "Traceback" not in err and api.requests == []


def test_split_rules_keeps_a_pattern_whole(mod):
    assert mod.split_rules("Bash(git log:*) Read,Grep  mcp__x__y") == ["Bash(git log:*)", "Read", "Grep", "mcp__x__y"]
    assert mod.split_rules("bash(npm run test -- a, b)") == ["bash(npm run test -- a, b)"]


# --- the process: exit status and stdout -------------------------------------------------------

@pytest.mark.e2e("agent_full")
def test_as_a_process_stdout_is_json_only_and_failure_exits_1(mod, api, workspace):
    api.script([reply("Checked.", tool("bash", {"command": "echo x"})), reply("Fine.")])
    r = run_chapter("agent_full", "-p", "--output-format", "stream-json", api=api, cwd=workspace,
                    input="check it\n", env={"HOME": str(workspace.parent / "home")})
    assert r.returncode == 0, r.stderr
    assert [line["type"] for line in json_lines(r.stdout)] == ["system", "assistant", "user", "assistant", "result"]
    assert "[context " in r.stderr
    api.script([error(400, "bad request here")])
    r = run_chapter("agent_full", "-p", "--output-format", "json", "hello", api=api, cwd=workspace,
                    env={"HOME": str(workspace.parent / "home")})
    assert r.returncode == 1 and json_lines(r.stdout)[0]["api_error_status"] == 400
    assert "Traceback" not in r.stderr


def test_help_lists_every_flag_main_takes_without_a_key(mod, capsys):
    assert mod.main(["--help"]) == 0
    out = capsys.readouterr().out
    for flag in ("-p", "--output-format", "--max-turns", "--model", "--permission-mode", "--allowed-tools",
                 "--disallowed-tools", "--append-system-prompt", "--continue", "--resume", "--worktree",
                 "--trust-workspace", "tests/demo.py agent"):
        assert flag in out, flag


@pytest.mark.e2e("agent_full")
def test_the_no_key_line_names_a_demo_that_runs(mod, tmp_path):
    """agent_full's no-key line says `python tests/demo.py agent`: that demo exists and passes."""
    done = run_chapter("agent_full", cwd=tmp_path)
    assert done.returncode == 2 and "demo.py agent" in done.stderr
    demo = subprocess.run([sys.executable, str(ROOT / "tests" / "demo.py"), "agent"], capture_output=True,
                          text=True, timeout=300, env={k: v for k, v in os.environ.items() if not k.startswith("ANTHROPIC")})
    assert demo.returncode == 0, demo.stdout[-2000:] + demo.stderr[-2000:]
    assert "demo agent: ok" in demo.stdout
