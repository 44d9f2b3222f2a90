"""The Agent SDK as a client (full.7): the real claude_agent_sdk package runs
agent_full.py as its CLI (ClaudeAgentOptions(cli_path=...)) against the scripted
API: query() one-shot, ClaudeSDKClient over two prompts, a can_use_tool callback's
deny, a PreToolUse hook callback, and client.interrupt() during a slow reply."""
import json
import os
import sys
from pathlib import Path

import anyio
import pytest

from conftest import message_bodies
from fake_api import reply, tool

sdk = pytest.importorskip("claude_agent_sdk")
ROOT = Path(__file__).resolve().parents[1]
CLI = str(ROOT / "agent_full.py")


def options(api, workspace, **kw):
    """The SDK's options for agent_full: the venv's python first on PATH (the file's #!
    line finds python3 there), the scripted API, a fresh HOME, no memory side calls."""
    home = workspace.parent / "home"
    env = {"PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
           "ANTHROPIC_API_KEY": "test", "ANTHROPIC_BASE_URL": api.url, "HOME": str(home),
           "AGENT_AUTO_MEMORY": "0", "MODEL_ID": "claude-sonnet-4-5"}
    return sdk.ClaudeAgentOptions(cli_path=CLI, cwd=str(workspace), env=env, **kw)


def run(coro):
    return anyio.run(coro)


def user_texts(body):
    return [b["text"] if isinstance(b, dict) else b for m in body["messages"] if m["role"] == "user"
            for b in ([m["content"]] if isinstance(m["content"], str) else m["content"])
            if isinstance(b, str) or b.get("type") == "text"]


def tool_results(body):
    return [b for m in body["messages"] if isinstance(m["content"], list) for b in m["content"]
            if b.get("type") == "tool_result"]


def test_query_one_shot(api, workspace):
    api.script([reply("Hello from agent_full.")])

    async def main():
        return [m async for m in sdk.query(prompt="say hello", options=options(
            api, workspace, allowed_tools=["Read"], permission_mode="acceptEdits", max_turns=3))]

    messages = run(main)
    init, result = messages[0], messages[-1]
    assert isinstance(init, sdk.SystemMessage) and init.subtype == "init"
    assert init.data["claude_code_version"] and init.data["permissionMode"] == "acceptEdits"
    assert any(isinstance(m, sdk.AssistantMessage) and m.content[0].text == "Hello from agent_full."
               for m in messages)
    assert isinstance(result, sdk.ResultMessage) and result.subtype == "success" and not result.is_error
    assert result.result == "Hello from agent_full." and result.session_id == init.data["session_id"]
    assert user_texts(message_bodies(api)[0])[-1] == "say hello"


def test_client_multi_turn_keeps_the_conversation(api, workspace):
    api.script([reply("First answer."), reply("Second answer.")])

    async def main():
        results = []
        async with sdk.ClaudeSDKClient(options(api, workspace)) as client:
            for prompt in ("the first question", "the second question"):
                await client.query(prompt)
                results += [m async for m in client.receive_response() if isinstance(m, sdk.ResultMessage)]
        return results

    first, second = run(main)
    assert (first.result, second.result) == ("First answer.", "Second answer.")
    assert first.session_id == second.session_id and second.num_turns == 1
    later = message_bodies(api)[1]["messages"]
    assert [m["role"] for m in later] == ["user", "assistant", "user"]
    assert "the first question" in json.dumps(later[0]) and later[1]["content"][0]["text"] == "First answer."
    assert "the second question" in json.dumps(later[2])


def test_a_can_use_tool_deny_is_the_tool_result_the_model_reads(api, workspace):
    # a project's settings that would allow it count only once the human trusts them:
    # the SDK's --setting-sources project is no such trust
    (workspace / ".claude").mkdir()
    (workspace / ".claude" / "settings.json").write_text(json.dumps({"permissions": {"allow": ["Write"]}}))
    api.script([reply(tool("write_file", {"path": "note.txt", "content": "x"})), reply("I will not write it.")])
    asked = []

    async def decide(name, tool_input, context):
        asked.append((name, tool_input))
        return sdk.PermissionResultDeny(message="not today: ask Ann first")

    async def prompts():
        yield {"type": "user", "message": {"role": "user", "content": "write the note"}, "parent_tool_use_id": None}

    async def main():
        return [m async for m in sdk.query(prompt=prompts(), options=options(
            api, workspace, can_use_tool=decide, setting_sources=["user", "project"]))]

    messages = run(main)
    assert [n for n, _ in asked] == ["Write"] and asked[0][1]["file_path"] == str(workspace / "note.txt")
    [result] = tool_results(message_bodies(api)[1])
    assert result["is_error"] is True and "not today: ask Ann first" in result["content"]
    assert not (workspace / "note.txt").exists()
    assert messages[-1].result == "I will not write it." and len(messages[-1].permission_denials) == 1


def test_a_pre_tool_use_hook_callback_decides(api, workspace):
    api.script([reply(tool("bash", {"command": "echo hi"})), reply("Blocked, fine.")])
    seen = []

    async def guard(hook_input, tool_use_id, context):
        seen.append(hook_input)
        return {"hookSpecificOutput": {"hookEventName": "PreToolUse", "permissionDecision": "deny",
                                       "permissionDecisionReason": "the hook says no"}}

    async def main():
        async with sdk.ClaudeSDKClient(options(api, workspace, permission_mode="bypassPermissions", hooks={
                "PreToolUse": [sdk.HookMatcher(matcher="Bash", hooks=[guard])]})) as client:
            await client.query("run echo")
            return [m async for m in client.receive_response()]

    messages = run(main)
    assert [(h["hook_event_name"], h["tool_name"], h["tool_input"]["command"]) for h in seen] == \
        [("PreToolUse", "Bash", "echo hi")]
    [result] = tool_results(message_bodies(api)[1])
    assert result["is_error"] is True and "the hook says no" in result["content"]
    assert messages[-1].result == "Blocked, fine."


def test_interrupt_cancels_a_slow_turn_and_the_session_goes_on(api, workspace):
    api.script([reply("a slow answer that is never finished", delay=3), reply("Quick now.")])

    async def main():
        async with sdk.ClaudeSDKClient(options(api, workspace)) as client:
            await client.query("take your time")
            while not message_bodies(api):  # the slow request is under way
                await anyio.sleep(0.05)
            await client.interrupt()
            cut = [m async for m in client.receive_response()]
            await client.set_permission_mode("acceptEdits")
            await client.query("now quickly")
            after = [m async for m in client.receive_response()]
        return cut, after

    cut, after = run(main)
    api.settle()  # the slow answer's thread ends: cut off, or at its end ~15 s later
    assert api.left_early == 1  # the interrupt hung up on it; it was not waited out
    assert isinstance(cut[-1], sdk.ResultMessage) and cut[-1].is_error
    assert not any(isinstance(m, sdk.AssistantMessage) for m in cut)
    assert after[-1].result == "Quick now." and after[0].data["permissionMode"] == "acceptEdits"
    assert "take your time" in json.dumps(message_bodies(api)[-1]["messages"])
