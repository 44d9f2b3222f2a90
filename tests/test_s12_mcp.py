"""s12's MCP client against real servers: one built with the official `mcp` package
(2.x, tests/mcp_sdk_server.py) over stdio and over Streamable HTTP, the npm
reference servers (server-filesystem, server-everything; .ci/run installs them
into .mcp-servers/ where node exists), and a hand-written one that misbehaves on
purpose (tests/mcp_tiny_server.py): it crashes, prints garbage, never answers.

The model is the scripted one, so every request the chapter sends is checked.
"""
import contextvars
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from conftest import ROOT, TESTS, chapters_from, message_bodies, run_chapter, run_turn
from fake_api import reply, tool

each = pytest.mark.parametrize("mod", chapters_from("s12"), indirect=True)
PY = sys.executable
SDK = str(TESTS / "mcp_sdk_server.py")
TINY = str(TESTS / "mcp_tiny_server.py")
NPM_BIN = ROOT / ".mcp-servers" / "node_modules" / ".bin"
needs_mcp = pytest.mark.skipif(importlib.util.find_spec("mcp") is None,
                               reason="the mcp package (requirements.txt, test-only) is not installed")


def npm_server(name):
    """The path of an npm reference server's command, or a skip that says why not."""
    if not shutil.which("node"):
        pytest.skip("node is not installed: the npm reference MCP servers cannot run here")
    path = NPM_BIN / name
    if not path.exists():
        pytest.skip(f"{name} is not installed: run .ci/run, or npm install --prefix .mcp-servers "
                    f"@modelcontextprotocol/server-filesystem @modelcontextprotocol/server-everything")
    return str(path)


@pytest.fixture
def servers(mod):
    """start({name: settings}) connects them as the user's own config would; all closed after."""
    def start(config, wait=30):
        mod.agent_state().permissions["mcp_servers"] = [("user", "~/.agent/config.yaml", config)]
        mod.start_mcp(wait=wait)
        return mod.MCP_SERVERS
    yield start
    mod.close_mcp()


@pytest.fixture
def http_server():
    """start(*args) runs tests/mcp_sdk_server.py --http and returns its URL."""
    procs = []

    def start(*args):
        p = subprocess.Popen([PY, SDK, "--http", *args], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                             text=True, start_new_session=True)
        procs.append(p)
        line = p.stdout.readline()
        assert line.startswith("PORT "), f"the HTTP server did not start: {line!r}"
        return f"http://127.0.0.1:{line.split()[1]}/mcp"
    yield start
    for p in procs:
        p.kill()
        p.wait()


def results(history):
    """Every tool_result block of a history, in order."""
    return [b for m in history if m["role"] == "user" and isinstance(m["content"], list)
            for b in m["content"] if b.get("type") == "tool_result"]


def tool_names(body):
    return [t["name"] for t in body.get("tools") or []]


# --- a server built with the mcp package, over stdio ---------------------------------

@needs_mcp
@each
def test_stdio_server_pages_its_tools_and_a_call_reaches_the_model(mod, api, client, servers):
    up = servers({"sdk": {"command": PY, "args": [SDK, "--tools", "6", "--page", "4"]}})
    assert up["sdk"]["state"] == "connected" and up["sdk"]["transport"].version == "2025-11-25"
    names = [n for n in mod.TOOL_HANDLERS if n.startswith("mcp__sdk__")]
    assert len(names) == 17, names                      # 5 pages of 4: every page was followed
    assert names[:3] == ["mcp__sdk__echo", "mcp__sdk__add", "mcp__sdk__slow"] and names[-1] == "mcp__sdk__gen_5"
    history = run_turn(mod, api, client, [reply(tool("mcp__sdk__echo", {"text": "hello"}))])
    assert results(history)[0]["content"] == "echo: hello" and "is_error" not in results(history)[0]
    roots = mod.run_tool(SimpleNamespace(id="toolu_r", name="mcp__sdk__roots", input={}))
    assert roots["content"] == mod.agent_state().workdir.as_uri()   # ping and roots/list answered
    first, second = message_bodies(api)
    echo = next(t for t in first["tools"] if t["name"] == "mcp__sdk__echo")
    assert echo["input_schema"] == {"type": "object", "properties": {"text": {"type": "string"}},
                                    "required": ["text"]}   # passed through as the server gave it
    assert second["messages"][-1]["content"][0]["content"] == "echo: hello"


@needs_mcp
@each
def test_server_errors_images_and_structured_content(mod, api, client, servers):
    servers({"sdk": {"command": PY, "args": [SDK]}})
    history = run_turn(mod, api, client, [reply(
        tool("mcp__sdk__fail", {}), tool("mcp__sdk__boom", {}), tool("mcp__sdk__image", {}),
        tool("mcp__sdk__structured", {"city": "Oslo"}))])
    fail, boom, image, structured = results(history)
    assert fail["is_error"] and fail["content"] == "no such record"             # isError -> is_error
    assert boom["is_error"] and "boom went the tool" in boom["content"]          # a JSON-RPC error too
    assert image["content"][0] == {"type": "text", "text": "a red pixel"}
    assert image["content"][1]["type"] == "image" and image["content"][1]["source"]["media_type"] == "image/png"
    assert json.loads(structured["content"]) == {"city": "Oslo", "temp": 21}
    sent = message_bodies(api)[-1]["messages"][-1]["content"]
    assert sent[2]["content"][1]["type"] == "image"                              # the image reached the model


@needs_mcp
@each
def test_a_tool_list_change_reaches_the_next_request(mod, api, client, servers):
    servers({"sdk": {"command": PY, "args": [SDK]}})
    run_turn(mod, api, client, [reply(tool("mcp__sdk__grow", {}))])
    first, second = message_bodies(api)
    assert "mcp__sdk__grown" not in tool_names(first)
    assert tool_names(second)[-1] == "mcp__sdk__grown"    # notifications/tools/list_changed, then tools/list


@needs_mcp
@pytest.mark.permissions
@each
def test_read_only_hint_makes_calls_run_together_but_still_asks(mod, api, client, servers, monkeypatch):
    servers({"sdk": {"command": PY, "args": [SDK]}})
    assert mod.TOOL_FLAGS["mcp__sdk__slow"] == {"read_only": False, "concurrency_safe": True}
    assert mod.TOOL_FLAGS["mcp__sdk__fail"]["concurrency_safe"] is False
    asked = []                                  # the default mode, no rules: the human is asked
    monkeypatch.setattr(mod, "ask_human", lambda q: asked.append(q) or "y")
    history = run_turn(mod, api, client, [reply(*[tool("mcp__sdk__slow", {"tag": str(i)}) for i in range(4)])])
    assert len(asked) == 4 and all("Allow mcp__sdk__slow?" in q for q in asked)   # each call, before any ran
    spans = [tuple(map(float, r["content"].split()[2:])) for r in results(history)]
    assert [r["content"].split()[1] for r in results(history)] == ["0", "1", "2", "3"]   # call order kept
    spans.sort()                                # run one by one, each would start after the last ended
    assert any(later[0] < earlier[1] for earlier, later in zip(spans, spans[1:]))   # they overlapped


# --- Streamable HTTP ------------------------------------------------------------------

@needs_mcp
@each
@pytest.mark.parametrize("reply_kind", ["event-stream", "json"])
def test_streamable_http_with_a_token_from_the_environment(mod, api, client, servers, http_server,
                                                          monkeypatch, reply_kind):
    monkeypatch.setenv("MCP_TEST_TOKEN", "s3cret")
    url = http_server("--tools", "6", "--token", "s3cret", *(["--json"] if reply_kind == "json" else []))
    up = servers({"web": {"type": "http", "url": url, "headers": {"Authorization": "Bearer ${MCP_TEST_TOKEN}"}}})
    transport = up["web"]["transport"]
    assert up["web"]["state"] == "connected", up["web"]["error"]
    assert transport.session and transport.version == "2025-11-25"   # Mcp-Session-Id kept, version sent
    assert len([n for n in mod.TOOL_HANDLERS if n.startswith("mcp__web__")]) == 17   # paged over HTTP too
    history = run_turn(mod, api, client, [reply(tool("mcp__web__add", {"a": 2, "b": 3}), tool("mcp__web__fail", {}))])
    add, fail = results(history)
    assert add["content"] == "5" and fail["is_error"]
    roots = mod.run_tool(SimpleNamespace(id="toolu_r", name="mcp__web__roots", input={}))
    assert roots["content"] == mod.agent_state().workdir.as_uri()   # its requests, on its GET stream
    mod.run_tool(SimpleNamespace(id="toolu_g", name="mcp__web__grow", input={}))
    for _ in range(100):                        # tools/list_changed arrives on that stream too
        if up["web"]["stale"]:
            break
        time.sleep(0.05)
    mod.mcp_news([])
    assert "mcp__web__grown" in mod.TOOL_HANDLERS


@needs_mcp
@each
def test_http_refused_token_and_ended_session(mod, api, client, servers, http_server, monkeypatch):
    monkeypatch.delenv("OTHER", raising=False)
    url = http_server("--token", "right")
    monkeypatch.setenv("MCP_TEST_TOKEN", "wrong")
    up = servers({"bad": {"type": "http", "url": url, "headers": {"Authorization": "Bearer ${MCP_TEST_TOKEN}"}},
                  "good": {"type": "http", "url": url, "headers": {"Authorization": "Bearer ${OTHER:-right}"}}})
    assert up["bad"]["state"] == "failed" and "not authorised" in up["bad"]["error"]
    good = up["good"]["transport"]
    good.http.delete(url, headers=good.request_headers())   # the server forgets the session
    history = run_turn(mod, api, client, [reply(tool("mcp__good__echo", {"text": "a"})),
                                          reply(tool("mcp__good__echo", {"text": "b"}))])
    first, again = results(history)
    assert first["content"] == "echo: a" and again["content"] == "echo: b"   # sent again on a new session
    assert up["good"]["restarts"] == 0 and up["good"]["transport"] is not good   # which is not a restart


# --- the npm reference servers ----------------------------------------------------------

@each
def test_the_filesystem_reference_server(mod, api, client, servers, workspace):
    command = npm_server("mcp-server-filesystem")
    (workspace / "notes.txt").write_text("buy milk\n")
    up = servers({"fs": {"command": command, "args": [str(workspace)]}})
    assert up["fs"]["state"] == "connected", up["fs"]["error"]
    assert mod.TOOL_FLAGS["mcp__fs__read_text_file"]["concurrency_safe"]      # readOnlyHint
    assert not mod.TOOL_FLAGS["mcp__fs__write_file"]["concurrency_safe"]
    history = run_turn(mod, api, client, [reply(
        tool("mcp__fs__read_text_file", {"path": str(workspace / "notes.txt")}),
        tool("mcp__fs__read_text_file", {"path": "/etc/passwd"}))])
    ok, outside = results(history)
    assert ok["content"] == "buy milk\n" and outside["is_error"]              # the server's own sandbox
    assert (workspace / ".agent" / "mcp" / "fs.log").read_text().count("Secure MCP Filesystem Server") == 1


@each
def test_the_everything_reference_server(mod, api, client, servers):
    up = servers({"ev": {"command": npm_server("mcp-server-everything")}})
    assert up["ev"]["state"] == "connected", up["ev"]["error"]
    history = run_turn(mod, api, client, [reply(
        tool("mcp__ev__echo", {"message": "hi"}), tool("mcp__ev__get-sum", {"a": 2, "b": 3}),
        tool("mcp__ev__get-tiny-image", {}), tool("mcp__ev__get-structured-content", {"location": "Chicago"}))])
    echo, total, image, weather = results(history)
    assert echo["content"] == "Echo: hi" and total["content"] == "The sum of 2 and 3 is 5."
    assert [b["type"] for b in image["content"]] == ["text", "image"]
    assert json.loads(weather["content"])["temperature"] == 36               # once, not twice


# --- faults ----------------------------------------------------------------------------

@each
@pytest.mark.parametrize("fault,expect", [
    ("crash", "the server process ended (exit status 7)"),
    ("garbage", "printed 100 lines that are not JSON-RPC"),
    ("hang", "no answer in 1 s"),
])
def test_a_broken_server_gives_is_error_and_the_session_goes_on(mod, api, client, servers, workspace,
                                                                 fault, expect):
    timeout = 1 if fault == "hang" else 30                                   # the others fail without it:
    servers({"tiny": {"command": PY, "args": [TINY, "--fault", fault], "timeout": timeout}})  # not a race
    history = run_turn(mod, api, client, [reply(tool("mcp__tiny__shout", {"text": "x"})),
                                          reply(tool("bash", {"command": "echo still here"}))])
    broken, after = results(history)
    assert broken["is_error"] and expect in broken["content"], broken["content"]
    assert after["content"].strip() == "still here"                          # the loop carried on
    if fault == "garbage":
        assert "[stdout, not JSON-RPC, skipped] garbage line 0" in (workspace / ".agent/mcp/tiny.log").read_text()


@needs_mcp
@each
def test_a_crash_fails_every_pending_call_at_once_and_the_next_call_restarts(mod, api, client, servers):
    up = servers({"sdk": {"command": PY, "args": [SDK], "timeout": 60}})
    waiting = {}
    t = threading.Thread(target=contextvars.copy_context().run, args=(lambda: waiting.update(r=mod.run_tool(
        SimpleNamespace(id="toolu_hang", name="mcp__sdk__hang", input={}))),))
    t.start()
    while not up["sdk"]["transport"].pending:   # the hang request is on its way
        time.sleep(0.01)
    crashed = mod.run_tool(SimpleNamespace(id="toolu_crash", name="mcp__sdk__crash", input={}))
    t.join(20)                                  # long before hang's 60 s timeout
    assert not t.is_alive() and waiting["r"]["is_error"] and "exit status 3" in waiting["r"]["content"]
    assert crashed["is_error"] and "next call of one of its tools restarts it" in crashed["content"]
    history = run_turn(mod, api, client, [reply(tool("mcp__sdk__echo", {"text": "back"}))])
    assert results(history)[0]["content"] == "echo: back" and up["sdk"]["restarts"] == 1


@each
def test_restarts_are_bounded(mod, servers, monkeypatch):
    monkeypatch.setattr(mod, "MCP_MAX_RESTARTS", 1)
    servers({"tiny": {"command": PY, "args": [TINY, "--fault", "crash"]}})
    call = SimpleNamespace(id="toolu_1", name="mcp__tiny__shout", input={"text": "x"})
    outcomes = [mod.run_tool(call)["content"] for _ in range(3)]
    assert "next call of one of its tools restarts it (1 restart(s) left)" in outcomes[0]
    assert "It will not be restarted again" in outcomes[1]
    assert "was restarted 1 times already" in outcomes[2]


@each
def test_a_stray_line_at_start_is_skipped_and_logged(mod, api, client, servers, workspace):
    servers({"tiny": {"command": PY, "args": [TINY, "--banner"]}})
    history = run_turn(mod, api, client, [reply(tool("mcp__tiny__word_count", {"text": "one two"}))])
    assert results(history)[0]["content"] == "2 words"
    log = (workspace / ".agent/mcp/tiny.log").read_text()
    assert "tiny: started" in log and "[stdout, not JSON-RPC, skipped] tiny MCP server ready" in log


@each
def test_a_slow_server_does_not_hold_up_the_first_prompt(mod, api, client, servers, capsys):
    up = servers({"slow": {"command": PY, "args": [TINY, "--slow-start", "1"]},
                  "quick": {"command": PY, "args": [TINY]}}, wait=0.2)
    assert up["slow"]["state"] == "connecting"                         # the start did not wait for it
    assert not any(n.startswith("mcp__slow__") for n in mod.TOOL_HANDLERS)
    assert "slow still connecting after 0.2 s" in capsys.readouterr().err
    for _ in range(200):                                               # quick's own start, on a loaded
        if up["quick"]["state"] != "connecting":                       # machine, may take over 0.2 s too
            break
        time.sleep(0.05)
    assert up["quick"]["state"] == "connected"
    for _ in range(200):
        if up["slow"]["state"] != "connecting":
            break
        time.sleep(0.05)
    run_turn(mod, api, client, [])
    assert "mcp__slow__shout" in tool_names(message_bodies(api)[0])   # joined before the next request


# --- config, trust, secrets -------------------------------------------------------------

@each
def test_variables_expand_and_secrets_stay_home(mod, monkeypatch):
    monkeypatch.setenv("MCP_T", "tok")
    monkeypatch.delenv("MCP_UNSET", raising=False)
    spec = mod.parse_server("gh", {"command": "npx", "args": ["-y", "${MCP_UNSET:-pkg}", 3],
                                   "env": {"TOKEN": "${MCP_T}", "N": 1}})
    assert spec["args"] == ["-y", "pkg", "3"] and spec["env"] == {"TOKEN": "tok", "N": "1"}
    web = mod.parse_server("web", {"type": "http", "url": "https://x/${MCP_T}", "headers": {"A": "Bearer ${MCP_T}"}})
    assert web["url"] == "https://x/tok" and web["headers"] == {"A": "Bearer tok"} and web["timeout"] == 120
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-real")
    for raw, why in [({"command": "x", "env": {"K": "${ANTHROPIC_API_KEY}"}}, "the agent's own credential"),
                     ({"command": "x", "args": ["${MCP_UNSET}"]}, "${MCP_UNSET} is not set"),
                     ({"type": "sse", "url": "http://x"}, "type 'sse' is not supported"),
                     ({"command": "x", "cwd": "/"}, "unknown key 'cwd'"),
                     ({"url": "ftp://x"}, "needs a url"), ({"command": "x", "timeout": 0}, "timeout")]:
        with pytest.raises(ValueError, match=re.escape(why)):
            mod.parse_server("s", raw)
    for bad in ("a__b", "-x", "a/b", "x" * 33):
        with pytest.raises(ValueError, match="the name must be"):
            mod.parse_server(bad, {"command": "x"})


@each
def test_a_server_never_gets_the_agents_key(mod, api, client, servers, monkeypatch, workspace):
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-real")
    servers({"tiny": {"command": PY, "args": [TINY], "env": {"WHERE": "${HOME}"}}})
    history = run_turn(mod, api, client, [reply(tool("mcp__tiny__env", {"name": "ANTHROPIC_API_KEY"}),
                                                tool("mcp__tiny__env", {"name": "WHERE"}))])
    key, home = results(history)
    assert key["content"] == "(not set)" and home["content"] == os.environ["HOME"]
    handler = mod.TOOL_HANDLERS["mcp__tiny__word_count"]     # input fields may have any name
    assert handler(text="a b c", tool="x", server_name="y", args="z") == "3 words"


@each
def test_sources_later_ones_win(mod, workspace, monkeypatch):
    (workspace / ".mcp.json").write_text(json.dumps({"mcpServers": {
        "a": {"command": "from-json"}, "b": {"command": "from-json"}}}))
    state = mod.agent_state()
    state.permissions |= {"trust_all": True, "mcp_servers": [
        ("user", "~/.agent/config.yaml", {"a": {"command": "from-user"}, "c": {"command": "from-user"}}),
        ("project", ".agent/config.yaml", {"b": {"command": "from-project"}, "bad": "nonsense"})]}
    specs = mod.server_specs(state)
    assert {n: (s["command"], src) for n, (s, src, _) in specs.items()} == {
        "a": ("from-json", ".mcp.json"), "b": ("from-project", ".agent/config.yaml"),
        "c": ("from-user", "~/.agent/config.yaml")}


@each
def test_project_servers_start_only_in_a_trusted_workspace(mod, workspace, monkeypatch, capsys):
    (workspace / ".mcp.json").write_text(json.dumps({"mcpServers": {"tiny": {
        "command": PY, "args": [TINY], "env": {"TOKEN": "${MCP_TOKEN:-none}"}}}}))
    asked = []
    monkeypatch.setattr(mod, "ask_human", lambda q: asked.append(q) or "n")
    mod.start_mcp(wait=10)
    assert not mod.MCP_SERVERS and "is not trusted: its MCP servers are not started" in capsys.readouterr().err
    question = mod.printable(asked[0])
    assert f"tiny: {PY} {TINY} TOKEN='${{MCP_TOKEN:-none}}'" in question      # the command line, as written
    assert "reads $MCP_TOKEN from your environment" in question and "outside the sandbox" in question
    monkeypatch.setattr(mod, "ask_human", lambda q: asked.append(q) or "y")
    try:
        mod.start_mcp(wait=10)
        assert mod.MCP_SERVERS["tiny"]["state"] == "connected" and len(asked) == 2
        mod.close_mcp()
        mod.start_mcp(wait=10)                    # trusted now: no question
        assert len(asked) == 2 and mod.MCP_SERVERS["tiny"]["state"] == "connected"
    finally:
        mod.close_mcp()
    (workspace / ".mcp.json").write_text(json.dumps({"mcpServers": {"tiny": {"command": "evil"}}}))
    monkeypatch.setattr(mod, "ask_human", lambda q: asked.append(q) or "n")
    mod.start_mcp(wait=10)                        # a changed file is a new question
    assert len(asked) == 3 and "tiny: evil" in asked[2] and not mod.MCP_SERVERS


@each
def test_a_project_configs_servers_go_through_s07s_question(mod, workspace, monkeypatch, capsys):
    (workspace / ".agent").mkdir()
    (workspace / ".agent" / "config.yaml").write_text(
        "mcp_servers:\n  gh:\n    command: npx\n    args: [-y, server-github]\n"
        "    env: {GITHUB_TOKEN: '${GITHUB_TOKEN}'}\n")
    asked = []
    monkeypatch.setattr(mod, "ask_human", lambda q: asked.append(q) or "n")
    settings = mod.load_permissions(workspace)
    assert settings["mcp_servers"] == [] and "gh: npx -y server-github GITHUB_TOKEN=" in asked[0]
    assert "reads $GITHUB_TOKEN" in asked[0]
    assert "[.agent/config.yaml is not trusted: its MCP servers are not started]" in capsys.readouterr().err
    monkeypatch.setattr(mod, "ask_human", lambda q: "y")
    assert mod.load_permissions(workspace)["mcp_servers"][0][:2] == ("project", ".agent/config.yaml")


# --- permissions and hooks apply to MCP tools --------------------------------------------

@pytest.mark.permissions
@each
def test_mcp_tools_ask_by_default_and_rules_apply(mod, api, client, servers, monkeypatch):
    servers({"tiny": {"command": PY, "args": [TINY]}})
    state, asked = mod.agent_state(), []
    monkeypatch.setattr(mod, "ask_human", lambda q: asked.append(q) or "n")
    call = SimpleNamespace(id="toolu_1", name="mcp__tiny__word_count", input={"text": "a b"})
    assert "the user said no" in mod.run_tool(call)["content"] and "Allow mcp__tiny__word_count?" in asked[0]
    rule = lambda text, effect: mod.parse_rule(text) | {"effect": effect, "scope": "user", "file": "config.yaml"}
    state.permissions["rules"] = [rule("mcp__tiny__word_count", "allow")]
    assert mod.run_tool(call)["content"] == "2 words" and len(asked) == 1
    state.permissions["rules"] = [rule("mcp__tiny", "deny"), rule("mcp__tiny__word_count", "allow")]
    denied = mod.run_tool(call)
    assert denied["is_error"] and "denied by mcp__tiny" in denied["content"] and len(asked) == 1
    state.permissions["rules"] = []
    for mode, effect in [("default", "ask"), ("acceptEdits", "ask"), ("plan", "ask"), ("bypassPermissions", "allow")]:
        state.mode = mode                       # readOnlyHint is the server's word: it loosens no mode
        assert mod.decide("mcp__tiny__word_count", {}, state)[0] == effect, mode


@each
def test_hooks_see_mcp_tools(mod, servers):
    servers({"tiny": {"command": PY, "args": [TINY]}})
    mod.agent_state().permissions["hooks"] = mod.read_hooks(Path("config.yaml"), {"hooks": [{
        "event": "pre_tool_use", "if": 'tool =~ "^mcp__tiny__"',
        "action": {"type": "command", "command": "echo \"no $TOOL_NAME today\" >&2; exit 2"}}]}, "user", trusted=True)
    blocked = mod.run_tool(SimpleNamespace(id="toolu_1", name="mcp__tiny__shout", input={"text": "x"}))
    assert blocked["is_error"] and "no mcp__tiny__shout today" in blocked["content"]


@each
def test_big_results_go_to_disk_and_bad_tools_are_left_out(mod, servers, workspace, capsys):
    servers({"tiny": {"command": PY, "args": [TINY]}})
    big = mod.run_tool(SimpleNamespace(id="toolu_big", name="mcp__tiny__shout", input={"text": "ab " * 20_000}))
    assert big["content"].startswith("<persisted-output>")                 # s06's layer 1
    assert (workspace / ".agent/tool-results/toolu_big.txt").read_text() == "AB " * 20_000   # all of it
    server = mod.MCP_SERVERS["tiny"]
    server["tools"] = [{"name": "ok.tool/v2", "inputSchema": {"type": "object"}},
                       {"name": "weird", "inputSchema": {"type": "object", "properties": {"a b": {}}}},
                       {"name": "x" * 80, "inputSchema": {"type": "object"}}]
    mod.register_tools(server)
    names = mod.mcp_names("tiny")
    assert names[0] == "mcp__tiny__ok_tool_v2" and len(names) == 2 and len(names[1]) == 64
    assert "tool 'weird' left out: its input field name 'a b'" in capsys.readouterr().err


@each
def test_call_result_shapes(mod):
    r = mod.call_result({"content": [
        {"type": "text", "text": "see"}, {"type": "resource_link", "uri": "file:///a", "name": "a"},
        {"type": "resource", "resource": {"uri": "file:///b", "text": "B"}},
        {"type": "audio", "data": "AAAA", "mimeType": "audio/wav"},
        {"type": "image", "data": "AAAA", "mimeType": "image/tiff"}], "structuredContent": {"x": 1}})
    assert r == ("see\n[resource link: a file:///a]\nB\n[audio content (audio/wav), not shown]\n"
                 "[image content (image/tiff), not shown]")     # the text says it: no JSON twice
    assert mod.call_result({"content": [], "structuredContent": {"x": 1}}) == '{"x": 1}'
    with pytest.raises(mod.ToolError, match="without a message"):
        mod.call_result({"content": [], "isError": True})


# --- deferred tools ----------------------------------------------------------------------

@needs_mcp
@each
def test_sixty_tools_are_deferred_found_with_tool_search_and_called(mod, api, client, servers, capsys):
    servers({"sdk": {"command": PY, "args": [SDK, "--tools", "60", "--long", "--page", "25"]}})
    assert len(mod.mcp_names("sdk")) == 71 and all(t["deferred"] for t in mod.MCP_TOOLS.values())
    history = run_turn(mod, api, client, [
        reply(tool("mcp__sdk__gen_7", {"key": "early"})),      # before it is loaded: refused, with the way
        reply(tool("tool_search", {"query": "kw7"})),
        reply(tool("mcp__sdk__gen_7", {"key": "k"}))])
    early, found, called = results(history)
    assert early["is_error"] and 'tool_search with query "select:mcp__sdk__gen_7"' in early["content"]
    assert found["content"].startswith("Loaded 1 tool definition(s)") and '"name": "mcp__sdk__gen_7"' in found["content"]
    assert called["content"] == "gen_7: k"
    bodies = message_bodies(api)
    first = bodies[0]
    assert not [n for n in tool_names(first) if n.startswith("mcp__")] and "tool_search" in tool_names(first)
    reminder = first["messages"][0]["content"][-1]["text"]
    assert reminder.startswith("<system-reminder>\n# Deferred tools") and reminder.count("\n- mcp__sdk__") == 71
    assert tool_names(bodies[2])[-1] == "mcp__sdk__gen_7" and tool_names(bodies[3])[-1] == "mcp__sdk__gen_7"
    assert json.dumps(bodies[-1]["messages"]).count("# Deferred tools") == 1   # told once
    changed = sum(tool_names(a) != tool_names(b) for a, b in zip(bodies, bodies[1:]))
    with capsys.disabled():
        print(f"\n[{mod.__name__}: 71 MCP tools deferred; {len(bodies)} requests; the tools block changed "
              f"in {changed} of them (the request after tool_search)]")
    assert changed == 1


@each
def test_defer_true_and_a_subagent_of_its_own(mod, api, client, servers):
    servers({"tiny": {"command": PY, "args": [TINY], "defer": True}})
    assert all(t["deferred"] for t in mod.MCP_TOOLS.values())
    mod.agent_state().discovered.append("mcp__tiny__shout")
    assert mod.child_state(True, "fork").discovered == ["mcp__tiny__shout"]   # a fork saw the search
    assert mod.child_state(False, "fresh").discovered == []
    tools = [t for t in mod.TOOLS if t["name"] != "tool_search"]          # a child given no tool_search
    assert [t["name"] for t in mod.request_tools(tools)][-3:] == ["mcp__tiny__word_count", "mcp__tiny__env",
                                                                   "mcp__tiny__shout"]
    assert mod.tool_search("select:word_count").count("<function>") == 1


@each
def test_no_deferred_tools_no_tool_search(mod, api, client, servers):
    servers({"tiny": {"command": PY, "args": [TINY]}})
    run_turn(mod, api, client, [])
    names = tool_names(message_bodies(api)[0])
    assert "tool_search" not in names and names[-3:] == ["mcp__tiny__word_count", "mcp__tiny__env", "mcp__tiny__shout"]


# --- /mcp and the chapter as a program --------------------------------------------------

@each
def test_slash_mcp_lists_servers(mod, servers, capsys):
    servers({"tiny": {"command": PY, "args": [TINY]}, "gone": {"command": "no-such-mcp-server-here"}})
    capsys.readouterr()
    mod.handle_slash("/mcp", {})
    out = capsys.readouterr().out
    assert "server  transport  state      tools  deferred  restarts  from" in out
    assert "tiny    stdio      connected  3      0         0" in out
    assert "gone    stdio      failed     0" in out and "cannot start no-such-mcp-server-here" in out


@pytest.mark.e2e("s12")
@pytest.mark.parametrize("name", chapters_from("s12"))
def test_a_session_with_a_project_server(name, api, tmp_path):
    (tmp_path / ".mcp.json").write_text(json.dumps({"mcpServers": {"tiny": {"command": PY, "args": [TINY]}}}))
    api.script([reply(tool("mcp__tiny__shout", {"text": "hello"})), reply("It said HELLO.")])
    r = run_chapter(name, "--trust-workspace", "shout hello", api=api, cwd=tmp_path, env={"HOME": str(tmp_path)})
    assert r.returncode == 0, r.stderr
    assert "It said HELLO." in r.stdout
    assert "[mcp: connecting to 1 server(s): tiny]" in r.stderr and "[mcp tiny: connected (stdio), 3 tool(s)]" in r.stderr
    assert message_bodies(api)[1]["messages"][-1]["content"][0]["content"] == "HELLO"
    r = run_chapter(name, "/mcp", "--trust-workspace", cwd=tmp_path, env={"HOME": str(tmp_path)})
    assert r.returncode == 0 and "tiny    stdio      connected  3" in r.stdout, r.stderr
