"""Checks for exercises/s09.md. Each point: (what must hold, a hint, fn(x))."""
import json
from pathlib import Path

import yaml

from fake_api import reply


def complaint(err):
    """stderr without the progress lines (they start with "["): what was said about a mistake."""
    return [line for line in err.strip().splitlines() if not line.startswith("[")]


# s09.1: /remember ---------------------------------------------------------------------
def memories(folder):
    """{file name: (frontmatter, body)} of the memory files in folder (MEMORY.md aside)."""
    found = {}
    for path in sorted(folder.glob("*.md")) if folder.is_dir() else []:
        if path.name == "MEMORY.md":
            continue
        text = path.read_text()
        assert text.startswith("---\n"), f"{path.name} has no frontmatter"
        head, _, body = text[4:].partition("\n---\n")
        found[path.name] = (yaml.safe_load(head) or {}), body
    return found


def project_dir(x):
    return x.ws / ".agent" / "memory"


def user_dir():
    return Path.home() / ".agent" / "memory"


def remember(x, text):
    code, out, err = x.main(["/remember", *text.split()])
    assert not x.bodies(), "/remember made a model call: it is the human's own memory, no side call"
    return code, err


def saves_a_project_memory(x):
    code, err = remember(x, "project The staging database is db2.internal")
    assert code == 0, f"/remember exited {code}: {err.strip()[-300:]}"
    found = memories(project_dir(x))
    assert len(found) == 1, f"{len(found)} memory file(s) in .agent/memory, not 1"
    (name, (meta, body)), = found.items()
    assert meta.get("type") == "project", f"{name} has type {meta.get('type')!r}, not project"
    assert "db2.internal" in body, f"{name}'s body does not hold the text: {body!r}"
    index = project_dir(x) / "MEMORY.md"
    assert index.exists() and name in index.read_text(), f"MEMORY.md does not list {name}"


def default_is_a_user_memory(x):
    code, err = remember(x, "I prefer pytest over unittest")
    assert code == 0, f"/remember exited {code}: {err.strip()[-300:]}"
    found = memories(user_dir())
    assert len(found) == 1, f"{len(found)} memory file(s) in ~/.agent/memory, not 1"
    (name, (meta, body)), = found.items()
    assert meta.get("type") == "user" and "pytest" in body, f"{name}: type {meta.get('type')!r}, body {body!r}"
    assert not memories(project_dir(x)), "a memory without a type went to the project's folder"


def next_session_sees_it(x):
    remember(x, "project The staging database is db2.internal")
    x.api.script([reply("Noted.")])
    x.main(["which database do we stage on?"])
    first = json.dumps(x.bodies()[0]["messages"][0])
    assert "db2.internal" in first, "the next conversation's first request does not carry the memory"


SAME_START = "Deploys go through tools/release.sh and need the office VPN to reach the build host"


def twice_once_and_two_apart(x):
    remember(x, "project The staging database is db2.internal")
    remember(x, "project The staging database is db2.internal")
    assert len(memories(project_dir(x))) == 1, "the same text remembered twice made two memories"
    remember(x, f"project {SAME_START}, on Fridays also a second reviewer")
    remember(x, f"project {SAME_START}, and on release days the build host is read-only")
    bodies = [body for meta, body in memories(project_dir(x)).values()]
    assert len(bodies) == 3 and any("second reviewer" in b for b in bodies) \
        and any("read-only" in b for b in bodies), \
        f"two memories that start alike: {len(bodies) - 1} kept of 2 (one was dropped or overwritten)"


def nothing_to_remember(x):
    for text in ("", "project"):
        code, err = remember(x, text)
        assert code not in (0, None), f"/remember {text} exited {code}"
        assert len(complaint(err)) == 1 and "Traceback" not in err, \
            f"/remember {text} printed {complaint(err)!r}, not one line"
    assert not memories(project_dir(x)) and not memories(user_dir()), "an empty /remember saved a memory"


# s09.2: --fork-session -----------------------------------------------------------------
def sessions(x):
    folder = x.ws / ".agent" / "sessions"
    return sorted(folder.glob("*.jsonl"), key=lambda p: p.stat().st_mtime) if folder.is_dir() else []


def texts(x, path):
    """Every text of a session file's history as one string (read with the chapter's reader)."""
    return json.dumps(x.mod.read_session(path)[0])


def first_session(x):
    x.api.script([reply("Parser written.")])
    code, out, err = x.main(["write the parser"])
    assert code == 0 and len(sessions(x)) == 1, f"the first session did not run: {err.strip()[-300:]}"
    return sessions(x)[0]


def fork(x, *flags):
    x.api.script([reply("Tests written.")])
    return x.main([*flags, "now the tests"])


def fork_carries_the_history(x):
    first_session(x)
    code, out, err = fork(x, "--continue", "--fork-session")
    assert code == 0, f"--continue --fork-session exited {code}: {err.strip()[-300:]}"
    sent = json.dumps(x.bodies()[-1]["messages"])
    assert "write the parser" in sent, "the forked session's request does not carry the old conversation"
    assert "fork-session" not in sent, "the flag was sent to the model as part of the prompt"


def old_file_untouched(x):
    old = first_session(x)
    before = old.read_bytes().rstrip(b"\n")  # as a crash leaves it: the last line not ended
    old.write_bytes(before)
    fork(x, "--continue", "--fork-session")
    assert old.read_bytes() == before, (f"the forked-from session file changed "
                                        f"({len(before)} -> {old.stat().st_size} bytes)")


def new_file_has_both(x):
    old = first_session(x)
    fork(x, "--continue", "--fork-session")
    new = [p for p in sessions(x) if p != old]
    assert len(new) == 1, f"{len(new)} new session file(s) after the fork, not 1"
    held = texts(x, new[0])
    assert "write the parser" in held and "now the tests" in held, \
        "the new session file does not hold the old conversation and the new turn"


def fork_is_continued_next(x):
    first_session(x)
    fork(x, "--continue", "--fork-session")
    x.api.script([reply("Docs written.")])
    code, out, err = x.main(["--continue", "and the docs"])
    sent = json.dumps(x.bodies()[-1]["messages"])
    assert code == 0 and "now the tests" in sent, \
        f"a later --continue did not resume the fork (exit {code}): {err.strip()[-200:]}"


def fork_needs_a_session(x):
    code, out, err = fork(x, "--fork-session")
    assert code == 2, f"--fork-session without --continue or --resume exited {code}, not 2"
    assert len(complaint(err)) == 1 and "Traceback" not in err, f"stderr said {complaint(err)!r}, not one line"
    assert not x.bodies(), "the model was called anyway"


EXERCISES = {
    1: ("a /remember command", [
        ("/remember project TEXT saves a project memory, indexed, with no model call",
         "The extractor writes no file itself: what does it hand its decisions to, and in what shape?",
         saves_a_project_memory),
        ("/remember TEXT (no type) saves a user memory in ~/.agent/memory",
         "The type decides the folder (memory_dir); take the first word as the type only if it is one.",
         default_is_a_user_memory),
        ("the next conversation's first request carries it",
         "If the file and MEMORY.md are right, attach_context() already does this.",
         next_session_sees_it),
        ("the same text twice is one memory; two texts that start alike are two",
         "What does apply_operations() compare to decide that a memory exists already, and what "
         "happens when two memories want one file name?",
         twice_once_and_two_apart),
        ("nothing to remember: one line on stderr, a non-zero exit, nothing saved",
         "Set ctx['error'] and say() it, as /forget does for an unknown name.",
         nothing_to_remember),
    ]),
    2: ("--fork-session: go on from a saved session in a new file", [
        ("--continue --fork-session carries the old conversation into the new one",
         "Take --fork-session off argv in start_session(), with --continue and --resume.",
         fork_carries_the_history),
        ("the session it forks from stays byte-for-byte as it was",
         "List the writes to the old file that --continue causes: in resume(), and later through "
         "whatever state.record names.",
         old_file_untouched),
        ("a new session file holds the old conversation and the new turn",
         "session_boundary() writes the whole history to whatever file state.record names.",
         new_file_has_both),
        ("a later --continue resumes the fork",
         "The new file must be registered as the user's own; write_records() does it for a new file.",
         fork_is_continued_next),
        ("--fork-session alone: one line, exit 2, no model call",
         "Raise ValueError in start_session(): main() prints it and exits 2.",
         fork_needs_a_session),
    ]),
}
