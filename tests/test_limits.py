"""Documented limits: each default pinned to the figure the docs give, and each
cap seen working at its default, not at a value a test lowered.

A test that lowers a limit (monkeypatch) proves the mechanism; these prove the
number. Figures are written out as literals on purpose: compared with the
module's own constant, a wrong default would pass.
"""
import pytest

from conftest import CHAPTERS, chapters_from, run_turn
from fake_api import reply, text, tool

# (constant, documented value, first chapter that has it)
DEFAULTS = [
    ("MAX_TOKENS", 8_000, "s01"), ("MAX_TURNS", 50, "s01"), ("BASH_TIMEOUT", 120, "s01"),
    ("BASH_MAX_TIMEOUT", 600, "s01"), ("MAX_OUTPUT", 30_000, "s01"),
    ("READ_LINES", 2_000, "s02"), ("MAX_LINE", 2_000, "s02"), ("GLOB_LIMIT", 200, "s02"),
    ("GREP_LIMIT", 250, "s02"), ("MAX_PARALLEL", 8, "s02"),
    ("MAX_TODOS", 20, "s03"), ("PLAN_REMINDER_INTERVAL", 3, "s03"),
    ("SUBAGENT_MAX_TURNS", 30, "s04"),
    ("CONTEXT_WINDOW", 200_000, "s06"), ("OUTPUT_RESERVE", 20_000, "s06"),
    ("SAFETY_MARGIN", 13_000, "s06"), ("AUTO_COMPACT_AT", 167_000, "s06"),
    ("FORCE_COMPACT_AT", 177_000, "s06"), ("MAX_COMPACT_FAILURES", 3, "s06"),
    ("KEEP_TAIL_TOKENS", 10_000, "s06"), ("KEEP_TAIL_MESSAGES", 5, "s06"),
    ("REATTACH_FILES", 5, "s06"), ("REATTACH_CHARS", 20_000, "s06"),
    ("SUMMARY_MAX_TOKENS", 16_000, "s06"), ("PERSIST_CHARS", 30_000, "s06"),
    ("MESSAGE_BUDGET_CHARS", 90_000, "s06"), ("PREVIEW_CHARS", 2_000, "s06"),
    ("KEEP_BASH_CHARS", 5_000_000, "s06"), ("WORKING_BUDGET", 20_000, "s06"),
    ("KEEP_RESULTS", 1, "s06"), ("CLEAR_PAYBACK", 10, "s06"), ("CACHE_TTL", 300, "s06"),
    ("MAX_CONTINUATIONS", 3, "s06"), ("MAX_RETRIES", 4, "s06"),
    ("MAX_TEAMMATES", 10, "s11"), ("MESSAGE_CHARS", 8_000, "s11"), ("INBOX_BYTES", 100_000, "s11"),
    ("IDLE_POLL", 1.0, "s11"), ("IDLE_TIMEOUT", 600, "s11"), ("SHUTDOWN_GRACE", 10, "s11"),
    ("KILL_WAIT", 3, "s11"), ("PERMISSION_WAIT", 300, "s11"), ("LOG_BYTES", 1_000_000, "s11"),
    ("LOCK_WAIT", 10, "s11"), ("NEWS_KEPT", 200_000, "s11"), ("FAILED_PAUSE", 60, "s11"),
    ("JOIN_WAIT", 30, "s11"),
]
PINS = [(name, value, chapter) for name, value, first in DEFAULTS for chapter in chapters_from(first)]


@pytest.mark.parametrize("mod,name,value", [(c, n, v) for n, v, c in PINS],
                         ids=[f"{c}-{n}" for n, _, c in PINS], indirect=["mod"])
def test_documented_default(mod, name, value):
    assert getattr(mod, name) == value


@pytest.mark.parametrize("mod", chapters_from("s06"), indirect=True)
def test_context_limits_fit_together(mod):
    # the clearing budget is reached long before compaction is due
    assert mod.WORKING_BUDGET < mod.AUTO_COMPACT_AT < mod.FORCE_COMPACT_AT < mod.CONTEXT_WINDOW
    # the summary a compaction writes fits in the room kept free for it
    assert mod.SUMMARY_MAX_TOKENS <= mod.OUTPUT_RESERVE
    # a request just under the forced line still leaves room for a whole reply
    assert mod.FORCE_COMPACT_AT + mod.MAX_TOKENS <= mod.CONTEXT_WINDOW
    # the kept tail alone never puts the context over the clearing budget
    assert mod.KEEP_TAIL_TOKENS < mod.WORKING_BUDGET
    # a batch clear must free about half the messages (repaid within 10 requests: s06's notes)
    rewrite = mod.CACHE_WRITE_PRICE - mod.CACHE_READ_PRICE
    assert 0.50 < rewrite / (mod.CACHE_READ_PRICE * (mod.CLEAR_PAYBACK + 1) + rewrite) < 0.52
    # a saved result's preview is far shorter than what gets saved; one result
    # at the persist line fits in a message's budget
    assert mod.PREVIEW_CHARS < mod.PERSIST_CHARS <= mod.MESSAGE_BUDGET_CHARS
    assert mod.PERSIST_CHARS <= mod.KEEP_BASH_CHARS


@pytest.mark.parametrize("mod", CHAPTERS, indirect=True)
def test_tool_descriptions_state_the_real_limits(mod):
    """What the model is told matches what the code does."""
    specs = {t["name"]: t for t in mod.TOOLS}
    assert "30,000 characters" in specs["bash"]["description"]
    assert "(default 120)" in specs["bash"]["input_schema"]["properties"]["timeout"]["description"]
    if "glob" in specs:
        assert "at most 200" in specs["glob"]["description"]
        assert "(default 2000)" in specs["read_file"]["input_schema"]["properties"]["limit"]["description"]


# --- caps seen working at their defaults ------------------------------------------

@pytest.mark.parametrize("mod", CHAPTERS, indirect=True)
def test_every_request_asks_for_the_documented_max_tokens(mod, api, client):
    run_turn(mod, api, client, [reply(tool("bash", {"command": "true"}))])
    assert [r["body"]["max_tokens"] for r in api.requests] == [8_000, 8_000]


@pytest.mark.parametrize("mod", chapters_from("s06"), indirect=True)
def test_the_summary_request_asks_for_the_documented_max_tokens(mod, api, client):
    history = [{"role": "user", "content": "start"}]
    for r in range(4):
        history += [{"role": "assistant", "content": [text(f"round {r}")]},
                    {"role": "user", "content": f"next {r}"}]
    history.append({"role": "assistant", "content": [text("done")]})
    api.script([reply("<summary>S</summary>")])
    mod.compact_now(client, history)
    assert [r["body"]["max_tokens"] for r in api.requests] == [16_000]


@pytest.mark.slow("s01")                               # 50 model calls: s01 and the newest file
@pytest.mark.parametrize("mod", CHAPTERS, indirect=True)
def test_a_runaway_turn_stops_after_fifty_calls(mod, api, client):
    api.script([reply(tool("bash", {"command": "true"})) for _ in range(51)])
    history = [{"role": "user", "content": "loop forever"}]
    assert mod.agent_loop(client, history) == "max_turns"
    assert len(api.requests) == 50 and api.remaining() == 1


@pytest.mark.slow("s04")                               # 32 model calls: s04 and the newest file
@pytest.mark.parametrize("mod", chapters_from("s04"), indirect=True)
def test_a_runaway_subagent_stops_after_thirty_calls(mod, api, client):
    call = tool("agent", {"prompt": "keep looking", "description": "runaway"})
    busy = [reply(text(f"step {k}"), tool("glob", {"pattern": "*"})) for k in range(30)]
    run_turn(mod, api, client, [reply(call)] + busy)   # one more child call would eat "Finished."
    assert len(api.requests) == 1 + 30 + 1
    result = api.requests[31]["body"]["messages"][-1]["content"][0]
    assert result["tool_use_id"] == call["id"] and result["is_error"]
    assert "30 turns" in result["content"] and "30 model calls" in result["content"]
    assert "step 29" in result["content"]


@pytest.mark.parametrize("mod", chapters_from("s06"), indirect=True)
@pytest.mark.parametrize("results,cleared", [(5, False), (6, True)])
def test_old_results_are_cleared_past_twenty_thousand_tokens_of_results(mod, api, client, workspace,
                                                                       results, cleared):
    # Results of ~3,770 tokens each (beside the floor: tools, system, prompts): five
    # free ~18.9K, six ~22.6K. Clearing all but the newest then frees far more than a
    # batch must (half the messages), so only the budget decides.
    for r in range(results):
        (workspace / f"log{r}.txt").write_text(f"LOG-{r}\n" + ("z" * 99 + "\n") * 150)
    calls = [tool("bash", {"command": f"cat log{r}.txt"}) for r in range(results)]
    api.script([reply(c) for c in calls] + [reply("read them")])
    history = [{"role": "user", "content": "read the logs"}]
    assert mod.agent_loop(client, history) == "end_turn"
    mod.add_user_text(history, "and now?")
    api.script([reply("ok")])
    assert mod.agent_loop(client, history) == "end_turn"
    sent = {b["tool_use_id"]: b["content"] for m in api.requests[-1]["body"]["messages"]
            if isinstance(m["content"], list) for b in m["content"] if b["type"] == "tool_result"}
    assert ["old tool result cleared" in sent[c["id"]] for c in calls] == [cleared] * (results - 1) + [False]


@pytest.mark.parametrize("mod", chapters_from("s02"), indirect=True)
def test_grep_shows_250_matches_then_says_how_many_more(mod, workspace):
    (workspace / "hits.txt").write_text("".join(f"hit {n}\n" for n in range(300)))
    out = mod.run_tool(_block("grep", pattern="hit", output_mode="content"))["content"].splitlines()
    assert len(out) == 251 and out[249] == "hits.txt:250:hit 249"
    assert out[-1].startswith("[50 more not shown")


@pytest.mark.parametrize("mod", chapters_from("s02"), indirect=True)
def test_grep_output_is_cut_at_thirty_thousand_characters(mod, workspace):
    (workspace / "wide.txt").write_text("".join(f"hit {n:03} " + "w" * 200 + "\n" for n in range(200)))
    out = mod.TOOL_HANDLERS["grep"](pattern="hit", output_mode="content")   # before any spill to disk
    assert out.startswith("wide.txt:1:hit 000 ") and "[truncated: " in out
    assert 30_000 < len(out) < 30_000 + 100


@pytest.mark.parametrize("mod", [c for c in CHAPTERS if c not in chapters_from("s06")], indirect=True)
def test_long_bash_output_is_cut_at_thirty_thousand_characters(mod, workspace):
    out = mod.run_bash("python3 -c \"print('x' * 40_000)\"")
    assert out == "x" * 30_000 + "\n... [truncated: 10001 more characters]"


# --- tool input types -----------------------------------------------------------

def _block(name, **args):
    from types import SimpleNamespace
    return SimpleNamespace(id="toolu_limits", name=name, input=args)


@pytest.mark.parametrize("mod", chapters_from("s02"), indirect=True)
@pytest.mark.parametrize("name,args", [
    ("read_file", {"path": "a.txt", "offset": True}),
    ("read_file", {"path": "a.txt", "limit": False}),
    ("bash", {"command": "echo hi", "timeout": True}),
])
def test_a_boolean_is_not_an_integer(mod, workspace, name, args):
    (workspace / "a.txt").write_text("one\ntwo\n")
    result = mod.run_tool(_block(name, **args))
    assert result.get("is_error") and "must be of type integer" in result["content"]
