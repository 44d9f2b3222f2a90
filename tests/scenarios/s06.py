"""s06 demo: a big log goes to disk, then the context crosses the threshold.

Watch stderr: `cat app.log` prints ~115 KB, so the model only gets a preview and
the path (.agent/tool-results/...). Step 5 reports 168,500 input tokens (more
than 167K = 200K window - 20K output reserve - 13K safety margin), so before the
next request the chapter saves the transcript to .agent/transcripts/, asks the
model for a 9-section summary (step 6), keeps the recent messages verbatim,
re-reads NOTES.md, and carries on from the summary (step 7).
"""
from fake_api import reply, text, tool

PROMPT = "How many ERROR lines are in app.log, and which service logs most of them?"

SERVICES = ["auth", "billing", "search", "mailer"]


def SETUP(workspace):
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
looked at the log (saved to disk because of its size) and counted ERROR lines.
</analysis>
<summary>
1. Primary request and intent: count the ERROR lines in app.log and find the service that logs most of them.
2. Key technical concepts: one event per line: timestamp, level, service, message.
3. Files and code sections: NOTES.md (where the logs are); app.log (1,500 lines; full `cat` output saved under .agent/tool-results/).
4. Errors and fixes: none.
5. Problem solving: grep counted 209 ERROR lines; the per-service split is still open.
6. All user messages: "How many ERROR lines are in app.log, and which service logs most of them?"
7. Pending tasks: split the ERROR lines by service.
8. Current work: counting ERROR lines per service in app.log.
9. Possible next step: grep "ERROR billing" and compare with the other services.
</summary>"""


def summary_step(body):
    """Step 6 answers the compaction request: no tool may be called in it."""
    if body.get("tool_choice") != {"type": "none"}:
        return reply("(demo: expected the compaction's summary request here)")
    return reply(SUMMARY)


STEPS = [
    reply(text("Notes first."), tool("read_file", {"path": "NOTES.md"})),                   # 1
    reply(tool("glob", {"pattern": "*.log"})),                                               # 2
    reply(tool("bash", {"command": "wc -l app.log"})),                                       # 3
    reply(text("Let me see the whole log."), tool("bash", {"command": "cat app.log"})),      # 4
    reply(text("Too big to read whole; counting instead."),
          tool("grep", {"pattern": "ERROR", "glob": "*.log", "output_mode": "count"}),
          usage={"input_tokens": 168_500}),                                                  # 5
    summary_step,                                                                            # 6
    reply(tool("bash", {"command": "grep ERROR app.log | awk '{print $3}' | sort | uniq -c"})),  # 7
    reply("app.log has 209 ERROR lines; billing logs most of them (177 of 209)."),          # 8
]
