"""s01 demo: the agent loop runs bash for the model, and the blocklist refuses sudo.

Watch: the model's text streams to stdout; each tool call ("> bash ...") and a
one-line preview of its result go to stderr. Three rounds of the same loop:
the model asks for a command, the loop runs it (or refuses it) and sends the
output back, until the model answers without asking. The third command uses
sudo, so check_dangerous refuses it before anything runs: the model gets the
reason as an error result and tells the user instead of retrying.
"""
from fake_api import reply, text, tool

PROMPT = "make hello.txt containing hi, show me its size, then make root its owner"

# Harmless even if it ever ran: -n never waits for a password.
SUDO = "sudo -n chown root hello.txt"


def after_refusal(body):
    """The last tool result must be the blocklist's refusal, not the command's output."""
    result = body["messages"][-1]["content"][0]
    if not (result.get("is_error") and "Refused by the blocklist" in str(result["content"])):
        return reply("(demo: expected the blocklist to refuse sudo, but the command ran)")
    return reply(text("Created **hello.txt** containing `hi`; it is 3 bytes (two letters and a "
                      "newline). I did not change its owner: the blocklist refuses `sudo` "
                      "(the agent never escalates privileges). If you need it, run "
                      "`sudo chown root hello.txt` yourself."), delay=0.02)


STEPS = [
    reply(text("I'll create the file with the shell."),
          tool("bash", {"command": "printf 'hi\\n' > hello.txt"})),
    reply(text("Now let me check its size."), tool("bash", {"command": "wc -c hello.txt"})),
    reply(text("Changing the owner needs root."), tool("bash", {"command": SUDO})),
    after_refusal,
]


def CHECK(workspace, stdout):
    """hello.txt holds "hi", the answer gives its size (3 bytes) and says sudo was refused."""
    assert (workspace / "hello.txt").read_text() == "hi\n", "hello.txt does not hold 'hi'"
    assert "3 bytes" in stdout, "the answer does not give the size"
    assert "refuses `sudo`" in stdout, "the answer does not mention the refusal"
