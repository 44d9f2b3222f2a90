"""s04 demo: the agent hands an investigation to a read-only explore subagent.

Watch stderr: "[agent find the retry limit: explore, started]", then the child's
own tool calls (grep, read_file) and its report as it streams, then one usage
line. The child's request starts from a single user message: the brief. The
parent's next request holds only the report: none of the child's calls.
"""
from fake_api import reply, text, tool

PROMPT = "How many times does this project retry a failed download, and where is that set?"

CONFIG = "# download settings\nTIMEOUT = 30\nMAX_RETRIES = 4\n"
FETCH = ("from config import MAX_RETRIES, TIMEOUT\n\n\n"
         "def fetch(get, url):\n"
         "    for attempt in range(MAX_RETRIES + 1):\n"
         "        try:\n"
         "            return get(url, timeout=TIMEOUT)\n"
         "        except OSError:\n"
         "            if attempt == MAX_RETRIES:\n"
         "                raise\n")
BRIEF = ("Find how many times a failed download is retried in this project and where the "
         "limit is defined and used. Report the number and path:line references.")
REPORT = ("4 retries (5 attempts in all). Defined in config.py:3 (MAX_RETRIES = 4); used "
          "in fetch.py:5 (range(MAX_RETRIES + 1)) and fetch.py:9 (re-raises on the last).")


def SETUP(workspace):
    """config.py sets MAX_RETRIES = 4; fetch.py loops over it."""
    (workspace / "config.py").write_text(CONFIG)
    (workspace / "fetch.py").write_text(FETCH)


def parent_sees_only_the_report(body):
    """The parent's second request: its agent call answered by the report alone."""
    result = body["messages"][-1]["content"][0]
    if "MAX_RETRIES = 4" not in str(result["content"]) or len(body["messages"]) != 3:
        return reply("(demo: expected only the explore report in this request)")
    return reply("A failed download is retried 4 times (5 attempts). The limit is "
                 "MAX_RETRIES = 4 in config.py, line 3; fetch() in fetch.py loops over it.")


STEPS = [
    reply(text("I'll send an explore agent to dig through the code."),          # parent 1
          tool("agent", {"prompt": BRIEF, "description": "find the retry limit",
                         "agent_type": "explore"})),
    reply(tool("grep", {"pattern": "MAX_RETRIES", "output_mode": "content"})),  # child 1
    reply(tool("read_file", {"path": "fetch.py"})),                             # child 2
    reply(REPORT),                                                              # child 3
    parent_sees_only_the_report,                                                # parent 2
]


def CHECK(workspace, stdout):
    """The answer names the 4 retries and config.py; the read-only explore agent changed no file."""
    assert "retried 4 times" in stdout and "config.py" in stdout, "the answer is missing"
    assert "4 retries (5 attempts in all)" not in stdout, "the child's report leaked to stdout"
    assert sorted(p.name for p in workspace.iterdir()) == ["config.py", "fetch.py"], \
        "files appeared in the workspace"
    assert (workspace / "config.py").read_text() == CONFIG, "config.py changed"
    assert (workspace / "fetch.py").read_text() == FETCH, "fetch.py changed"
