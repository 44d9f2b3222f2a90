"""agent_full headless (full.2) and main's flags: regressions from the review of the
front end. Each test fails on the code before its fix. Runs are main() in this
process, as `python agent_full.py -p ...` would run them (test_full_headless's
helpers); the closed-pipe run is a real process.
"""
import io
import json
import os
import subprocess
import sys
import threading

import pytest

from conftest import ROOT, message_bodies
from fake_api import reply, tool
from test_full_headless import headless, json_lines, run_main, sent_texts

pytestmark = pytest.mark.parametrize("mod", ["agent_full"], indirect=True)


def result_of(mod, api, monkeypatch, capsys, *argv, **kw):
    """(exit status, the json result object, stderr) of one -p --output-format json run."""
    status, out, err = headless(mod, api, monkeypatch, capsys, "--output-format", "json", *argv, **kw)
    [result] = json_lines(out)
    return status, result, err


@pytest.fixture
def no_stdin(monkeypatch):
    monkeypatch.setattr(sys, "stdin", io.StringIO(""))


# --- 1: Claude Code command lines are read as Claude Code reads them ------------------------

@pytest.mark.parametrize("argv, words", [
    (["-p", "--dangerously-skip-permissions", "hi"], "unknown flag --dangerously-skip-permissions: use "
                                                    "--permission-mode bypassPermissions"),
    (["-p", "--fast=yes", "hi"], "unknown flag --fast:"),
    (["--bogus", "hi"], "unknown flag --bogus: --help lists the flags"),  # the one-shot prompt too
])
def test_an_unknown_flag_is_one_line_and_exit_2_not_the_prompt(mod, api, monkeypatch, capsys, no_stdin,
                                                                argv, words):
    capsys.readouterr()
    assert run_main(mod, api, monkeypatch, *argv) == 2
    out, err = capsys.readouterr()
    assert out == "" and words in err and "Traceback" not in err and api.requests == []


def test_after_a_double_dash_a_word_that_starts_with_a_dash_is_the_prompt(mod, api, monkeypatch, capsys, no_stdin):
    api.script([reply("ok")])
    status, out, _ = headless(mod, api, monkeypatch, capsys, "--", "-v means verbose: explain")
    assert status == 0 and sent_texts(message_bodies(api)[0]) == ["-v means verbose: explain"]


def test_c_and_r_are_continue_and_resume(mod, api, monkeypatch, capsys, no_stdin):
    api.script([reply("first answer")])
    status, first, _ = result_of(mod, api, monkeypatch, capsys, "the first prompt")
    api.script([reply("second answer")])
    status, second, _ = result_of(mod, api, monkeypatch, capsys, "-c", "next")
    assert status == 0 and second["session_id"] == first["session_id"]
    assert sent_texts(message_bodies(api)[-1]) == ["the first prompt", "first answer", "next"]
    api.script([reply("third answer")])
    status, third, _ = result_of(mod, api, monkeypatch, capsys, "-r", first["session_id"], "again")
    assert status == 0 and third["session_id"] == first["session_id"]
    assert sent_texts(message_bodies(api)[-1])[-1] == "again"


def test_allowed_tools_takes_space_separated_rules_as_claude_code_does(mod, api, monkeypatch, capsys, no_stdin):
    api.script([reply("ok")])
    status, _, _ = result_of(mod, api, monkeypatch, capsys, "summarise the repo", "--allowedTools", "Read",
                             "Grep", "Bash(git log:*)", mode="default")
    assert status == 0 and sent_texts(message_bodies(api)[0]) == ["summarise the repo"]
    cli = [(r["effect"], r["tool"], r["pattern"]) for r in mod.agent_state().permissions["rules"]
           if r["scope"] == "cli"]
    assert cli == [("allow", "read_file", None), ("allow", "grep", None), ("allow", "bash", "git log:*")]


def test_piped_stdin_joins_a_prompt_argument(mod, api, monkeypatch, capsys):
    monkeypatch.setattr(sys, "stdin", io.StringIO("ERROR: disk full\n"))
    api.script([reply("The disk is full.")])
    status, out, _ = headless(mod, api, monkeypatch, capsys, "explain these logs")
    assert status == 0 and out == "The disk is full.\n"
    assert sent_texts(message_bodies(api)[0]) == ["explain these logs\n\nERROR: disk full\n"]


class Terminal(io.StringIO):
    def isatty(self):
        return True

    def read(self, *a):
        raise AssertionError("a -p run never reads a terminal")


def test_an_idle_pipe_or_a_terminal_on_stdin_does_not_hold_up_a_prompt_argument(mod, api, monkeypatch, capsys):
    monkeypatch.setattr(mod, "STDIN_WAIT", 0.1)
    r, w = os.pipe()                                              # the writer stays open and silent
    try:
        with os.fdopen(r) as idle:
            monkeypatch.setattr(sys, "stdin", idle)
            api.script([reply("ok")])
            status, _, err = headless(mod, api, monkeypatch, capsys, "hi")
            assert status == 0 and sent_texts(message_bodies(api)[0]) == ["hi"]
            assert "[stdin: nothing arrived in 0.1 s" in err
    finally:
        os.close(w)
    monkeypatch.setattr(sys, "stdin", Terminal())
    api.script([reply("ok")])
    assert headless(mod, api, monkeypatch, capsys, "hello")[0] == 0
    assert sent_texts(message_bodies(api)[-1]) == ["hello"]


# --- 2: the flags' rules and prompt: counted, and binding the lead's teammates ---------------

def test_the_start_line_counts_the_command_line_rules(mod, api, monkeypatch, capsys, no_stdin):
    api.script([reply("ok")])
    status, _, err = headless(mod, api, monkeypatch, capsys, "--disallowed-tools", "Bash(touch:*) glob", "hi")
    assert status == 0 and "| 2 rule(s); /permissions lists them]" in err


def test_the_leads_rule_and_prompt_flags_bind_a_teammate(mod, api, client, monkeypatch, workspace, capsys):
    lead = mod.agent_state()
    mod.start_front_end(["-p", "--disallowed-tools", "Bash(touch:*)", "--append-system-prompt", "Be brief.", "go"])
    lead.team = {"key": "k"}
    env = mod.teammate_env("mate")                                # what spawn_teammate starts it with
    monkeypatch.setenv(mod.CLI_FLAGS_ENV, env[mod.CLI_FLAGS_ENV])
    capsys.readouterr()
    with mod.acting_as(mod.AgentState(workspace)) as mate:       # the teammate's main(), its argv flagless
        assert mod.start_front_end(["--teammate", "mate", "--team", "t"])[0] == ["--teammate", "mate", "--team", "t"]
        mod.start_permissions([])
        assert mod.CLI_FLAGS_ENV not in os.environ                # its commands never see it
        assert "| 1 rule(s);" in capsys.readouterr().err
        assert mod.appended_prompt() == [("appended", "Be brief.")]
        mate.mode, mate.permissions["sandbox"]["enabled"] = "bypassPermissions", False
        mod.FRONT_END["current"] = mod.PLAIN
        api.script([reply(tool("bash", {"command": "touch PWNED"})), reply("Finished.")])
        assert mod.agent_loop(client, [{"role": "user", "content": "touch it"}]) == "end_turn"
    assert not (workspace / "PWNED").exists()


# --- 3: command-line rules speak Claude Code's tool names -------------------------------------

def test_disallowed_agent_forbids_subagents_in_bypass_mode(mod, api, monkeypatch, capsys, no_stdin):
    api.script([reply(tool("agent", {"prompt": "look", "description": "scout"}, id="toolu_a")), reply("alone")])
    status, result, _ = result_of(mod, api, monkeypatch, capsys, "--disallowedTools", "Agent", "go")
    assert status == 0 and [d["tool_name"] for d in result["permission_denials"]] == ["agent"]
    assert len(message_bodies(api)) == 2                          # no child ever called the model


def test_claude_code_rule_forms_are_accepted_and_a_name_matching_nothing_is_told(mod, api, monkeypatch, capsys,
                                                                                   no_stdin):
    api.script([reply("ok")])
    status, _, err = result_of(mod, api, monkeypatch, capsys, "--allowed-tools", "Skill(commit-message) Agent(explore)",
                               "--allowedTools", "WebFetch", "--disallowedTools", "ToolSearch bsh", "hi")
    assert status == 0, err
    rules = {(r["effect"], r["tool"], r["pattern"]) for r in mod.agent_state().permissions["rules"] if r["scope"] == "cli"}
    assert {("allow", "load_skill", "commit-message"), ("allow", "agent", "explore"),
            ("deny", "tool_search", None)} <= rules
    assert "[--allowed-tools WebFetch: this agent has no such tool; the rule is left out]" in err
    assert "[--disallowed-tools bsh: matches no tool of this agent" in err


# --- 6: the result object has what Claude Code's SDK parsers require -------------------------

def test_the_result_has_duration_api_ms_and_stop_reason(mod, api, monkeypatch, capsys, no_stdin):
    api.script([reply("Looking.", tool("bash", {"command": "true"})), reply("Done.")])
    status, result, _ = result_of(mod, api, monkeypatch, capsys, "go")
    assert status == 0 and isinstance(result["duration_api_ms"], int)
    assert 0 <= result["duration_api_ms"] <= result["duration_ms"] and result["stop_reason"] == "end_turn"
    api.script([reply(tool("bash", {"command": "true"}))])
    status, result, _ = result_of(mod, api, monkeypatch, capsys, "--max-turns", "1", "loop")
    assert status == 1 and result["stop_reason"] == "tool_use"


# --- 7: a hook's session_id is the result's and --resume's ------------------------------------

def test_a_session_start_hook_is_told_the_session_id_the_result_gives(mod, api, monkeypatch, capsys, workspace,
                                                                      no_stdin):
    seen = workspace.parent / "start.json"
    settings = {"hooks": {"SessionStart": [{"hooks": [{"type": "command", "command": f"cat > '{seen}'"}]}]}}
    (workspace.parent / "home" / ".claude").mkdir(parents=True)
    (workspace.parent / "home" / ".claude" / "settings.json").write_text(json.dumps(settings))
    api.script([reply("ok")])
    status, result, _ = result_of(mod, api, monkeypatch, capsys, "hi")
    assert status == 0 and json.loads(seen.read_text())["session_id"] == result["session_id"]


# --- 8: a closed stdout ends the run quietly --------------------------------------------------

@pytest.mark.e2e("agent_full")
def test_a_closed_stdout_pipe_ends_the_run_quietly(mod, api, workspace):
    closed = threading.Event()

    def after_close(body):                                        # the first call waits for the reader to go
        closed.wait(30)
        return reply("Looking.", tool("bash", {"command": "echo 1"}))

    api.script([after_close, reply("more"), reply("done")])
    env = {k: v for k, v in os.environ.items() if not k.startswith("ANTHROPIC") and k != "MODEL_ID"}
    env |= {"ANTHROPIC_API_KEY": "test", "ANTHROPIC_BASE_URL": api.url, "AGENT_AUTO_MEMORY": "0",
            "AGENT_PERMISSION_MODE": "bypassPermissions", "HOME": str(workspace.parent / "home")}
    p = subprocess.Popen([sys.executable, str(ROOT / "agent_full.py"), "-p", "--output-format", "stream-json", "go"],
                         cwd=workspace, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    try:
        assert json.loads(p.stdout.readline())["type"] == "system"   # | head -1
        p.stdout.close()
        closed.set()
        status, err = p.wait(timeout=60), p.stderr.read()
    finally:
        closed.set()
        p.kill() if p.poll() is None else None
        p.stderr.close()
    assert status == 141 and "API error" not in err and "Traceback" not in err and "BrokenPipe" not in err
    assert len(message_bodies(api)) == 1                          # the run stopped there


# --- 12: headless as Claude Code's -p ----------------------------------------------------------

def test_a_model_alias_is_the_configured_model(mod, api, monkeypatch, capsys, no_stdin):
    api.script([reply("ok")])
    status, out, err = headless(mod, api, monkeypatch, capsys, "--model", "sonnet", "hi")
    assert status == 0 and message_bodies(api)[0]["model"] == mod.DEFAULT_MODEL
    assert f"[--model sonnet: an alias here, for the configured model {mod.DEFAULT_MODEL};" in err


def test_a_slash_prompt_runs_the_skill_and_a_local_command_is_the_result(mod, api, monkeypatch, capsys,
                                                                          workspace, no_stdin):
    folder = workspace.parent / "home" / ".agent" / "skills" / "shout"
    folder.mkdir(parents=True)
    (folder / "SKILL.md").write_text("---\nname: shout\ndescription: Shout it.\n---\nSHOUT-BODY about $ARGUMENTS\n")
    api.script([reply("SHOUTED")])
    status, result, _ = result_of(mod, api, monkeypatch, capsys, "/shout the news")
    [prompt] = sent_texts(message_bodies(api)[0])
    assert status == 0 and result["result"] == "SHOUTED"
    assert "SHOUT-BODY about the news" in prompt and not prompt.startswith("/shout")
    status, out, _ = headless(mod, api, monkeypatch, capsys, "--output-format", "json", "/cost")
    [result] = json_lines(out)                                    # its printout is the result, not stdout
    assert status == 0 and result["subtype"] == "success" and result["result"].startswith("session cost ~$")
    assert result["num_turns"] == 0 and len(message_bodies(api)) == 1
    status, out, _ = headless(mod, api, monkeypatch, capsys, "--output-format", "json", "/no-such-command")
    [result] = json_lines(out)
    assert status == 1 and result["is_error"] and "Unknown command /no-such-command" in result["errors"][0]


# --- 13: tests for what the review's mutations broke ------------------------------------------

def test_a_headless_run_leaves_a_widening_settings_file_untrusted(mod, api, monkeypatch, capsys, workspace, no_stdin):
    (workspace / ".claude").mkdir()
    (workspace / ".claude" / "settings.json").write_text(json.dumps({"permissions": {"allow": ["Write"]}}))
    api.script([reply(tool("write_file", {"path": "made", "content": "x"}, id="toolu_b")), reply("Could not.")])
    status, result, err = result_of(mod, api, monkeypatch, capsys, "write it", mode="default")
    assert status == 0 and not (workspace / "made").exists()
    assert [d["tool_use_id"] for d in result["permission_denials"]] == ["toolu_b"]
    assert "Trust this file? [y/N] no (headless run: nobody to ask; --trust-workspace" in err
    trusted = workspace.parent / "home" / ".agent" / "trusted.yaml"
    assert not trusted.exists() or "settings.json" not in trusted.read_text()


def test_num_turns_counts_the_main_agents_calls_only(mod, api, monkeypatch, capsys, no_stdin):
    api.script([reply(tool("agent", {"prompt": "look", "description": "scout"})),
                reply("child one", tool("bash", {"command": "true"})), reply("child two"), reply("Done.")])
    status, result, _ = result_of(mod, api, monkeypatch, capsys, "go")
    assert status == 0 and result["num_turns"] == 2 and len(message_bodies(api)) == 4


def test_stream_json_streams_the_main_agents_results_only(mod, api, monkeypatch, capsys, no_stdin):
    api.script([reply(tool("agent", {"prompt": "look", "description": "scout"}, id="toolu_parent")),
                reply(tool("bash", {"command": "echo child"}, id="toolu_child")), reply("child done"),
                reply("Done.")])
    status, out, _ = headless(mod, api, monkeypatch, capsys, "--output-format", "stream-json", "go")
    lines = json_lines(out)
    users = [b["tool_use_id"] for line in lines if line["type"] == "user" for b in line["message"]["content"]]
    assert status == 0 and users == ["toolu_parent"]
    assert [line["type"] for line in lines] == ["system", "assistant", "user", "assistant", "result"]


def test_verbose_is_taken_and_never_part_of_the_prompt(mod, api, monkeypatch, capsys, no_stdin):
    api.script([reply("ok")])
    status, out, _ = headless(mod, api, monkeypatch, capsys, "--output-format", "stream-json", "--verbose", "hi")
    assert status == 0 and sent_texts(message_bodies(api)[0]) == ["hi"]


# --- the smaller notes -----------------------------------------------------------------------

def test_ctrl_c_in_a_headless_run_does_not_offer_to_keep_typing(mod, api, monkeypatch, capsys, no_stdin):
    def interrupted(**args):
        raise KeyboardInterrupt
    monkeypatch.setitem(mod.TOOL_HANDLERS, "bash", interrupted)
    api.script([reply(tool("bash", {"command": "sleep 100"}))])
    status, result, err = result_of(mod, api, monkeypatch, capsys, "go")
    assert status == 1 and result["subtype"] == "error_during_execution"
    assert "[interrupted: turn cancelled]" in err and "keep typing" not in err


def test_append_system_prompt_works_without_p(mod, api, monkeypatch, capsys, no_stdin):
    api.script([reply("Bonjour.")])
    assert run_main(mod, api, monkeypatch, "--append-system-prompt", "Always answer in French.", "hi") == 0
    system = "".join(b["text"] for b in message_bodies(api)[0]["system"])
    assert system.endswith("\n\nAlways answer in French.")


def test_a_unicode_line_separator_in_a_reply_stays_inside_one_json_line(mod, api, monkeypatch, capsys, no_stdin):
    api.script([reply("one\u2028two\u2029three\x85four")])
    status, out, _ = headless(mod, api, monkeypatch, capsys, "--output-format", "stream-json", "hi")
    lines = json_lines(out)                                       # str.splitlines, as the shapes test reads it
    assert status == 0 and lines[-1]["result"] == "one\u2028two\u2029three\x85four"
