"""s11 demo, for now: s10's scenario, run on s11_teams.py.

s11 carries all of s10, so this shows the same: a task graph worked in
dependency order and a slow test run in the background (see scenarios/s10.py
for what to watch). The team's own demo, a lead and two teammates on the
scripted model (in tmux panes when tmux is present) ending with the team's
message log, comes with spawn_teammate.
"""
from scenarios.s10 import CHECK, ENV, FAKED, INPUT, PROMPT, SETUP, STEPS  # noqa: F401
