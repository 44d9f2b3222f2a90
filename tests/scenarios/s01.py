"""s01 demo: the model asks for bash twice, sees the output, then answers."""
from fake_api import reply, text, tool

PROMPT = "make hello.txt containing hi, then show me its size"

STEPS = [
    reply(text("I'll create the file with the shell."),
          tool("bash", {"command": "printf 'hi\\n' > hello.txt"})),
    reply(text("Now let me check its size."), tool("bash", {"command": "wc -c hello.txt"})),
    reply(text("Created **hello.txt** containing `hi`; it is 3 bytes (two letters and a "
               "newline)."), delay=0.02),
]
