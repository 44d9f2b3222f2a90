"""agent_full demo: the s12 demo, run by agent_full.py through its plain front end.

`python tests/demo.py agent` (agent_full's REPL prompt is `agent >> `, so its
no-key line names this demo). Everything s12's demo shows happens the same way:
agent_full is s12 plus a front end, and with stdout a pipe that front end is the
chapters' own plain output. Run `python agent_full.py` at a terminal against a
real model for the rich UI, or see tests/test_full_headless.py for -p runs.
"""
from scenarios.s12 import CHECK, ENV, FAKED, INPUT, PROMPT, SETUP, SHOW, STEPS  # noqa: F401
