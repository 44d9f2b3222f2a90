"""Checks for exercises/s01.md. Each point: (what must hold, a hint, fn(x))."""
from fake_api import reply, tool


def endless(n):
    """n replies that each ask for another command: a model that never finishes."""
    return [reply(tool("bash", {"command": f"echo step {i}"})) for i in range(n)]


# s01.1: --max-turns ---------------------------------------------------------
def flag_not_in_prompt(x):
    x.api.script([reply("hi")])
    code, out, err = x.main(["--max-turns", "3", "say", "hi"])
    first = x.bodies()[0]["messages"][0]["content"]
    assert first == "say hi", f"the model was asked {first!r}"
    assert code == 0, f"exit status {code}: {err.strip()[-200:]}"


def flag_limits_calls(x):
    x.api.script(endless(5))
    code, out, err = x.main(["--max-turns", "2", "loop forever"])
    assert len(x.bodies()) == 2, f"{len(x.bodies())} model calls were made, not 2"
    assert code != 0, "a run stopped by the limit must not exit 0"


def flag_beats_env(x):
    x.mod.os.environ["AGENT_MAX_TURNS"] = "4"       # put back after the point
    x.api.script(endless(5))
    x.main(["--max-turns", "1", "loop forever"])
    assert len(x.bodies()) == 1, f"{len(x.bodies())} model calls with --max-turns 1 and AGENT_MAX_TURNS=4"


def bad_value_one_line(x):
    code, out, err = x.main(["--max-turns", "zero", "task"])
    assert code == 2, f"exit status {code}, not 2"
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, f"stderr was {err!r}"
    assert not x.bodies(), "the model was called anyway"


EXERCISES = {
    1: ("a --max-turns flag", [
        ("the flag and its value are not sent to the model",
         "In main(), take '--max-turns N' off argv before joining the rest into the prompt.",
         flag_not_in_prompt),
        ("--max-turns 2 stops after two model calls, with a non-zero exit",
         "The limit has to reach turn_limit(), which agent_loop() asks each time.",
         flag_limits_calls),
        ("the flag wins over AGENT_MAX_TURNS",
         "Check the flag first in turn_limit() (or wherever you keep it), the environment second.",
         flag_beats_env),
        ("a bad value gets one line on stderr and exit status 2, before any model call",
         "Validate like turn_limit() does and print the ValueError, as main() already does.",
         bad_value_one_line),
    ]),
}
