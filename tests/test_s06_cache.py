"""s06 prompt caching seen from the server: each turn reads what the last one wrote.

The scripted API simulates the prompt cache by prefix (fake_api.PromptCache),
so these tests hold the chapter to what a real bill would show, not to where
it happens to put cache_control.
"""
import pytest

from conftest import chapters_from
from fake_api import PromptCache, reply, tool

each = pytest.mark.parametrize("mod", chapters_from("s06"), indirect=True)


def bills(api):
    cache = PromptCache()
    return [cache.account(r["body"]) for r in api.requests if r["path"].endswith("/messages")]


@each
def test_each_turn_reads_what_the_last_one_wrote(mod, api, client, workspace):
    for i in range(4):
        (workspace / f"f{i}.txt").write_text(f"file {i}\n" * 400)
    api.script([reply(tool("read_file", {"path": f"f{i}.txt"})) for i in range(4)] + [reply("done")])
    assert mod.agent_loop(client, [{"role": "user", "content": "read them all"}]) == "end_turn"
    bill = bills(api)
    assert bill[0][0] == 0 and bill[0][1] > 0                  # the first request writes
    for (read0, write0), (read1, write1) in zip(bill, bill[1:]):
        assert read1 == read0 + write0                        # ...and every later one reads it all
        assert 0 < write1 < 2_500                             # writing only the new turn (~1.7K)


@each
def test_breakpoints_stay_within_the_api_limit_in_a_long_session(mod, api, client, workspace):
    (workspace / "a.txt").write_text("a\n")
    api.script([reply(tool("read_file", {"path": "a.txt"})) for _ in range(12)] + [reply("done")])
    assert mod.agent_loop(client, [{"role": "user", "content": "again and again"}]) == "end_turn"
    for r in api.requests:       # the server rejects > 4; also check the stable prefix is marked
        body = r["body"]
        assert "cache_control" in body["tools"][-1]
        system = body["system"]
        assert isinstance(system, list) and "cache_control" in system[-1]
