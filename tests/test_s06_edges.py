"""s06 details a test of the main path would not notice: what a compaction leaves
behind, the summary call's own recovery, a subagent's bill with the prompt
cache at work, and where a saved result's preview ends."""
import json

import pytest

from conftest import chapters_from, run_turn, message_bodies
from fake_api import error, reply, text, tool

each = pytest.mark.parametrize("mod", chapters_from("s06"), indirect=True)

SUMMARY = "<summary>1. Primary request: SUMMARY-TEXT</summary>"
TOO_LONG = "prompt is too long: 210000 tokens > 200000 maximum"


def kinds(api):
    return ["summary" if b.get("tool_choice") == {"type": "none"} else "main" for b in message_bodies(api)]


def history_of(rounds, size=200):
    h = [{"role": "user", "content": "start the work"}]
    for r in range(rounds):
        i = f"toolu_e{r:02d}"
        h.append({"role": "assistant", "content": [
            text(f"round {r}"), {"type": "tool_use", "id": i, "name": "bash", "input": {"command": "true"}}]})
        h.append({"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": i, "content": f"out {r} " + "x" * size}]})
    h.append({"role": "assistant", "content": [text("All rounds done.")]})
    return h


# --- what a compaction leaves behind ----------------------------------------------

@each
def test_a_compaction_drops_the_size_measured_before_it(mod, api, client):
    # The last request reported 170K tokens; /compact then shrinks the history.
    # Kept on the tail, that figure would still read ~170K and compact again.
    steps = [reply(tool("bash", {"command": f"echo {n}"})) for n in range(3)]
    api.script(steps + [reply("done", usage={"input_tokens": 170_000, "output_tokens": 10})])
    history = [{"role": "user", "content": "count to three"}]
    assert mod.agent_loop(client, history) == "end_turn"
    assert mod.context_tokens(history) >= 170_000
    api.script([reply(SUMMARY)])
    mod.compact_now(client, history)
    assert "SUMMARY-TEXT" in json.dumps(history[0])
    assert not any("_usage" in m for m in history) and mod.context_tokens(history) is None
    mod.add_user_text(history, "go on")
    api.script([reply("fine")])
    assert mod.agent_loop(client, history) == "end_turn"
    assert kinds(api) == ["main"] * 4 + ["summary", "main"]


@each
def test_a_prompt_too_long_summary_call_is_retried_without_the_oldest_turns(mod, api, client):
    history = history_of(10)
    api.script([error(400, TOO_LONG), reply(SUMMARY)])
    mod.compact_now(client, history)
    assert kinds(api) == ["summary", "summary"]
    first, second = (b["messages"] for b in message_bodies(api))
    assert len(second) < len(first)
    assert "start the work" in json.dumps(first) and "start the work" not in json.dumps(second)
    assert json.dumps(first[-2]) == json.dumps(second[-2])      # the newest turns stay
    assert "SUMMARY-TEXT" in json.dumps(history[0])             # and the compaction happened


# --- a subagent's bill ---------------------------------------------------------------

@each
def test_a_subagents_bill_counts_the_tokens_read_from_the_cache(mod, api, client, monkeypatch,
                                                              capsys):
    seen = []                           # every reply's usage, as the SDK parsed it
    real = mod.after_call
    monkeypatch.setattr(mod, "after_call", lambda messages, m: seen.append(m.usage) or real(messages, m))
    call = tool("agent", {"prompt": "look around", "description": "look"})
    # no usage scripted: the server's cache simulation reports reads and writes
    run_turn(mod, api, client, [reply(call), reply(tool("glob", {"pattern": "*"})),
                                reply(tool("glob", {"pattern": "*.py"})), reply("CHILD REPORT")])
    child = seen[1:4]
    assert all(u.cache_read_input_tokens > 0 for u in child[1:])   # the cache is really read
    total = sum(u.input_tokens + u.cache_read_input_tokens + u.cache_creation_input_tokens
                for u in child)
    assert total > 10 * sum(u.input_tokens for u in child)         # mostly cached, so it matters
    out = sum(u.output_tokens for u in child)
    assert f"[subagent look: 3 model calls, {total} input + {out} output tokens]" in capsys.readouterr().err


# --- a saved result's preview ------------------------------------------------------------

def persisted(mod, content):
    block = {"type": "tool_result", "tool_use_id": "toolu_pv", "content": content}
    mod.persist_output(block)
    shown = block["content"]
    head, _, rest = shown.partition(" characters):\n")
    assert rest.endswith("\n</persisted-output>")
    preview = rest.removesuffix("\n</persisted-output>")
    assert head.endswith(f"Preview (first {len(preview):,}")
    return preview


@each
def test_a_preview_ends_at_a_line_end(mod, workspace):
    full = "".join(f"line {n:05} of the output, padded\n" for n in range(2_000))   # 36 chars a line
    preview = persisted(mod, full)
    assert full.startswith(preview + "\n")                     # whole lines only
    assert 2_000 // 2 < len(preview) <= 2_000
    assert len(preview) == 2_000 // 36 * 36 - 1


@each
def test_a_preview_without_a_late_line_end_is_cut_at_the_preview_size(mod, workspace):
    full = "short\n" + "y" * 50_000
    assert persisted(mod, full) == full[:2_000]
