"""agent_full's request body (full.6: request_body, open_stream): regressions from
its review. Each test fails on the code of full.6 as first written. The reference
is what the loop sent before full.6: client.messages.stream(...,
messages=request_messages(history)), i.e. the history made from scratch.
"""
import json
import warnings

import pytest

from conftest import message_bodies
from fake_api import reply, tool

pytestmark = pytest.mark.parametrize("mod", ["agent_full"], indirect=True)


def scratch(mod, history):
    """The messages a request carries, made from scratch (as test_history_cache's old_request)."""
    out = mod.shown_messages(history)
    for m in out[-1:-4:-2]:
        m["content"][-1] = {**m["content"][-1], "cache_control": mod.EPHEMERAL}
    return json.loads(json.dumps(out))


def old_history(turns=8):
    """A resumed session's history: plain messages, none of them seen by this agent's view."""
    h = []
    for i in range(turns):
        h += [{"role": "user", "content": f"question {i}"},
              {"role": "assistant", "content": [{"type": "text", "text": f"answer {i}"}]}]
    return h


def interrupt_once(mod, monkeypatch, at):
    """to_json as it is, except that the `at`-th call is where a Ctrl+C lands."""
    real, calls = mod.to_json, [0]

    def to_json(obj):
        calls[0] += 1
        if calls[0] == at:
            raise KeyboardInterrupt
        return real(obj)
    monkeypatch.setattr(mod, "to_json", to_json)
    return lambda: monkeypatch.setattr(mod, "to_json", real)


# --- 1: a Ctrl+C while the kept JSON is made -----------------------------------------------------

def test_a_ctrl_c_while_the_messages_are_encoded_leaves_the_next_body_whole(mod, monkeypatch):
    """done_json adds each message to json_of / json_ends as it goes but stores the joined
    text only at the end: interrupted half way, the lists name messages the text lacks, and
    every later body is cut wrong (here: not JSON at all)."""
    h = old_history() + [{"role": "user", "content": "and now?"}]
    restore = interrupt_once(mod, monkeypatch, at=4)
    with pytest.raises(KeyboardInterrupt):
        mod.request_body("m", 9, [], [], h)
    restore()
    body = mod.request_body("m", 9, [], [], h)
    assert json.loads(body)["messages"] == scratch(mod, h)


def test_after_a_ctrl_c_in_a_resumed_session_the_next_turn_still_reaches_the_model(mod, api, client,
                                                                                   monkeypatch):
    """The same, as the human meets it: Ctrl+C during the first request of a resumed
    session (every message is encoded then), then a new prompt. The API gets a body it
    cannot parse, every turn after fails with a 400, until the view starts again."""
    history = old_history() + [{"role": "user", "content": "where were we?"}]
    restore = interrupt_once(mod, monkeypatch, at=5)
    assert mod.agent_loop(client, history) == "interrupted"
    restore()
    mod.add_user_text(history, "go on")
    api.script([reply("going on")])
    assert mod.agent_loop(client, history) == "end_turn"
    assert message_bodies(api)[-1]["messages"] == scratch(mod, history[:-1])


# --- 2: what client.messages.stream did besides sending the body ---------------------------------

def sdk_stream(client, model="claude-test"):
    """One request as the SDK's own client.messages.stream makes it: the reference."""
    with client.messages.stream(model=model, max_tokens=9, messages=[{"role": "user", "content": "hi"}]) as s:
        s.get_final_message()


def deprecation_warnings(api, call):
    """The DeprecationWarnings one call raises, as (category, text)."""
    api.script([reply("hi")])
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        call()
    return [(w.category, str(w.message)) for w in seen if issubclass(w.category, DeprecationWarning)]


# Models past their end of life: candidates to ask the SDK about, besides its own list.
RETIRED = ("claude-3-opus-20240229", "claude-3-sonnet-20240229", "claude-2.1", "claude-2.0",
           "claude-3-5-sonnet-20240620", "claude-3-5-sonnet-20241022")


def test_a_deprecated_model_still_gets_the_sdks_deprecation_warning(mod, api, client):
    """client.messages.stream warns when the model is past its deprecation date: client.post
    says nothing, so open_stream must warn as the SDK would. The reference is the SDK's
    own stream, asked about each candidate; wherever it warns, ours must warn too, of
    the same category and naming the model (the wording is the SDK's to change)."""
    import anthropic
    listed = getattr(getattr(getattr(anthropic, "resources", None), "messages", None), "messages", None)
    candidates = [*getattr(listed, "DEPRECATED_MODELS", {}), *RETIRED]
    model = next((m for m in dict.fromkeys(candidates)
                  if deprecation_warnings(api, lambda: sdk_stream(client, m))), None)
    if model is None:
        pytest.skip("the SDK's own stream warns about none of the candidate models: no warning to keep")
    ours = deprecation_warnings(api, lambda: mod.call_model(client, [{"role": "user", "content": "hi"}],
                                                            model=model))
    assert any(model in text for _, text in ours), ours


def test_the_request_carries_the_stream_helpers_headers(mod, api, client):
    """client.messages.stream adds its helper headers (X-Stainless-Helper-Method: stream,
    X-Stainless-Stream-Helper: messages in 2.x) to each request; the body sent by hand
    lacked them. The reference is the SDK's own stream request, header for header."""
    api.script([reply("hi"), reply("hi")])
    sdk_stream(client)
    mod.call_model(client, [{"role": "user", "content": "hi"}])
    sdk, ours = [r["headers"] for r in api.requests if r["path"].split("?")[0] == "/v1/messages"]
    assert {k: v for k, v in ours.items() if k != "content-length"} == \
        {k: v for k, v in sdk.items() if k != "content-length"}


# --- 3: memory ------------------------------------------------------------------------------------

def test_after_clear_the_view_no_longer_holds_the_old_conversation(mod, api, client, workspace):
    """/clear empties the history, and s06.15's view lets go of its messages at the next
    request; the kept JSON (json, json_of) is cut only by a request of 4 messages or
    more, so a long conversation stays in memory through every short one after /clear."""
    (workspace / "big.txt").write_text("OLD-CONVERSATION " * 2_000)
    history = [{"role": "user", "content": "read big.txt"}]
    api.script([reply(tool("read_file", {"path": "big.txt"})), reply(tool("read_file", {"path": "big.txt"})),
                reply("read")])
    assert mod.agent_loop(client, history) == "end_turn"
    mod.clear_command("", {"client": client, "history": history})
    mod.add_user_text(history, "a short question")
    api.script([reply("a short answer")])
    assert mod.agent_loop(client, history) == "end_turn"
    view = mod.agent_state().view
    held = view.get("json", b"").decode() + "".join(json.dumps(m) for m in view.get("json_of", []))
    assert "OLD-CONVERSATION" not in held
