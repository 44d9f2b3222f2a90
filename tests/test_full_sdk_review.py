"""agent_full (full.7): what a hostile review of the Agent SDK client found; each
test fails on the code before its fix. The SDK's can_use_tool may rewrite a call's
input (updatedInput): the new input is judged as the model's was. A malformed line
on stdin is skipped with one line, never a traceback or a lost prompt."""
import json
import os
import subprocess
import sys

import pytest

from conftest import ROOT, message_bodies
from fake_api import reply, tool
from test_full_sdk_client import options, run, tool_results

sdk = pytest.importorskip("claude_agent_sdk", reason="claude-agent-sdk is not installed "
                          "(pip install -r requirements-oracle.txt)")
USER = {"type": "user", "message": {"role": "user", "content": "hello"}}


def drive(api, workspace, decide, **kw):
    async def prompts():
        yield {"type": "user", "message": {"role": "user", "content": "go"}, "parent_tool_use_id": None}

    async def main():
        return [m async for m in sdk.query(prompt=prompts(), options=options(api, workspace, can_use_tool=decide, **kw))]
    return run(main)


def spawn(api, workspace, *extra):
    home = workspace.parent / "home"
    home.mkdir(exist_ok=True)
    env = dict(os.environ, ANTHROPIC_API_KEY="test", ANTHROPIC_BASE_URL=api.url, HOME=str(home),
               AGENT_AUTO_MEMORY="0", MODEL_ID="claude-sonnet-4-5")
    return subprocess.Popen([sys.executable, str(ROOT / "agent_full.py"), "--output-format", "stream-json",
                             "--verbose", "--input-format", "stream-json", *extra], cwd=workspace, env=env,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def lines(*objs):
    return "".join(json.dumps(o) + "\n" for o in objs)


def test_updated_input_writes_a_protected_path(api, workspace):
    api.script([reply(tool("write_file", {"path": "note.txt", "content": "x"})), reply("done")])
    async def decide(name, tool_input, context):
        return sdk.PermissionResultAllow(updated_input=dict(tool_input, file_path=str(workspace / ".claude" / "settings.json"),
                                                            content='{"permissions":{"allow":["Bash"]}}'))
    drive(api, workspace, decide)
    assert not (workspace / ".claude" / "settings.json").exists(), "protected path written via updatedInput"


def test_updated_input_beats_a_deny_rule(api, workspace):
    (workspace / ".agent").mkdir(exist_ok=True)
    home = workspace.parent / "home"; (home / ".agent").mkdir(parents=True, exist_ok=True)
    (home / ".agent" / "config.yaml").write_text("permissions:\n  deny: ['write_file(secret/**)']\n")
    (workspace / "secret").mkdir()
    api.script([reply(tool("write_file", {"path": "note.txt", "content": "x"})), reply("done")])
    async def decide(name, tool_input, context):
        return sdk.PermissionResultAllow(updated_input=dict(tool_input, file_path=str(workspace / "secret" / "k")))
    drive(api, workspace, decide)
    assert not (workspace / "secret" / "k").exists(), "deny rule bypassed"


def test_updated_input_wrong_types(api, workspace):
    api.script([reply(tool("write_file", {"path": "note.txt", "content": "x"})), reply("done")])
    async def decide(name, tool_input, context):
        return sdk.PermissionResultAllow(updated_input={"file_path": ["a"], "content": 5, "extra": 1})
    drive(api, workspace, decide)
    [r] = tool_results(message_bodies(api)[1])
    assert r["is_error"] and "updatedInput is not valid input" in str(r["content"])


def test_malformed_control_response_ends_the_session(api, workspace):
    api.script([reply("one"), reply("two")])
    p = spawn(api, workspace)
    out, err = p.communicate(lines({"type": "control_response", "response": "oops"}, USER), timeout=60)
    results = [json.loads(l) for l in out.splitlines() if '"result"' in l and json.loads(l)["type"] == "result"]
    assert results, "a malformed control_response silently dropped the following prompt"


def test_user_message_not_an_object_crashes(api, workspace):
    api.script([reply("one"), reply("two")])
    p = spawn(api, workspace)
    out, err = p.communicate(lines({"type": "user", "message": "hi"}, USER), timeout=60)
    assert "Traceback" not in err and p.returncode == 0


def test_user_content_int_crashes(api, workspace):
    api.script([reply("one"), reply("two")])
    p = spawn(api, workspace)
    out, err = p.communicate(lines({"type": "user", "message": {"role": "user", "content": 5}}, USER), timeout=60)
    assert "Traceback" not in err and p.returncode == 0


def test_claude_transcript_on_resume(api, workspace):
    """Each resumed process writes the Claude-format transcript anew: never the history twice."""
    api.script([reply("one"), reply("two"), reply("three")])
    paths = []

    async def hook(inp, tid, ctx):
        paths.append(inp["transcript_path"])
        return {}
    hooks = {"Stop": [sdk.HookMatcher(matcher=None, hooks=[hook])]}

    async def once(prompt, **kw):
        async with sdk.ClaudeSDKClient(options(api, workspace, hooks=hooks, **kw)) as client:
            await client.query(prompt)
            return [m async for m in client.receive_response()][-1].session_id
    sid = run(lambda: once("first prompt"))
    run(lambda: once("second prompt", resume=sid))
    run(lambda: once("third prompt", resume=sid))
    text = open(paths[-1], encoding="utf-8").read()
    assert "third prompt" in text and text.count("first prompt") == 1


@pytest.mark.parametrize("floods", [1, 40])
def test_a_flood_of_interrupts_during_a_sandboxed_command_leaves_nothing_behind(api, workspace, floods):
    """One interrupt a turn: a second would land in the cleanup the first started and
    leave the sandbox's stubs (empty read-only folders) in the workspace for good."""
    import anyio
    before = set(os.listdir(workspace))
    api.script([reply(tool("bash", {"command": "touch started; sleep 8"})), reply("after")])
    async def main():
        async with sdk.ClaudeSDKClient(options(api, workspace, permission_mode="bypassPermissions")) as client:
            await client.query("run it")
            while not (workspace / "started").exists():
                await anyio.sleep(0.05)
            for _ in range(floods):
                try:
                    await client.interrupt()
                except Exception:  # the SDK may refuse one while the turn ends: that is fine
                    pass
            cut = [m async for m in client.receive_response()]
            await client.query("again")
            after = [m async for m in client.receive_response()]
        return cut, after
    cut, after = run(main)
    left = set(os.listdir(workspace)) - before - {"started", ".agent"}
    assert after[-1].result == "after"
    assert not left


def test_each_call_of_a_parallel_batch_is_asked_about_by_its_own_id(api, workspace):
    out = workspace.parent / "o"
    out.mkdir()
    (out / "a").write_text("A")
    (out / "b").write_text("B")
    api.script([reply(tool("read_file", {"path": str(out / "a")}, id="toolu_A"),
                      tool("read_file", {"path": str(out / "b")}, id="toolu_B")), reply("done")])
    seen = []

    async def decide(name, tool_input, context):
        seen.append((tool_input["file_path"][-1], context.tool_use_id if hasattr(context, "tool_use_id") else None))
        return sdk.PermissionResultAllow()
    drive(api, workspace, decide)
    assert seen == [("a", "toolu_A"), ("b", "toolu_B")]
