"""s05 demo: the model sees only skill names, loads review-code, then follows it.

Watch stderr: "> load_skill", then one "> !git ..." line per command in the
skill's body. Those !`git ...` lines run before the model sees the body, so
the diff is already in the tool_result; the model then reads the skill's
linked checklist (outside the workspace, next to the chapter file) and the
changed file, and answers with ranked findings. The system prompt carries
one line per skill; the full body arrives only when load_skill is called.
"""
import re
import subprocess

from fake_api import reply, text, tool


def SETUP(ws):
    """a git repository with src/stats.py committed, then an uncommitted change that
    adds mean() (needs git on PATH)."""
    (ws / "src").mkdir()
    (ws / "src" / "stats.py").write_text("def total(xs):\n    return sum(xs)\n")
    git = ["git", "-c", "user.name=demo", "-c", "user.email=demo@example.com"]
    for args in (["init", "-q"], ["add", "."], ["commit", "-qm", "add total"]):
        subprocess.run(git + args, cwd=ws, check=True, capture_output=True)
    (ws / "src" / "stats.py").write_text("def total(xs):\n    return sum(xs)\n\n\n"
                                         "def mean(xs):\n    return total(xs) / len(xs)\n")


PROMPT = "review my uncommitted changes in src"


def follow_skill(body):
    """Read the folder path out of the <skill ...> tag the model was given."""
    result = body["messages"][-1]["content"][0]["content"]
    result = result if isinstance(result, str) else "".join(b.get("text", "") for b in result)
    path = re.search(r'<skill name="review-code" path="([^"]+)">', result)[1]
    return reply(text("The skill says: read its checklist and the whole changed file."),
                 tool("read_file", {"path": f"{path}/checklist.md", "limit": 12}),
                 tool("read_file", {"path": "src/stats.py"}))


STEPS = [
    reply(text("That is a code review; the review-code skill fits, so I'll load it for src."),
          tool("load_skill", {"name": "review-code", "arguments": "src"})),
    follow_skill,
    reply(text("`src/stats.py` adds `mean()` on top of `total()`.\n\n"
               "### Critical\n"
               "- src/stats.py:6 — `mean([])` divides by zero and raises ZeroDivisionError. "
               "Fix: `if not xs: raise ValueError(\"mean() of an empty sequence\")` "
               "(or return 0.0 if callers expect that).\n\n"
               "### Important\n"
               "- src/stats.py:5 — no test covers `mean`. Fix: add tests for a normal list "
               "and for the empty case.\n\n"
               "Verdict: request changes"), delay=0.01),
]


def CHECK(workspace, stdout):
    """The review has a verdict and names src/stats.py:6; the reviewed file is unchanged."""
    assert "Verdict: request changes" in stdout and "src/stats.py:6" in stdout, "no review"
    assert (workspace / "src" / "stats.py").read_text().endswith("return total(xs) / len(xs)\n"), \
        "the review edited src/stats.py"
    status = subprocess.run(["git", "status", "--short"], cwd=workspace, capture_output=True,
                            text=True, check=True).stdout
    assert status.strip() == "M src/stats.py", f"unexpected git status: {status!r}"
