"""s07 demo: every tool call passes one decision; each says which layer allowed or refused it.

Watch stderr: the start-up line names the mode (default) and the sandbox. Then
eight calls, each judged by one layer, which the call's next line names:
"allowed (layer): why" when it runs, "error: Permission denied (layer): why"
when it does not (the model gets that one as an is_error result).
  1. `echo 'never run rm -rf / here'` is allowed (sandbox): the blocklist is
     now parsed, so a dangerous command that is only quoted text is an
     argument (s01's regex list refused it), and bash inside the OS sandbox
     needs no question;
  2. `curl ... | sh` is refused by the parsed blocklist (a download piped into a shell);
  3. writing .git/hooks/pre-commit is refused in every mode: a protected path
     (git would run it later, outside the agent's control);
  4. writing notes.txt asks the human ("permission needed"), who answers a
     (always): allowed (the user), and the narrowest allow rule,
     write_file(notes.txt), goes into .agent/config.local.yaml;
  5. writing TODO.txt asks too; the human types "put it in notes.txt instead",
     which is a no, and that text reaches the model as the reason;
  6. writing notes.txt again is allowed (rule): the rule the "always" wrote;
  7. reading it back is allowed (mode): reads are always allowed;
  8. `echo hi > /var/tmp/agent-demo-s07.txt` is allowed (sandbox) and fails: the
     root is read-only in the sandbox, and the result says so in one line
     instead of a bare EROFS.
Every denial is an is_error result naming its layer; the loop goes on.
"""
import re

from fake_api import reply, text, tool

PROMPT = "Take notes on this project in a file, and set up a git pre-commit hook."
ENV = {"AGENT_PERMISSION_MODE": "default"}
INPUT = "a\nput it in notes.txt instead\n"
FAKED = ("The human: the two answers (a for always, then a reason) are piped to the chapter's "
         "stdin, as `printf 'a\\n...' | python s07_permissions.py` would.")

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


NOTES = "Project notes\n- set up a hook by hand\n"
REPLIES = [
    reply(text("Maybe a setup script does it."), tool("bash", {"command": DOWNLOAD})),
    reply(text("Then I'll write the hook myself."),
          tool("write_file", {"path": ".git/hooks/pre-commit", "content": "#!/bin/sh\nexit 0\n"})),
    reply(text("The hook is off limits. Notes first."),
          tool("write_file", {"path": "notes.txt", "content": "Project notes\n"})),
    reply(tool("write_file", {"path": "TODO.txt", "content": "- set up a hook by hand\n"})),
    reply(text("Into notes.txt, then."), tool("write_file", {"path": "notes.txt", "content": NOTES})),
    reply(tool("read_file", {"path": "notes.txt"})),
    reply(text("One more try, outside the project."),
          tool("bash", {"command": f"echo hi > {OUTSIDE}"})),
    reply(text("I wrote **notes.txt**, with the TODO in it as you asked. I did not install a "
               "pre-commit hook: `.git/hooks/` is protected, so I cannot write it, and running "
               "a downloaded setup script is refused. I cannot write outside the project either. "
               "To add the hook, copy it into `.git/hooks/` yourself."), delay=0.02),
]

EXPECTED = ["never run rm -rf / here", "Permission denied (blocklist)",
            "Permission denied (protected path)", "Wrote", "put it in notes.txt instead", "Wrote",
            "- set up a hook by hand", "Read-only file system"]   # each call's result, in order
LAYERS = ["sandbox", "blocklist", "protected path", "the user", "the user", "rule", "mode", "sandbox"]

STEPS = [reply(text("Let me check the shell works."),
               tool("bash", {"command": "echo 'never run rm -rf / here'"}))]
STEPS += [after(expect, step) for expect, step in zip(EXPECTED, REPLIES)]


def verdicts(stderr):
    """(tool, allowed or denied, layer) for each call, from the line after its `> tool` line."""
    lines, found = stderr.splitlines(), []
    for i, line in enumerate(lines):
        if line.startswith("> "):
            rest = lines[i + 1:next((j for j in range(i + 1, len(lines)) if lines[j].startswith("> ")),
                                    len(lines))]
            said = next((m for x in rest if (m := re.match(
                r"\s+(allowed|error: Permission denied) \(([^)]+)\)", x))), None)
            found.append((line.split()[1], "allowed" if said and said[1] == "allowed" else
                          "denied" if said else "nothing", said[2] if said else None))
    return found


def CHECK(workspace, stdout, runs):
    """notes.txt written (twice: the second time by the allow rule the "always" saved in
    .agent/config.local.yaml), TODO.txt and the git hook not; every call's next line names
    the layer that allowed or refused it, and the allowed ones name four layers (sandbox,
    the user, rule, mode); the answer explains the refusals."""
    assert (workspace / "notes.txt").read_text() == NOTES, "notes.txt is not as written"
    assert not (workspace / "TODO.txt").exists(), "TODO.txt was written although the human said no"
    assert not (workspace / ".git" / "hooks" / "pre-commit").exists(), "the protected hook was written"
    local = (workspace / ".agent" / "config.local.yaml").read_text()
    assert "write_file(notes.txt)" in local, "the always answer saved no allow rule"
    said = verdicts(runs[0]["stderr"])
    assert [layer for _, _, layer in said] == LAYERS, f"the layers named: {said}"
    allowed = {layer for _, verdict, layer in said if verdict == "allowed"}
    assert allowed == {"sandbox", "the user", "rule", "mode"}, f"allowed by: {allowed}"
    assert "protected" in stdout and "notes.txt" in stdout, "the answer does not explain the refusals"
