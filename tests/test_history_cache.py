"""What the loop keeps between model calls instead of passing over the whole
history again: the agent's view of its history (s06), and the parsed skill
files (s05). Each cached result must equal the one made from scratch, on
random histories edited the ways the chapters edit them (messages added, taken
back and replaced, the newest and the first changed in place, results cleared,
compactions), and in real loops with batch clears and a compaction.
"""
import copy
import json
import math
import os
import random
import threading

import anthropic
import pytest

from conftest import chapters_from, message_bodies
from fake_api import reply, tool

from_s05 = pytest.mark.parametrize("mod", chapters_from("s05"), indirect=True)
from_s06 = pytest.mark.parametrize("mod", chapters_from("s06"), indirect=True)


# --- the view, against shown_messages ----------------------------------------------------------

class Histories:
    """Random histories, edited as the loop and the later chapters edit them."""

    def __init__(self, mod, seed):
        self.mod, self.rng, self.ids, self.h = mod, random.Random(seed), 0, []

    def block(self, role):
        rng = self.rng
        if role == "assistant":
            if rng.random() < 0.4:
                self.ids += 1
                n = self.ids if rng.random() < 0.9 else rng.randint(1, self.ids)  # now and then a repeat
                return {"type": "tool_use", "id": f"t{n}", "name": "read_file", "input": {"path": "x"}}
            return {"type": "text", "text": rng.choice(["", "  ", "hi", "answer ü"])}
        if rng.random() < 0.5:  # a result, maybe for no call of the reply before it
            call = rng.randint(max(1, self.ids - 3), self.ids + 1)
            saved = "<persisted-output>\nsaved to: a/b.txt\n" + "y" * 200
            b = {"type": "tool_result", "tool_use_id": f"t{call}",
                 "content": rng.choice(["r", "x" * 300, saved])}
            if rng.random() < 0.3:
                b["_sent"] = True
            return b
        return {"type": "text", "text": self.rng.choice(["", "q", "  ", "prompt"])}

    def message(self):
        role = self.rng.choice(["user", "assistant"])
        if self.rng.random() < 0.2:
            return {"role": role, "content": self.rng.choice(["", "text", "  "])}
        return {"role": role, "content": [self.block(role) for _ in range(self.rng.randint(0, 3))]}

    def edit(self):
        h, rng, k = self.h, self.rng, self.rng.random()
        if k < 0.35 or not h:
            h.append(self.message())
        elif k < 0.42:
            h.pop()                                                   # an empty reply taken back
        elif k < 0.52:                                                # results join the newest message,
            m = rng.choice([h[0], h[-1]])                             # reminders the first
            if isinstance(m["content"], list):
                m["content"].append(self.block(m["role"]))
        elif k < 0.58:
            i = rng.choice([0, len(h) - 1])
            h[i]["content"] = self.message()["content"]               # a content list replaced
        elif k < 0.64:
            h[rng.randrange(len(h))] = self.message()                 # a message replaced
        elif k < 0.72:
            for b in self.mod.tool_results(h):
                b["_sent"] = True
            self.mod.clear_old_results(h, rng.choice([0, 0, 50, 10 ** 6]))
        elif k < 0.77:                                                # a compaction: a new first
            del h[:rng.randint(0, len(h))]                            # message, the tail kept
            h.insert(0, {"role": "user", "content": [{"type": "text", "text": "summary"}]})
        elif k < 0.82 and isinstance(h[-1]["content"], list) and h[-1]["content"]:
            b = h[-1]["content"][-1]                                  # the newest result fitted
            if b["type"] == "tool_result":
                b["content"] = "fitted"
        elif k < 0.86:
            h[:] = [copy.deepcopy(m) for m in h]                      # a resumed session
        else:
            h.append(self.message())
            h.append(self.message())


REPLY = anthropic.types.Message(id="msg_1", type="message", role="assistant", model="m", content=[],
                                stop_reason="end_turn", stop_sequence=None,
                                usage=anthropic.types.Usage(input_tokens=10, output_tokens=1))


def old_request(mod, messages):
    """request_messages as it was: the marks on the from-scratch view."""
    out = mod.shown_messages(messages)
    for m in out[-1:-4:-2]:
        m["content"][-1] = {**m["content"][-1], "cache_control": mod.EPHEMERAL}
    return out


def old_clear(mod, messages, min_tokens):
    """clear_old_results as it was, from scratch: which results it would clear."""
    results = mod.tool_results(messages)
    old = results[:-mod.KEEP_RESULTS] if mod.KEEP_RESULTS else results
    fresh = [b for b in old if b.get("_sent") and not b.get("_cleared")
             and len(str(b.get("content"))) > len(mod.cleared_stub(b)["content"])]
    if sum(mod.estimate_tokens(b["content"]) - mod.estimate_tokens(mod.cleared_stub(b)["content"])
           for b in fresh) < min_tokens:
        return []
    return fresh


@from_s06
@pytest.mark.parametrize("seed", range(6))
def test_the_kept_view_equals_the_view_made_from_scratch(mod, seed):
    hs = Histories(mod, seed)
    for trial in range(25):
        mod.agent_state().view, hs.h[:] = mod.new_view(), []
        for step in range(40):
            hs.edit()
            h = hs.h
            scratch = mod.shown_messages(h)
            assert mod.shown_view(h) == scratch, (trial, step)
            assert mod.view_tokens(h) == mod.estimate_tokens(scratch) == len(json.dumps(
                scratch, ensure_ascii=False, default=str)) // 4
            assert mod.request_messages(h) == old_request(mod, h)   # the marks went on copies
            if hasattr(mod, "request_body"):                         # full.6: the bytes sent, each message
                assert json.loads(mod.request_body("m", 9, [], [], h)) == {  # encoded once
                    "model": "m", "max_tokens": 9, "system": [], "tools": [], "stream": True,
                    "messages": json.loads(json.dumps(old_request(mod, h)))}, (trial, step)
            assert mod.shown_view(h + [{"role": "assistant", "content": "prefill"}]) == \
                mod.shown_messages(h + [{"role": "assistant", "content": "prefill"}])


@from_s06
@pytest.mark.parametrize("seed", range(4))
def test_the_batch_clear_and_the_sent_marks_equal_the_full_pass(mod, seed, monkeypatch):
    monkeypatch.setattr(mod, "KEEP_RESULTS", seed % 3)
    hs = Histories(mod, 100 + seed)
    for trial in range(20):
        mod.agent_state().view, hs.h[:] = mod.new_view(), []
        for step in range(40):
            hs.edit()
            h, least = hs.h, hs.rng.choice([0, 30, 200, 10 ** 6])
            twin = copy.deepcopy(h)
            chosen = {id(b) for b in old_clear(mod, twin, least)}
            expected = [i for i, b in enumerate(mod.tool_results(twin)) if id(b) in chosen]
            assert mod.clear_old_results(h, least) == len(expected)
            assert [i for i, b in enumerate(mod.tool_results(h)) if b.get("_cleared")] == sorted(
                {i for i, b in enumerate(mod.tool_results(twin)) if b.get("_cleared")} | set(expected))
            if h and hs.rng.random() < 0.7:
                mod.after_call(h, REPLY)                             # marks every result sent
                assert all(b.get("_sent") for b in mod.tool_results(h)), (trial, step)


@from_s06
def test_views_belong_to_their_agent_and_work_where_none_runs(mod, tmp_path):
    a = [{"role": "user", "content": "for a"}, {"role": "assistant", "content": "A"}]
    b = [{"role": "user", "content": "for b"}]
    assert mod.view_tokens(a) == mod.estimate_tokens(mod.shown_messages(a))
    with mod.acting_as(mod.AgentState(tmp_path)):
        assert mod.shown_view(b) == mod.shown_messages(b)
    assert mod.agent_state().view["messages"] == a                 # the outer agent's is its own
    seen = []
    thread = threading.Thread(target=lambda: seen.append(mod.view_tokens(a)))  # no agent there
    thread.start()
    thread.join()
    assert seen == [mod.estimate_tokens(mod.shown_messages(a))]


# --- the view, in the loop -----------------------------------------------------------------------

SUMMARY = "<analysis>draft</analysis><summary>SUMMARY-TEXT: the files were read.</summary>"


@from_s06
def test_every_request_and_size_of_a_long_loop_equals_the_full_pass(mod, api, client, workspace,
                                                                    monkeypatch):
    monkeypatch.setattr(mod, "WORKING_BUDGET", 1_000)             # batch clears along the way
    monkeypatch.setattr(mod, "CLEAR_PAYBACK", math.inf)          # (each pays: results are small)
    requests, sizes = [], []
    real_request, real_tokens = mod.request_messages, mod.view_tokens

    def request(messages):
        requests.append((real_request(messages), old_request(mod, messages)))
        return requests[-1][0]

    def tokens(messages):
        sizes.append((real_tokens(messages), mod.estimate_tokens(mod.shown_messages(messages))))
        return sizes[-1][0]
    monkeypatch.setattr(mod, "request_messages", request)
    monkeypatch.setattr(mod, "view_tokens", tokens)
    for i in range(12):
        (workspace / f"f{i:02d}.txt").write_text(f"FILE-{i:02d}\n" + "z" * 1_500 + "\n")
    history = [{"role": "user", "content": "read them"}]
    api.script([reply(tool("read_file", {"path": f"f{i:02d}.txt"})) for i in range(6)]
               + [reply(tool("compact", {})), reply(SUMMARY)]
               + [reply(tool("read_file", {"path": f"f{i:02d}.txt"})) for i in range(6, 12)]
               + [reply("done")])
    assert mod.agent_loop(client, history) == "end_turn"
    mod.add_user_text(history, "and again")
    api.script([reply(tool("read_file", {"path": "f00.txt"})), reply("again done")])
    assert mod.agent_loop(client, history) == "end_turn"
    bodies = [json.dumps(b["messages"]) for b in message_bodies(api)]
    assert any("SUMMARY-TEXT" in b for b in bodies) and any("old tool result cleared" in b for b in bodies)
    assert len(requests) >= 15 and len(sizes) >= 30
    assert all(kept == scratch for kept, scratch in requests)
    assert all(kept == scratch for kept, scratch in sizes)
    scratch = [json.loads(json.dumps(s)) for _, s in requests]    # and what reached the server is that
    assert [m for m in (b["messages"] for b in message_bodies(api)) if m in scratch] == scratch


@from_s06
def test_a_model_call_remakes_the_newest_messages_only(mod, api, client, workspace, monkeypatch):
    (workspace / "small.txt").write_text("hi\n")
    history = []
    for n in range(40):                                           # 160 messages
        mod.add_user_text(history, f"turn {n}")
        api.script([reply(tool("read_file", {"path": "small.txt"})), reply(f"answer {n}")])
        assert mod.agent_loop(client, history) == "end_turn"
    made, real = [], mod.shown
    monkeypatch.setattr(mod, "shown", lambda m: made.append(m) or real(m))
    mod.add_user_text(history, "one more")
    api.script([reply(tool("read_file", {"path": "small.txt"})), reply("last answer")])
    assert mod.agent_loop(client, history) == "end_turn"
    assert len(history) == 164 and len(made) <= 60                 # two calls: not 3 x 160 each


# --- skills ---------------------------------------------------------------------------------------

def write_skill(folder, name, description):
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "SKILL.md").write_text(f"---\nname: {name}\ndescription: {description}\n---\nDo it.\n")


@from_s05
def test_a_skill_file_is_parsed_again_only_when_its_bytes_or_place_change(mod, workspace, monkeypatch):
    parsed, real = [], mod.parse_skill
    monkeypatch.setattr(mod, "parse_skill", lambda folder, source: parsed.append(folder.name) or
                        real(folder, source))
    skill = workspace / ".agent" / "skills" / "deploy"
    write_skill(skill, "deploy", "Ships it, version A.")
    assert mod.discover_skills()["deploy"]["description"] == "Ships it, version A."
    count = len(parsed)
    mod.system_prompt(), mod.discover_skills()
    assert len(parsed) == count                                    # nothing changed: no parse
    st = (skill / "SKILL.md").stat()
    write_skill(skill, "deploy", "Ships it, version B.")           # same size, same times
    os.utime(skill / "SKILL.md", ns=(st.st_atime_ns, st.st_mtime_ns))
    found = mod.discover_skills()["deploy"]
    assert found["description"] == "Ships it, version B." and parsed.count("deploy") == 2
    assert found["sha256"] == mod.parse_skill(skill, "project")["sha256"]


@from_s05
def test_the_skill_cache_keeps_only_what_it_saw_and_hands_out_copies(mod, workspace, monkeypatch,
                                                                    tmp_path):
    user, project = tmp_path / "home" / ".agent" / "skills", workspace / ".agent" / "skills"
    write_skill(user / "lint", "lint", "The user's lint.")
    write_skill(project / "lint", "lint", "The project's lint.")
    assert mod.discover_skills()["lint"]["replaces"] == "user"
    (user / "lint" / "SKILL.md").unlink()
    found = mod.discover_skills()["lint"]
    assert found["description"] == "The project's lint." and "replaces" not in found
    assert not any("lint" in folder and source == "user" for folder, source in mod.agent_state().skills)
    with mod.acting_as(mod.AgentState(workspace)) as other:
        assert other.skills == {}                                  # each agent its own
        assert mod.discover_skills()["lint"]["description"] == "The project's lint."
