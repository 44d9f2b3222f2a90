"""Tests for the scripted fake Messages API, driven through the real SDK.

If the fake drifts from the real service, every agent test built on it lies,
so these tests pin down both halves of its contract: what it sends (the SDK
must parse it) and what it refuses (the real API would refuse it too).
"""

import copy
import http.client
import inspect
import json
import threading
import time

import anthropic
import pytest

from fake_api import (DEFAULT_LIMITS, PromptCache, ScriptedAPI, error, hangup, min_cacheable, model_limits,
                      reply, text, tool)

MODEL = "claude-test"
HI = [{"role": "user", "content": "hi"}]


@pytest.fixture(scope="module")
def server():
    # One server for the whole file keeps it fast; `api` resets it per test.
    with ScriptedAPI() as api:
        yield api


@pytest.fixture
def api(server):
    # Overrides the suite-wide `api` fixture on purpose: that one fails any
    # test that sent an invalid request, and here that is often the point.
    server.reset(full=True)
    return server


@pytest.fixture
def client(api):
    return anthropic.Anthropic(api_key="test", base_url=api.url, max_retries=0)


def raw_post(api, path, body, headers=None):
    """Talk HTTP directly, for what the SDK would never send."""
    host, port = api.url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=5)
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    conn.request("POST", path, body=data,
                 headers={"content-type": "application/json", **(headers or {})})
    resp = conn.getresponse()
    result = resp.status, resp.read().decode()
    conn.close()
    return result


# --------------------------------------------------------------------------
# Answers: streaming, non-streaming, tools.
# --------------------------------------------------------------------------

def test_stream_text_arrives_in_pieces(api, client):
    words = "The quick brown fox jumps over the lazy dog, twice over."
    api.script([reply(words)])
    with client.messages.stream(model=MODEL, max_tokens=100, messages=HI) as stream:
        pieces = list(stream.text_stream)
        final = stream.get_final_message()
    assert len(pieces) > 2 and "".join(pieces) == words
    assert [b.text for b in final.content] == [words]
    assert final.stop_reason == "end_turn" and final.model == MODEL
    (entry,) = api.requests
    assert entry["valid"] and entry["body"]["stream"] is True
    assert api.remaining() == 0 and api.exhausted == 0


def test_stream_tool_use_round_trip(api, client):
    args = {"command": "grep -rn 'TODO' src/", "timeout": 30, "opts": {"a": [1, 2]}}
    call = tool("bash", args)
    api.script([reply("Let me search.", call), reply("Found nothing.")])
    with client.messages.stream(model=MODEL, max_tokens=100, messages=HI) as stream:
        first = stream.get_final_message()
    assert first.stop_reason == "tool_use"
    used = first.content[1]
    assert (used.id, used.name, used.input) == (call["id"], "bash", args)

    # Send the answer back exactly as an agent loop would: the SDK's own
    # block objects go straight back into the history.
    history = HI + [
        {"role": "assistant", "content": first.content},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": used.id, "content": "(empty)"}]},
    ]
    with client.messages.stream(model=MODEL, max_tokens=100, messages=history,
                                tools=[{"name": "read_file", "input_schema": {"type": "object"}}]) as stream:
        second = stream.get_final_message()
    assert second.content[0].text == "Found nothing."
    assert not api.invalid() and api.remaining() == 0


def test_raw_stream_has_real_event_sequence(api, client):
    api.script([reply("hi", tool("read", {"path": "a"}))])
    events = [e.type for e in client.messages.create(
        model=MODEL, max_tokens=10, messages=HI, stream=True)]
    block = ["content_block_start", "content_block_delta", "content_block_stop"]
    assert events[0] == "message_start" and events[-2:] == ["message_delta", "message_stop"]
    assert events[1:4] == block and events[4] == "content_block_start"
    assert set(events[5:-3]) == {"content_block_delta"}


def test_sse_wire_format_includes_ping(api):
    # The SDK hides ping events, so read the wire directly.
    api.script([reply("hello")])
    body = {"model": MODEL, "max_tokens": 5, "messages": HI, "stream": True}
    status, raw = raw_post(api, "/v1/messages", body, {"x-api-key": "k"})
    frames = [f for f in raw.split("\n\n") if f]
    names = [f.split("\n")[0].removeprefix("event: ") for f in frames]
    assert status == 200 and names[:3] == ["message_start", "ping", "content_block_start"]
    start = json.loads(frames[0].split("data: ", 1)[1])["message"]
    assert start["stop_reason"] is None and start["content"] == []
    assert start["usage"]["output_tokens"] == 1


def test_non_stream_create(api, client):
    api.script([reply("plain answer", usage={"cache_read_input_tokens": 50})])
    msg = client.messages.create(model=MODEL, max_tokens=10, messages=HI)
    assert msg.content[0].text == "plain answer" and msg.stop_reason == "end_turn"
    assert msg.usage.input_tokens > 0 and msg.usage.output_tokens > 0
    assert msg.usage.cache_read_input_tokens == 50      # override merged in
    assert msg.id.startswith("msg_") and msg._request_id.startswith("req_")


def test_helpers():
    a, b = tool("x", {}), tool("x", {})
    assert a["id"] != b["id"] and a["id"].startswith("toolu_01")
    assert tool("x", {}, id="toolu_fixed")["id"] == "toolu_fixed"
    assert reply("t")["stop_reason"] == "end_turn"
    assert reply(text("t"), a)["stop_reason"] == "tool_use"
    assert reply(a, stop_reason="max_tokens")["stop_reason"] == "max_tokens"
    assert error(404)["body"]["error"]["type"] == "not_found_error"
    assert error(413)["body"]["error"]["type"] == "request_too_large"


# --------------------------------------------------------------------------
# Validation: one rejection per rule, and a realistic history that passes.
# --------------------------------------------------------------------------

def call(id="toolu_a", name="bash"):
    return {"type": "tool_use", "id": id, "name": name, "input": {}}


def result(id="toolu_a", **extra):
    return {"type": "tool_result", "tool_use_id": id, "content": "ok", **extra}


def turns(*contents):
    """Alternating user/assistant messages, starting with user."""
    return [{"role": "user" if i % 2 == 0 else "assistant", "content": c}
            for i, c in enumerate(contents)]


TOOL = {"name": "bash", "input_schema": {"type": "object", "properties": {}}}
EPH = {"type": "ephemeral"}
PNG = {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}
THINK = {"type": "thinking", "thinking": "hmm", "signature": "sig"}


def image(**source):
    return {"type": "image", "source": {**PNG, **source}}


def schema(**fields):
    """A tool whose input_schema is {"type": "object", **fields}."""
    return {"tools": [{**TOOL, "input_schema": {"type": "object", **fields}}]}


def thinking(budget, max_tokens=4_000):
    return {"thinking": {"type": "enabled", "budget_tokens": budget}, "max_tokens": max_tokens}


# The SDK refuses a non-streaming call with a large max_tokens unless the
# caller sets a timeout; that is a client-side guard, not what is tested here.
BIG = {"timeout": 30}

# (request overrides, substring of the expected error message)
REJECTIONS = {
    "extra top-level key": ({"extra_body": {"foo": 1}}, "foo: Extra inputs are not permitted"),
    "empty model": ({"model": ""}, "model:"),
    "max_tokens zero": ({"max_tokens": 0}, "max_tokens: Input should be greater"),
    "max_tokens not int": ({"max_tokens": 1.5}, "max_tokens: Input should be a valid integer"),
    "no messages": ({"messages": []}, "messages: List should have at least 1 item"),
    "bad role": ({"messages": [{"role": "system", "content": "x"}]}, "messages.0.role"),
    "extra message key": ({"messages": [{"role": "user", "content": "x", "name": "b"}]},
                          "messages.0.name: Extra inputs are not permitted"),
    "empty string content": ({"messages": turns("")}, "must be non-empty"),
    "whitespace string content": ({"messages": turns("  \n")}, "non-whitespace text"),
    "empty list content": ({"messages": turns([])}, "must have non-empty content"),
    "first message assistant": ({"messages": [{"role": "assistant", "content": "x"}]},
                                'first message must use the "user" role'),
    "roles do not alternate": ({"messages": HI + HI}, "roles must alternate"),
    "unknown block type": ({"messages": turns([{"type": "video", "url": "x"}])}, "Input tag 'video'"),
    "block without type": ({"messages": turns([{"text": "x"}])}, "content.0.type: Field required"),
    "extra text key": ({"messages": turns([{"type": "text", "text": "x", "x": 1}])},
                       "content.0.x: Extra inputs are not permitted"),
    "whitespace text block": ({"messages": turns([text(" ")])}, "non-whitespace text"),
    "empty text block": ({"messages": turns([text("")])}, "must be non-empty"),
    "tool_use in user turn": ({"messages": turns([call()])}, "can only appear in assistant"),
    "duplicate tool_use ids": ({"messages": turns("x", [call(), call()], [result()])}, "must be unique"),
    "tool_use input not dict": ({"messages": turns("x", [{**call(), "input": "ls"}], [result()])},
                                "input: Input should be a valid dictionary"),
    "tool_use bad name": ({"messages": turns("x", [call(name="no spaces")], [result()])},
                          "name: String should match pattern"),
    "tool_use extra key": ({"messages": turns("x", [{**call(), "caller": 1}], [result()])},
                           "caller: Extra inputs are not permitted"),
    "tool_result in assistant turn": ({"messages": turns("x", [result()])}, "can only appear in user"),
    "tool_use without tool_result": ({"messages": turns("x", [call()], "done?")},
                                     "tool_use ids were found without tool_result blocks immediately after: toolu_a"),
    "tool_use as last message": ({"messages": turns("x", [call()])}, "without tool_result blocks"),
    "tool_result without tool_use": ({"messages": turns("x", "ok", [result()])},
                                     "unexpected tool_use_id found in tool_result blocks"),
    "tool_result for wrong id": ({"messages": turns("x", [call()], [result(), result("toolu_b")])},
                                 "unexpected tool_use_id"),
    "tool_result after text": ({"messages": turns("x", [call()], [text("note"), result()])},
                               "tool_result blocks must come first"),
    "tool_result bad content": ({"messages": turns("x", [call()], [result(content=[call("t2")])])},
                                "Input should be 'text', 'image', 'document' or 'search_result'"),
    "tool_result content not str/list": ({"messages": turns("x", [call()], [result(content=5)])},
                                         "content: Input should be a valid string or list"),
    "is_error not bool": ({"messages": turns("x", [call()], [result(is_error="yes")])},
                          "is_error: Input should be a valid boolean"),
    "tools not a list": ({"tools": {"name": "bash"}}, "tools: Input should be a valid list"),
    "tool bad name": ({"tools": [{**TOOL, "name": "a.b"}]}, "tools.0.name: String should match"),
    "tool name too long": ({"tools": [{**TOOL, "name": "a" * 65}]}, "tools.0.name"),
    "duplicate tools": ({"tools": [TOOL, TOOL]}, "Tool names must be unique"),
    "tool without schema": ({"tools": [{"name": "bash"}]}, "input_schema: Field required"),
    "tool schema not object": ({"tools": [{**TOOL, "input_schema": {"type": "string"}}]},
                               "input_schema.type: Input should be 'object'"),
    "tool description not str": ({"tools": [{**TOOL, "description": 3}]}, "description: Input should be"),
    "tool extra key": ({"tools": [{**TOOL, "parameters": {}}]}, "parameters: Extra inputs"),
    "system not text": ({"system": [{"type": "image", "source": {}}]}, "system.0.type"),
    "system whitespace": ({"system": [text("\t")]}, "non-whitespace text"),
    "system wrong type": ({"system": 5}, "system: Input should be"),
    "cache_control type": ({"system": [{**text("s"), "cache_control": {"type": "forever"}}]},
                           "cache_control.type: Input should be 'ephemeral'"),
    "cache_control ttl": ({"system": [{**text("s"), "cache_control": {**EPH, "ttl": "2h"}}]},
                          "ttl: Input should be '5m' or '1h'"),
    "too many breakpoints": ({"system": [{**text(f"s{i}"), "cache_control": EPH} for i in range(5)]},
                             "A maximum of 4 blocks with cache_control may be provided. Found 5."),
    "tool_choice type": ({"tool_choice": {"type": "required"}}, "tool_choice.type"),
    "tool_choice tool without name": ({"tool_choice": {"type": "tool"}}, "tool_choice.name"),
    "stream not bool": ({"extra_body": {"stream": "yes"}}, "stream: Input should be a valid boolean"),
    # tool_choice must choose among declared tools
    "tool_choice without tools": ({"tool_choice": {"type": "auto"}},
                                  "tool_choice.auto: tool_choice may only be specified while providing tools"),
    "tool_choice none, empty tools": ({"tools": [], "tool_choice": {"type": "none"}},
                                      "may only be specified while providing tools"),
    "tool_choice names unknown tool": ({"tools": [TOOL], "tool_choice": {"type": "tool", "name": "grep"}},
                                       "Tool 'grep' not found in provided tools"),
    # tool results and tool ids
    "duplicate tool_result": ({"messages": turns("x", [call()], [result(), result()])},
                              "messages.2.content.1: each tool_use must have a single result. "
                              "Found multiple `tool_result` blocks with id: toolu_a"),
    "tool_use id not str": ({"messages": turns("x", [call(id=7)], [result("toolu_a")])},
                            "messages.1.content.0.tool_use.id: Input should be a valid string"),
    "tool_use id bad pattern": ({"messages": turns("x", [call(id="call:1")], [result("call:1")])},
                                "tool_use.id: String should match pattern '^[a-zA-Z0-9_-]+$'"),
    "tool_use id empty": ({"messages": turns("x", [call(id="")], [result("")])},
                          "tool_use.id: String should match pattern"),
    "tool_use_id not str": ({"messages": turns("x", [call()], [result(None)])},
                            "messages.2.content.0.tool_result.tool_use_id: Input should be a valid string"),
    "tool_use_id bad pattern": ({"messages": turns("x", [call()], [result("toolu a")])},
                                "tool_result.tool_use_id: String should match pattern '^[a-zA-Z0-9_-]+$'"),
    # images
    "image empty data": ({"messages": turns([image(data="")])},
                         "messages.0.content.0.image.source.base64: image cannot be empty"),
    "image empty source": ({"messages": turns([{"type": "image", "source": {}}])},
                           "image.source: Unable to extract tag using discriminator 'type'"),
    "image bad media type": ({"messages": turns([image(media_type="image/tiff")])},
                             "image.source.base64.media_type: Input should be 'image/jpeg', "
                             "'image/png', 'image/gif' or 'image/webp'"),
    "image in tool_result empty": ({"messages": turns("x", [call()], [result(content=[image(data="")])])},
                                   "messages.2.content.0.content.0.image.source.base64: image cannot be empty"),
    "image in assistant turn": ({"messages": turns("x", [text("see"), image()], "ok")},
                                "messages.1.content: 'image' blocks are not permitted within assistant turns."),
    # thinking
    "thinking in user turn": ({"messages": turns([THINK, text("x")])},
                              "messages.0.content: 'thinking' blocks are not permitted within user turns."),
    "thinking without signature": ({"messages": turns("x", [{"type": "thinking", "thinking": "t"}, text("a")], "y")},
                                   "messages.1.content.0.signature: Field required"),
    "thinking signature not str": ({"messages": turns("x", [{**THINK, "signature": 5}, text("a")], "y")},
                                   "messages.1.content.0.thinking.signature: Input should be a valid string"),
    "thinking budget under 1024": (thinking(1_000),
                                   "thinking.enabled.budget_tokens: Input should be greater than or equal to 1024"),
    "thinking budget not under max_tokens": (thinking(4_000, max_tokens=4_000),
                                             "`max_tokens` must be greater than `thinking.budget_tokens`"),
    # prefill
    "prefill ends in space": ({"messages": turns("x", "The answer is ")},
                              "messages: final assistant content cannot end with trailing whitespace"),
    "prefill block ends in newline": ({"messages": turns("x", [text("Sure:\n")])},
                                      "final assistant content cannot end with trailing whitespace"),
    # output limit and sampling parameters
    "max_tokens over model limit": ({"max_tokens": 64_001, **BIG},
                                    "max_tokens: 64001 > 64000, which is the maximum allowed number "
                                    "of output tokens for claude-test"),
    "max_tokens over opus 4.1 limit": ({"model": "claude-opus-4-1", "max_tokens": 32_001, **BIG},
                                       "max_tokens: 32001 > 32000"),
    # (newer SDKs dropped temperature and top_k from create(): send them raw)
    "temperature above 1": ({"extra_body": {"temperature": 1.5}},
                            "temperature: Input should be less than or equal to 1"),
    "temperature below 0": ({"extra_body": {"temperature": -0.1}},
                            "temperature: Input should be greater than or equal to 0"),
    "temperature not number": ({"extra_body": {"temperature": "hot"}}, "temperature: Input should be a valid number"),
    "top_k not int": ({"extra_body": {"top_k": 2.5}}, "top_k: Input should be a valid integer"),
    "top_k negative": ({"extra_body": {"top_k": -1}}, "top_k: Input should be greater than or equal to 0"),
    "stop_sequences not list": ({"stop_sequences": "END"}, "stop_sequences: Input should be a valid list"),
    "stop_sequences item not str": ({"stop_sequences": ["END", 3]},
                                    "stop_sequences.1: Input should be a valid string"),
    "stop_sequences empty item": ({"stop_sequences": [""]}, "stop_sequences: each stop sequence must be non-empty"),
    "stop_sequences whitespace item": ({"stop_sequences": ["\n"]},
                                       "stop_sequences: each stop sequence must contain non-whitespace"),
    # tool input_schema must be valid JSON Schema
    "schema property not a schema": (schema(properties={"x": "number"}),
                                     "tools.0.custom.input_schema: JSON schema is invalid. "
                                     "It must match JSON Schema draft 2020-12"),
    "schema properties not object": (schema(properties=["x"]), "input_schema: JSON schema is invalid"),
    "schema unknown type": (schema(properties={"x": {"type": "str"}}), "input_schema: JSON schema is invalid"),
    "schema nested item type": (schema(properties={"x": {"type": "array", "items": {"type": "int"}}}),
                                "input_schema: JSON schema is invalid"),
    "schema required not list": (schema(properties={"x": {}}, required="x"), "input_schema: JSON schema is invalid"),
    "schema required not strings": (schema(required=[1]), "input_schema: JSON schema is invalid"),
    "schema required twice": (schema(required=["x", "x"]), "input_schema: JSON schema is invalid"),
    "schema nested anyOf type": (schema(properties={"x": {"anyOf": [{"type": "str"}]}}),
                                 "input_schema: JSON schema is invalid"),
    "schema additionalProperties": (schema(additionalProperties={"type": ["string", "string"]}),
                                    "input_schema: JSON schema is invalid"),
    "schema property key": (schema(properties={"a b": {"type": "string"}}),
                            "tools.0.custom.input_schema.properties: Property keys should match pattern"),
    # the context window, measured on the request itself
    "prompt too long": ({"messages": turns("x " * 420_000)}, "tokens > 200000 maximum"),
    # fields of the beta API (Claude Code sends them), malformed
    "defer_loading not bool": ({"tools": [{**TOOL, "defer_loading": "yes"}]},
                               "tools.0.defer_loading: Input should be a valid boolean"),
    "strict not bool": ({"tools": [{**TOOL, "strict": 1}]}, "tools.0.strict: Input should be a valid boolean"),
    "context_management extra key": ({"extra_body": {"context_management": {"edits": [], "mode": "x"}}},
                                     "context_management.mode: Extra inputs are not permitted"),
    "context_management edits not list": ({"extra_body": {"context_management": {"edits": {}}}},
                                          "context_management.edits: Input should be a valid list"),
    "context_management unknown edit": (
        {"extra_body": {"context_management": {"edits": [{"type": "clear_everything"}]}}},
        "context_management.edits.0: Input tag 'clear_everything' found using 'type' does not match "
        "any of the expected tags: 'clear_tool_uses_20250919', 'clear_thinking_20251015', 'compact_20260112'"),
    "context_management edit extra key": (
        {"extra_body": {"context_management": {"edits": [{"type": "clear_thinking_20251015", "trigger": {}}]}}},
        "context_management.edits.0.clear_thinking_20251015.trigger: Extra inputs are not permitted"),
    "clear_thinking keep": (
        {"extra_body": {"context_management": {"edits": [{"type": "clear_thinking_20251015", "keep": "some"}]}}},
        "clear_thinking_20251015.keep: Input should be a valid dictionary"),
    "clear_tool_uses keep type": (
        {"extra_body": {"context_management": {"edits": [
            {"type": "clear_tool_uses_20250919", "keep": {"type": "thinking_turns", "value": 1}}]}}},
        "clear_tool_uses_20250919.keep.type: Input should be 'tool_uses'"),
    "thinking display": ({"thinking": {"type": "adaptive", "display": "full"}},
                         "thinking.adaptive.display: Input should be 'summarized', 'omitted' or 'updates'"),
    "thinking extra key": ({"thinking": {"type": "disabled", "budget_tokens": 2_000}},
                           "thinking.disabled.budget_tokens: Extra inputs are not permitted"),
    "thinking unknown type": ({"thinking": {"type": "auto"}}, "thinking: Input tag 'auto'"),
    "output_config effort": ({"extra_body": {"output_config": {"effort": "extreme"}}},
                             "output_config.effort: Input should be 'low', 'medium', 'high', 'xhigh' or 'max'"),
    "output_config extra key": ({"extra_body": {"output_config": {"verbosity": "low"}}},
                                "output_config.verbosity: Extra inputs are not permitted"),
    "metadata extra key": ({"metadata": {"user_id": "u", "email": "a@b"}},
                           "metadata.email: Extra inputs are not permitted"),
    "metadata user_id not str": ({"metadata": {"user_id": 7}}, "metadata.user_id: Input should be a valid string"),
    # role "system" messages (mid-conversation instructions)
    "system message first": ({"messages": [{"role": "system", "content": "x"}, *HI]},
                             'messages.0.role: first message must use the "user" role, not "system"'),
    "system message extra key": ({"messages": HI + [{"role": "system", "content": "x", "name": "env"}]},
                                 "messages.1.name: Extra inputs are not permitted"),
    "system message image": ({"messages": HI + [{"role": "system", "content": [image()]}]},
                             "messages.1.content.0.type: Input should be 'text', 'tool_addition' or 'tool_removal'"),
    "system message empty text": ({"messages": HI + [{"role": "system", "content": " "}]}, "non-whitespace text"),
    "system message without content": ({"messages": HI + [{"role": "system"}]}, "messages.1.content: Field required"),
    "system message output_config format": (
        {"messages": HI + [{"role": "system", "content": "x", "output_config": {"format": None}}]},
        "messages.1.output_config.format: Extra inputs are not permitted"),
    "system message effort": ({"messages": HI + [{"role": "system", "content": "x", "output_config": {"effort": "hi"}}]},
                              "messages.1.output_config.effort: Input should be"),
    "system message clear_at": ({"messages": HI + [{"role": "system", "content": "x", "clear_at": "now"}]},
                                "messages.1.clear_at: Input should be 'next_user_message' or 'never'"),
    "tool_addition in user turn": ({"messages": turns([{"type": "tool_addition",
                                                        "tool": {"type": "tool_reference", "name": "bash"}}])},
                                   "messages.0.content: 'tool_addition' blocks are only permitted within system messages."),
    "tool_removal of a definition": (
        {"messages": HI + [{"role": "system", "content": [{"type": "tool_removal",
                                                           "tool": {"type": "tool_definition", "definition": TOOL}}]}]},
        "messages.1.content.0.tool: Input tag 'tool_definition' found using 'type' does not match"),
    "system message splits a tool call": (
        {"messages": turns("x", [call()]) + [{"role": "system", "content": "note"}, turns([result()])[0]],
         "tools": [TOOL]},
        "messages.1: tool_use ids were found without tool_result blocks immediately after"),
    "system message between two user turns": ({"messages": HI + [{"role": "system", "content": "x"}] + HI},
                                               "roles must alternate"),
}


@pytest.mark.parametrize("overrides, expected", REJECTIONS.values(), ids=REJECTIONS.keys())
def test_invalid_request_rejected(api, client, overrides, expected):
    api.script([reply("unused")])
    request = {"model": MODEL, "max_tokens": 10, "messages": HI, **copy.deepcopy(overrides)}
    with pytest.raises(anthropic.BadRequestError) as exc:
        client.messages.create(**request)
    assert exc.value.body["error"]["type"] == "invalid_request_error"
    (entry,) = api.invalid()
    assert expected in entry["error"] and expected in exc.value.message
    assert entry["step"] is None and api.remaining() == 1   # no step consumed


def test_valid_complex_history_accepted(api, client):
    # A realistic agent transcript: cached system + tools, parallel tool calls,
    # results (string, list and error forms) followed by a reminder text.
    api.script([reply("All done.")])
    tools = [
        {"name": "bash", "description": "Run a command",
         "input_schema": {"type": "object", "properties": {"command": {"type": "string"}}}},
        {**TOOL, "name": "read_file", "cache_control": EPH},
        {"type": "web_search_20250305", "name": "web_search", "max_uses": 3},
    ]
    system = [text("You are a coding agent."), {**text("Project rules..."), "cache_control": {**EPH, "ttl": "1h"}}]
    calls = [call("toolu_1", "bash"), call("toolu_2", "read_file")]
    messages = turns(
        [{**text("Fix the bug."), "cache_control": EPH}],
        [text("Looking."), *calls],
        [result("toolu_1", is_error=True),
         {"type": "tool_result", "tool_use_id": "toolu_2", "content": [text("line 1")]},
         {**text("<reminder>update todos</reminder>"), "cache_control": EPH}],
        [{"type": "thinking", "thinking": "hmm", "signature": "sig"}, call("toolu_3")],
        [result("toolu_3", content=[])],
    )
    msg = client.messages.create(model=MODEL, max_tokens=100, system=system, tools=tools,
                                 tool_choice={"type": "auto"}, messages=messages)
    assert msg.content[0].text == "All done."
    assert not api.invalid() and api.requests[0]["body"]["messages"] == messages


def test_new_rules_accept_what_the_api_accepts(api, client):
    # The other side of each rule above: the nearest valid request passes.
    api.script([reply("ok")] * 6)
    ask = lambda **kw: client.messages.create(**{"model": MODEL, "max_tokens": 10, "messages": HI, **kw})
    pictures = [image(media_type=t) for t in ("image/jpeg", "image/png", "image/gif", "image/webp")]
    ask(messages=turns([*pictures, image(type="url", url="https://example.com/a.png"), text("what?")],
                       "Trailing space mid-history is fine ", "go on"),
        extra_body={"temperature": 0, "top_k": 0}, stop_sequences=["END", "\n\nHuman:"])
    ask(messages=turns("x", [THINK, call("toolu_01-A_b")], [result("toolu_01-A_b")], "The answer is"),
        tools=[TOOL], tool_choice={"type": "tool", "name": "bash"}, extra_body={"temperature": 1})
    ask(tools=[TOOL], tool_choice={"type": "none"}, **thinking(1_024, max_tokens=1_025))
    # interleaved thinking spreads the budget over a turn: it may pass max_tokens
    ask(**thinking(8_000), extra_headers={"anthropic-beta": "interleaved-thinking-2025-05-14"})
    # the meta-schema allows boolean schemas and `required` naming an unlisted
    # property, and so does the API
    ask(tools=[{**TOOL, "input_schema": {"type": "object", "required": ["later"], "properties": {
        "any": True, "files": {"type": ["array", "null"], "items": {"type": "string"}},
        "dotted.key": {"type": "object", "properties": {"n": {"type": "integer"}}}}}}])
    ask(model="claude-sonnet-5-5", max_tokens=128_000, **BIG)
    assert not api.invalid() and api.remaining() == 0


def test_every_sdk_body_field_is_accepted(api, client):
    # An "Extra inputs" 400 for a field the SDK itself offers would make the
    # fake stricter than the service the SDK is written for.
    api.script([reply("ok")])
    fields = dict(inference_geo="us", speed="standard", diagnostics={"previous_message_id": "msg_01"},
                  user_profile_id="user_1", workspace_id="wrkspc_01", metadata={"user_id": "u"},
                  service_tier="auto")
    offered = inspect.signature(client.messages.create).parameters   # this SDK's fields, whichever
    client.messages.create(model=MODEL, max_tokens=10, messages=HI,
                           **{k: v for k, v in fields.items() if k in offered})
    assert not api.invalid() and api.remaining() == 0


def test_beta_fields_accept_what_the_sdk_defines(api):
    # The beta API's fields as its SDK types spell them (Claude Code sends most
    # of them): context management, deferred tools, system messages in the
    # conversation, thinking display, effort. Sent raw, as the beta create()
    # sends them: older SDKs in our range lack some of these arguments.
    api.script([reply("ok")] * 2)

    def beta_create(**body):
        status, raw = raw_post(api, "/v1/messages?beta=true", {"model": MODEL, **body},
                               {"x-api-key": "k", "anthropic-beta": "context-management-2025-06-27"})
        assert status == 200, raw
        return json.loads(raw)

    tools = [{**TOOL, "description": "Run a command", "strict": True, "eager_input_streaming": None,
              "input_examples": [{"command": "ls"}], "allowed_callers": ["direct"], "cache_control": EPH},
             {**TOOL, "name": "rare", "defer_loading": True},
             {"type": "tool_search_tool_bm25_20251119", "name": "tool_search"}]
    edits = [{"type": "clear_tool_uses_20250919", "trigger": {"type": "input_tokens", "value": 100_000},
              "keep": {"type": "tool_uses", "value": 3}, "clear_at_least": {"type": "input_tokens", "value": 5_000},
              "clear_tool_inputs": ["bash"], "exclude_tools": ["rare"]},
             {"type": "clear_thinking_20251015", "keep": {"type": "thinking_turns", "value": 2}},
             {"type": "compact_20260112", "instructions": "Keep the file names.", "pause_after_compaction": False}]
    env = {"role": "system", "content": [{**text("# Environment\ncwd: /w"), "cache_control": EPH}],
           "output_config": {"effort": "medium"}}
    messages = [*HI, env, {"role": "assistant", "content": [call()]},
                {"role": "user", "content": [result(), text("go on")]},
                {"role": "system", "clear_at": "next_user_message", "content": [
                    {"type": "tool_addition", "tool": {"type": "tool_reference", "name": "rare"}},
                    {"type": "tool_removal", "tool": {"type": "tool_reference", "name": "bash"}}]},
                {"role": "system", "output_config": {"effort": "low"}}]
    msg = beta_create(
        max_tokens=2_000, messages=messages, tools=tools, metadata={"user_id": None},
        thinking={"type": "adaptive", "display": "omitted"}, context_management={"edits": edits},
        output_config={"effort": "high", "task_budget": {"type": "tokens", "total": 50_000}})
    assert msg["content"][0]["text"] == "ok"
    beta_create(max_tokens=10, messages=HI, tools=[TOOL], thinking={"type": "between_tools"},
                context_management={"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]})
    assert not api.invalid() and api.remaining() == 0


def test_the_beta_fields_are_the_sdks():
    # Drift check: the validator's lists of keys against the SDK's own (beta)
    # request types. A field the SDK defines is a field the real API takes, so
    # each must be accepted (an older SDK in our range defines fewer: it skips
    # where it lacks a type).
    from typing import get_args, get_type_hints

    import fake_api

    def sdk(module, name):
        found = getattr(pytest.importorskip(f"anthropic.types.beta.{module}"), name, None)
        if found is None:
            pytest.skip(f"this anthropic has no {name}")
        return found

    def keys(typed):
        return typed.__required_keys__ | typed.__optional_keys__

    body = keys(sdk("message_create_params", "MessageCreateParamsBase")) - {"betas"}   # a header
    assert body <= fake_api._TOP_KEYS
    assert keys(sdk("beta_tool_param", "BetaToolParam")) <= fake_api._CUSTOM_TOOL_KEYS
    assert keys(sdk("beta_system_message_param", "BetaSystemMessageParam")) <= fake_api._SYSTEM_MESSAGE_KEYS
    def literal(hint):  # Required[Literal["x"]] is unwrapped on 3.11+, kept on 3.10
        while not isinstance(hint, str):
            hint = get_args(hint)[0]
        return hint

    edits = get_args(sdk("beta_context_management_config_param", "Edit"))
    for edit in edits:
        kind = literal(get_type_hints(edit)["type"])
        assert keys(edit) <= fake_api._EDIT_KEYS.get(kind, set()), kind


def test_model_limits_table():
    # (max output, context window): first match wins, so the narrower
    # prefixes must come before "claude-opus-4" and "claude-sonnet-4".
    assert model_limits("claude-opus-4-20250514") == (32_000, 200_000)
    assert model_limits("claude-opus-4-1-20250805") == (32_000, 200_000)
    assert model_limits("claude-opus-4-5-20251101") == (64_000, 200_000)
    assert model_limits("claude-opus-4-6") == (128_000, 1_000_000)
    assert model_limits("claude-sonnet-4-5") == (64_000, 200_000)
    assert model_limits("claude-sonnet-4-6") == (128_000, 1_000_000)
    assert model_limits("claude-haiku-4-5-20251001") == (64_000, 200_000)
    assert model_limits("claude-sonnet-5-5") == (128_000, 1_000_000)
    assert model_limits("claude-test") == DEFAULT_LIMITS == (64_000, 200_000)


def test_tool_result_accepts_documents_and_search_results(api, client):
    api.script([reply("read it")])
    pdf = {"type": "document", "source": {"type": "base64", "media_type": "application/pdf", "data": "JVBERi0="},
           "title": "spec.pdf"}
    note = {"type": "document", "source": {"type": "text", "media_type": "text/plain", "data": "notes"}}
    found = {"type": "search_result", "source": "https://example.com", "title": "Example",
             "content": [text("a snippet")]}
    content = [text("two files and a hit"), pdf, note, found, image()]
    msg = client.messages.create(model=MODEL, max_tokens=10, tools=[TOOL],
                                 messages=turns("x", [call()], [result(content=content)]))
    assert msg.content[0].text == "read it" and not api.invalid()


def test_documents_are_refused_in_assistant_turns(api, client):
    note = {"type": "document", "source": {"type": "text", "media_type": "text/plain", "data": "n"}}
    with pytest.raises(anthropic.BadRequestError, match="'document' blocks are not permitted within assistant"):
        client.messages.create(model=MODEL, max_tokens=10, messages=turns("x", [note], "y"))


def test_context_window_is_the_request_size(api, client):
    # The limit applies to the request's own size, with the estimate usage
    # reports (bytes / 4); a step's scripted usage is only a figure.
    api.script([reply("big but fits"), reply("scripted", usage={"input_tokens": 250_000})])
    body = {"model": MODEL, "max_tokens": 5, "messages": turns("word " * 170_000)}
    data = json.dumps(body).encode()
    status, raw = raw_post(api, "/v1/messages", data, {"x-api-key": "k"})
    assert status == 400 and json.loads(raw)["error"] == {
        "type": "invalid_request_error",
        "message": f"prompt is too long: {len(data) // 4} tokens > 200000 maximum"}
    assert api.remaining() == 2                     # no step consumed
    # a 1M-context model takes the same prompt, and bills it at that estimate
    data = json.dumps({**body, "model": "claude-sonnet-5-5"}).encode()
    status, raw = raw_post(api, "/v1/messages", data, {"x-api-key": "k"})
    assert status == 200 and json.loads(raw)["usage"]["input_tokens"] == len(data) // 4
    # counting is how a client learns a prompt is too big, so it always answers
    assert client.messages.count_tokens(model=MODEL, messages=body["messages"]).input_tokens > 200_000
    usage = client.messages.create(model=MODEL, max_tokens=5, messages=HI).usage
    assert usage.input_tokens == 250_000            # scripted, and not refused for it
    assert len(api.invalid()) == 1


def test_invalid_request_survives_a_mid_test_reset(api, client):
    # Tests reset() between phases; a bad request from an earlier phase must
    # still reach the fixture that checks invalid() at the end.
    with pytest.raises(anthropic.BadRequestError):
        client.messages.create(model=MODEL, max_tokens=0, messages=HI)
    api.reset()
    api.script([reply("fresh")])
    assert client.messages.create(model=MODEL, max_tokens=5, messages=HI).content[0].text == "fresh"
    assert len(api.requests) == 1 and api.requests[0]["valid"]     # the log did restart
    (bad,) = api.invalid()
    assert "max_tokens: Input should be greater than or equal to 1" in bad["error"]
    api.reset(full=True)                            # what the fixtures do between tests
    assert api.invalid() == []


def test_settle_waits_for_a_gone_clients_last_request(api, client):
    """A client killed just after it sent a request: settle() returns only once the
    server is done with it, so the step it takes is not one scripted later. An idle
    keep-alive connection (the SDK's pool) does not hold it up."""
    import socket
    served = threading.Event()

    def slow(body):
        time.sleep(0.3)
        served.set()
        return reply("late")
    api.script([reply("pooled"), slow])
    client.messages.create(model=MODEL, max_tokens=5, messages=HI)   # its connection stays open
    data = json.dumps({"model": MODEL, "max_tokens": 5, "messages": HI}).encode()
    with socket.create_connection(("127.0.0.1", int(api.url.rsplit(":", 1)[1]))) as sock:
        sock.sendall(b"POST /v1/messages HTTP/1.1\r\nHost: x\r\nx-api-key: k\r\nanthropic-version: 2023-06-01\r\n"
                     b"content-type: application/json\r\ncontent-length: %d\r\n\r\n%s" % (len(data), data))
    api.settle()
    assert served.is_set() and api.remaining() == 0


def test_invalid_json_rejected(api):
    status, raw = raw_post(api, "/v1/messages", b"{not json", {"x-api-key": "k"})
    assert status == 400 and "error parsing the body" in raw
    assert api.invalid()[0]["body"] is None


# --------------------------------------------------------------------------
# Failure modes the agent must survive.
# --------------------------------------------------------------------------

def test_rate_limit_error_with_retry_after(api, client):
    api.script([error(429, "slow down", headers={"retry-after": "7"})])
    with pytest.raises(anthropic.RateLimitError) as exc:
        client.messages.create(model=MODEL, max_tokens=10, messages=HI)
    assert exc.value.status_code == 429
    assert exc.value.response.headers["retry-after"] == "7"
    assert exc.value.body["error"] == {"type": "rate_limit_error", "message": "slow down"}
    assert api.requests[0]["valid"]         # a scripted error is still a valid request


def test_overloaded_error(api, client):
    # Which class the SDK maps 529 to has changed (InternalServerError, then an
    # OverloadedError beside or below it); the promise is a status error with 529
    # and the API's overloaded_error body, which s06's recovery reads.
    api.script([error(529, "Overloaded")])
    with pytest.raises(anthropic.APIStatusError) as exc:
        with client.messages.stream(model=MODEL, max_tokens=10, messages=HI) as stream:
            stream.get_final_message()
    assert exc.value.status_code == 529
    assert exc.value.body["error"]["type"] == "overloaded_error"


def test_other_error_statuses(api, client):
    api.script([error(500), error(400, "bad", error_type="custom_error")])
    with pytest.raises(anthropic.InternalServerError):
        client.messages.create(model=MODEL, max_tokens=10, messages=HI)
    with pytest.raises(anthropic.BadRequestError) as exc:
        client.messages.create(model=MODEL, max_tokens=10, messages=HI)
    assert exc.value.body["error"]["type"] == "custom_error"


def test_hangup_raises_connection_error_and_server_recovers(api, client):
    api.script([hangup(), hangup(), reply("back")])
    with pytest.raises(anthropic.APIConnectionError):
        client.messages.create(model=MODEL, max_tokens=10, messages=HI)
    with pytest.raises(anthropic.APIConnectionError):
        with client.messages.stream(model=MODEL, max_tokens=10, messages=HI) as stream:
            stream.get_final_message()
    assert client.messages.create(model=MODEL, max_tokens=10, messages=HI).content[0].text == "back"


def test_cut_stream_raises_during_iteration(api, client):
    # A stream dropped mid-body fails the iteration, after the events that did
    # arrive were delivered. Which class it raises is the SDK's choice and has
    # changed (the HTTP library's RemoteProtocolError escaped before anthropic
    # 2.17; since then the SDK wraps it as APIConnectionError), so this pins only
    # what the fake promises: the text sent so far, then a transport failure of
    # either form. What the agent does with it is s06's recovery tests' to show.
    api.script([reply("a" * 60, cut_after=5)])
    seen = []
    with pytest.raises(Exception) as exc:
        with client.messages.stream(model=MODEL, max_tokens=10, messages=HI) as stream:
            for chunk in stream.text_stream:
                seen.append(chunk)
    transport = any(c.__name__ == "TransportError" for c in type(exc.value).__mro__)  # whichever httpx
    assert isinstance(exc.value, anthropic.APIConnectionError) or transport, repr(exc.value)
    # 5 events = message_start, ping, block start, 2 text deltas.
    assert "".join(seen) == "a" * 24


def test_delay_makes_text_arrive_early(api, client):
    # 60 chars -> 5 text deltas -> 11 events, 10 delays of 0.1 s = ~1 s total;
    # the first text delta is the 4th event, at ~0.3 s.
    api.script([reply("x" * 60, delay=0.1)])
    begin, arrivals = time.monotonic(), []
    with client.messages.stream(model=MODEL, max_tokens=10, messages=HI) as stream:
        for _ in stream.text_stream:
            arrivals.append(time.monotonic() - begin)
    total = time.monotonic() - begin
    assert len(arrivals) == 5 and total >= 0.9
    assert arrivals[-1] - arrivals[0] >= 0.3      # spread over the reply, not all at its end (any load)


# --------------------------------------------------------------------------
# Scripting features.
# --------------------------------------------------------------------------

def test_callable_steps_see_the_request(api, client):
    def echo(body):
        return reply("you said: " + body["messages"][-1]["content"])

    api.script([echo, lambda body: error(429) if body.get("stream") else "plain str"])
    msg = client.messages.create(model=MODEL, max_tokens=10, messages=[{"role": "user", "content": "ping"}])
    assert msg.content[0].text == "you said: ping"
    assert api.requests[0]["step"]["content"] == [text("you said: ping")]   # the resolved step
    with pytest.raises(anthropic.RateLimitError):
        with client.messages.stream(model=MODEL, max_tokens=10, messages=HI) as stream:
            stream.get_final_message()


def test_exhausted_script_ends_quietly(api, client):
    msg = client.messages.create(model=MODEL, max_tokens=10, messages=HI)
    assert msg.content[0].text == "(script exhausted)" and msg.stop_reason == "end_turn"
    with pytest.raises(anthropic.BadRequestError):        # invalid: not counted
        client.messages.create(model=MODEL, max_tokens=0, messages=HI)
    assert api.exhausted == 1


def test_script_add_reset(api, client):
    api.script([reply("a")])
    api.script([reply("b")])                      # replaces
    api.add(reply("c"), reply("d"))               # appends
    assert api.remaining() == 3
    got = [client.messages.create(model=MODEL, max_tokens=5, messages=HI).content[0].text
           for _ in range(2)]
    assert got == ["b", "c"] and api.remaining() == 1 and len(api.requests) == 2
    api.reset()
    assert (api.remaining(), api.requests, api.exhausted) == (0, [], 0)


def test_concurrent_requests_each_take_one_step(api):
    api.script([reply(str(i)) for i in range(8)])
    answers = []

    def ask():
        c = anthropic.Anthropic(api_key="test", base_url=api.url, max_retries=0)
        answers.append(c.messages.create(model=MODEL, max_tokens=5, messages=HI).content[0].text)

    threads = [threading.Thread(target=ask) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(answers, key=int) == [str(i) for i in range(8)]
    assert api.remaining() == 0 and api.exhausted == 0


# --------------------------------------------------------------------------
# Other endpoints and HTTP-level checks.
# --------------------------------------------------------------------------

def test_missing_api_key_is_401(api):
    # The SDK always sends credentials, so send the request by hand.
    api.script([reply("unused")])
    status, raw = raw_post(api, "/v1/messages", {"model": MODEL, "max_tokens": 5, "messages": HI})
    assert status == 401 and json.loads(raw)["error"]["type"] == "authentication_error"
    assert api.invalid()[0]["error"] and api.remaining() == 1


def test_unknown_path_is_404(api, client):
    status, raw = raw_post(api, "/v1/nothing", {}, {"x-api-key": "k"})
    assert status == 404 and json.loads(raw)["error"]["type"] == "not_found_error"
    with pytest.raises(anthropic.NotFoundError):
        client.models.list()


def test_count_tokens(api, client):
    api.script([reply("unused")])
    short = client.messages.count_tokens(model=MODEL, messages=HI)
    long = client.messages.count_tokens(model=MODEL, messages=turns("word " * 200))
    assert 0 < short.input_tokens < long.input_tokens
    assert api.remaining() == 1                   # counting consumes no step
    with pytest.raises(anthropic.BadRequestError):
        client.messages.count_tokens(model=MODEL, messages=HI + HI)
    assert "roles must alternate" in api.invalid()[0]["error"]


def test_tool_blocks_need_tools_defined(api, client):
    history = [{"role": "user", "content": "x"},
               {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "bash",
                                                  "input": {}}]},
               {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1",
                                             "content": "ok"}]}]
    with pytest.raises(anthropic.BadRequestError, match="must define tools"):
        client.messages.create(model="m", max_tokens=5, messages=history)


def test_prompt_cache_reads_what_the_previous_request_wrote(api, client):
    big = "x" * 8000
    tools = [{"name": "t", "description": big, "input_schema": {"type": "object"},
              "cache_control": {"type": "ephemeral"}}]
    first = [{"role": "user", "content": [{"type": "text", "text": "hello " + big,
                                            "cache_control": {"type": "ephemeral"}}]}]
    api.script([reply("a"), reply("b"), reply("c")])
    u1 = client.messages.create(model=MODEL, max_tokens=5, tools=tools, messages=first).usage
    assert u1.cache_read_input_tokens == 0 and u1.cache_creation_input_tokens > 4000
    grown = [{"role": "user", "content": [{"type": "text", "text": "hello " + big}]},
             {"role": "assistant", "content": "a"},
             {"role": "user", "content": [{"type": "text", "text": "more",
                                           "cache_control": {"type": "ephemeral"}}]}]
    u2 = client.messages.create(model=MODEL, max_tokens=5, tools=tools, messages=grown).usage
    # the breakpoint moved to the newest message; looking back from it, the first
    # request's entry (2 blocks before) is found and read whole
    assert u2.cache_read_input_tokens == u1.cache_creation_input_tokens
    assert 0 < u2.cache_creation_input_tokens < 50          # "a" and "more" alone
    u3 = client.messages.create(model=MODEL, max_tokens=5, tools=tools, messages=grown).usage
    assert u3.cache_read_input_tokens == u2.cache_read_input_tokens + u2.cache_creation_input_tokens
    assert u3.cache_creation_input_tokens == 0


def cached_chat(n, model=MODEL, filler=600):
    """A body of n user/assistant exchanges and a new question, one breakpoint: the last answer."""
    messages = []
    for i in range(n):
        messages += [{"role": "user", "content": [text(f"q{i} " + "y" * filler)]},
                     {"role": "assistant", "content": [text(f"a{i}")]}]
    messages[-1]["content"][-1]["cache_control"] = {"type": "ephemeral"}
    return {"model": model, "max_tokens": 5, "messages": messages + [{"role": "user", "content": "now"}]}


def test_prompt_cache_looks_back_20_blocks_from_a_breakpoint():
    cache = PromptCache()
    assert cache.account(cached_chat(10))[0] == 0      # written: the prefix up to block 19
    # its breakpoint 18 blocks later (block 37, itself the first of the 20 looked at): read
    assert cache.account(cached_chat(19))[0] > 0
    cache = PromptCache()
    cache.account(cached_chat(10))
    # 20 blocks later (block 39): block 19 is the 21st position back, out of reach
    read, write = cache.account(cached_chat(20))
    assert read == 0 and write > 0


def test_prompt_cache_skips_a_prefix_below_the_models_minimum():
    cache = PromptCache()
    short = cached_chat(2, filler=300)                # ~170 tokens
    assert cache.account(short) == (0, 0)             # not cached at all: plain input
    assert cache.account(short) == (0, 0)
    long = cached_chat(2, filler=2400)                # ~1,200 tokens: past Sonnet's 1,024
    assert cache.account(long)[1] > 1024 and cache.account(long)[0] > 1024
    assert min_cacheable("claude-opus-4-6") == 4096 and min_cacheable("claude-sonnet-4-5") == 1024
    opus = dict(long, model="claude-opus-4-6")        # under Opus 4.6's 4,096: nothing
    assert PromptCache().account(opus) == (0, 0)


def test_prompt_cache_entries_belong_to_one_model():
    cache = PromptCache()
    long = cached_chat(2, filler=2400)
    cache.account(long)
    assert cache.account(dict(long, model="claude-sonnet-4-6"))[0] == 0


def test_prompt_cache_a_changed_tool_choice_or_thinking_reads_no_cached_message():
    """The docs' table of what invalidates the cache: a change of tool_choice or of the
    thinking settings invalidates the message blocks' entries (tools and system stay
    cached). A summary call (tool_choice none) read the whole conversation back."""
    system = [{"type": "text", "text": "s" * 8000, "cache_control": {"type": "ephemeral"}}]   # ~2,000 tokens
    chat = dict(cached_chat(4, filler=2400), system=system)
    cache = PromptCache()
    cache.account(chat)
    assert cache.account(chat)[0] > 4000                                     # the messages are read back
    for changed in ({"tool_choice": {"type": "none"}}, {"thinking": {"type": "enabled", "budget_tokens": 2048}}):
        read, _ = cache.account(dict(chat, **changed))
        assert 1900 < read < 2100, (changed, read)                           # the system prompt only
    assert cache.account(dict(chat, tool_choice={"type": "auto"}))[0] > 4000  # auto is the default: unchanged
