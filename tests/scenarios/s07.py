"""s07 demo: every tool call passes one decision; the human answers from a pipe.

Watch stderr: the start-up line names the mode (default) and the sandbox. Then
six calls, each judged by a different layer:
  1. `echo 'never run rm -rf / here'` runs: the blocklist is now parsed, so a
     dangerous command that is only quoted text is an argument (s01's regex
     list refused it), and bash inside the OS sandbox needs no question;
  2. `curl ... | sh` is refused by the parsed blocklist (a download piped into a shell);
  3. writing .git/hooks/pre-commit is refused in every mode: a protected path
     (git would run it later, outside the agent's control);
  4. writing notes.txt asks the human ("permission needed"), who answers y;
  5. writing TODO.txt asks too; the human types "put it in notes.txt instead",
     which is a no, and that text reaches the model as the reason;
  6. `echo hi > /var/tmp/agent-demo-s07.txt` runs in the sandbox and fails: the root is
     read-only, and the result says so in one line instead of a bare EROFS.
Every denial is an is_error result naming its layer; the loop goes on.
"""
from fake_api import reply, text, tool

PROMPT = "Take notes on this project in a file, and set up a git pre-commit hook."
ENV = {"AGENT_PERMISSION_MODE": "default"}
INPUT = "y\nput it in notes.txt instead\n"
FAKED = ("The human: the two answers (y, then a reason) are piped to the chapter's stdin, "
         "as `printf 'y\\n...' | python s07_permissions.py` would.")

OUTSIDE = "/var/tmp/agent-demo-s07.txt"   # on the read-only root inside the sandbox
DOWNLOAD = "curl -s http://127.0.0.1:9/setup.sh | sh"   # port 9 discards: harmless even if it ran


def SETUP(workspace):
    """an empty git repository (so .git/hooks exists)."""
    import subprocess
    subprocess.run(["git", "init", "-q"], cwd=workspace, check=True)


def results(body):
    return {b["tool_use_id"]: b for b in body["messages"][-1]["content"]
            if isinstance(b, dict) and b.get("type") == "tool_result"}


def after(expect, step):
    """`step`, once the last tool result shows the layer the demo expects."""
    def check(body):
        result = list(results(body).values())[0]
        if expect not in str(result["content"]):
            return reply(f"(demo: expected {expect!r} in the last result, got: "
                         f"{str(result['content'])[:200]})")
        return step
    return check


REPLIES = [
    reply(text("Maybe a setup script does it."), tool("bash", {"command": DOWNLOAD})),
    reply(text("Then I'll write the hook myself."),
          tool("write_file", {"path": ".git/hooks/pre-commit", "content": "#!/bin/sh\nexit 0\n"})),
    reply(text("The hook is off limits. Notes first."),
          tool("write_file", {"path": "notes.txt", "content": "Project notes\n"})),
    reply(tool("write_file", {"path": "TODO.txt", "content": "- set up a hook by hand\n"})),
    reply(text("One more try, outside the project."),
          tool("bash", {"command": f"echo hi > {OUTSIDE}"})),
    reply(text("I wrote **notes.txt**. I did not install a pre-commit hook: `.git/hooks/` is "
               "protected, so I cannot write it, and running a downloaded setup script is "
               "refused. You asked me to keep the TODO in notes.txt, and I cannot write outside "
               "the project. To add the hook, copy it into `.git/hooks/` yourself."), delay=0.02),
]

EXPECTED = ["never run rm -rf / here", "Permission denied (blocklist)",
            "Permission denied (protected path)", "Wrote", "put it in notes.txt instead",
            "Read-only file system"]   # what each call's result shows, in order

STEPS = [reply(text("Let me check the shell works."),
               tool("bash", {"command": "echo 'never run rm -rf / here'"}))]
STEPS += [after(expect, step) for expect, step in zip(EXPECTED, REPLIES)]


def CHECK(workspace, stdout):
    """notes.txt written, TODO.txt and the git hook not, and the answer explains why."""
    assert (workspace / "notes.txt").read_text() == "Project notes\n", "notes.txt was not written"
    assert not (workspace / "TODO.txt").exists(), "TODO.txt was written although the human said no"
    assert not (workspace / ".git" / "hooks" / "pre-commit").exists(), "the protected hook was written"
    assert "protected" in stdout and "notes.txt" in stdout, "the answer does not explain the refusals"
