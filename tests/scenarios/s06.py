"""s06 demo: a big result goes to disk, a batch clear, then auto-compaction.

Watch stderr (and --show-requests for what the model received):
1. `cat app.log` prints ~115 KB, so the model only gets a preview and the path
   (.agent/tool-results/...): the full text stays on disk.
2. The model reads the saved file in three pages (~22K tokens). The results not
   cleared yet now hold more than the 20K working budget (it counts above the
   floor: tools, system, prompt, replies), and clearing them frees more than
   half the messages, so before the next request the chapter clears old tool
   results in one batch ("[cleared 4 old tool result(s) ...]": the preview and
   the pages; the newest result, and results shorter than a placeholder,
   stay). The model now sees "[old tool result cleared ...]" placeholders in
   their place.
3. Reply 7 reports 168,500 input tokens (more than 167K = 200K window - 20K
   output reserve - 13K safety margin), so the chapter saves the transcript to
   .agent/transcripts/, asks the model for a 9-section summary (reply 8, sent
   with tool_choice none), keeps the recent messages verbatim, re-reads
   NOTES.md, and carries on from the summary (reply 9).
The status line after each reply shows the context size and the cache reads
and writes: each request reads from the cache what the previous one wrote,
except right after the batch clear and the compaction, which change the prefix.
"""
import json
import re

from fake_api import reply, text, tool

PROMPT = "How many ERROR lines are in app.log, and which service logs most of them?"

SERVICES = ["auth", "billing", "search", "mailer"]


def SETUP(workspace):
    """NOTES.md, and app.log: 1,500 generated lines (~115 KB), 209 of them ERROR."""
    (workspace / "NOTES.md").write_text("# Notes\n\nLogs live in app.log, one event per line.\n")
    lines = []
    for n in range(1, 1501):
        service = SERVICES[n % 4] if n % 9 else "billing"
        level = "ERROR" if n % 9 == 0 or n % 31 == 0 else "INFO"
        lines.append(f"2025-01-01T00:{n // 60 % 60:02d}:{n % 60:02d} {level:5} {service:8} "
                     f"request {n:05d} handled by worker {n % 7} in {n % 97} ms")
    (workspace / "app.log").write_text("\n".join(lines) + "\n")


SUMMARY = """<analysis>
The user asked for ERROR counts in app.log. I read NOTES.md, listed the logs,
counted the lines and printed the log, which was saved to disk because of its size.
</analysis>
<summary>
1. Primary request and intent: count the ERROR lines in app.log and find the service that logs most of them.
2. Key technical concepts: one event per line: timestamp, level, service, message.
3. Files and code sections: NOTES.md (where the logs are); app.log (1,500 lines; the full `cat` output is saved under .agent/tool-results/).
4. Errors and fixes: none.
5. Problem solving: reading the saved log page by page was too slow, so grep counted instead: 209 ERROR lines, 177 of them from billing.
6. All user messages: "How many ERROR lines are in app.log, and which service logs most of them?"
7. Pending tasks: confirm the per-service split.
8. Current work: counting ERROR lines per service in app.log.
9. Possible next step: answer with the total and the per-service counts.
</summary>"""


def read_saved_pages(body):
    """Reply 5: read the file the preview points to, in three pages, as its note suggests."""
    result = str(body["messages"][-1]["content"][0]["content"])
    saved = re.search(r"saved to: (\S+)", result)
    if not saved:
        return reply("(demo: expected the cat output to be saved to disk, it came back whole)")
    return reply(text("The preview is only the start; reading the saved output in pages."),
                 tool("read_file", {"path": saved[1], "limit": 330}),
                 tool("read_file", {"path": saved[1], "offset": 331, "limit": 330}),
                 tool("read_file", {"path": saved[1], "offset": 661, "limit": 330}))


def summary_step(body):
    """Reply 8 answers the compaction request: no tool may be called in it, and the
    history it summarises already carries the batch clear's placeholders."""
    if body.get("tool_choice") != {"type": "none"}:
        return reply("(demo: expected the compaction's summary request here)")
    if "[old tool result cleared" not in json.dumps(body["messages"]):
        return reply("(demo: expected cleared tool results after the batch clear)")
    return reply(SUMMARY)


def after_compaction(body):
    """Reply 9: the history now starts with the summary."""
    if "<summary>" not in json.dumps(body["messages"][0]):
        return reply("(demo: expected the compacted history to start with the summary)")
    return reply("app.log has 209 ERROR lines; billing logs most of them (177 of 209).")


STEPS = [
    reply(text("Notes first."), tool("read_file", {"path": "NOTES.md"})),                   # 1
    reply(tool("glob", {"pattern": "*.log"})),                                               # 2
    reply(tool("bash", {"command": "wc -l app.log"})),                                       # 3
    reply(text("Let me see the whole log."), tool("bash", {"command": "cat app.log"})),      # 4
    read_saved_pages,                                                                        # 5
    reply(text("Paging through 1,500 lines is slow; counting instead."),
          tool("grep", {"pattern": "ERROR", "glob": "*.log", "output_mode": "count"}),
          tool("grep", {"pattern": "ERROR +billing", "glob": "*.log", "output_mode": "count"}),
          tool("grep", {"pattern": "ERROR +auth", "glob": "*.log", "output_mode": "count"})),  # 6
    reply(text("Billing leads; now every service at once."),
          tool("bash", {"command": "grep ERROR app.log | awk '{print $3}' | sort | uniq -c"}),
          usage={"input_tokens": 168_500}),                                                  # 7
    summary_step,                                                                            # 8
    after_compaction,                                                                        # 9
]


def CHECK(workspace, stdout):
    """The full log is saved under .agent/tool-results/, a transcript under .agent/transcripts/,
    and the answer gives 209 ERROR lines with billing first."""
    saved = list((workspace / ".agent" / "tool-results").glob("*.txt"))
    log = (workspace / "app.log").read_text()
    assert any(p.read_text() == log for p in saved), "no saved copy of the cat output"
    transcripts = list((workspace / ".agent" / "transcripts").glob("*.jsonl"))
    assert len(transcripts) == 1, f"{len(transcripts)} transcripts, expected 1"
    first = json.loads(transcripts[0].read_text().splitlines()[0])
    assert first["content"] == PROMPT, "the transcript does not start with the prompt"
    assert "209 ERROR lines" in stdout and "billing" in stdout, "the answer is missing"
