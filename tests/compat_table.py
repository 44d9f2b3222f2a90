#!/usr/bin/env python3
"""The table of what agent_full still does differently from the real Claude Code
CLI, on agent_full's reference page (docs/agent_full.md and its Chinese twin),
made from the oracle tests' own lists.

tests/test_cli_hooks.py and tests/test_cli_headless.py run the same scripted
sessions through the CLI and through agent_full and compare them; each keeps an
INTENDED dict of the differences left, with the reason, and fails when it finds a
difference that is not listed or lists one it does not find. This table is those
dicts, so it says what the last comparison found:

    python tests/compat_table.py        # rewrite the table on both pages

tests/test_readme_tables.py checks that the tables are current.
"""
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

BEGIN = "<!-- compat-table: written by tests/compat_table.py from the oracle tests; do not edit -->"
END = "<!-- /compat-table -->"
PAGES = ["docs/agent_full.md", "docs/zh-CN/agent_full.md"]  # the table's home, in both languages


def rows():
    """(test file, what differs, why) for every difference the oracle tests list."""
    import test_cli_headless
    import test_cli_hooks
    found = [(test_cli_hooks, "hook stdin: ", test_cli_hooks.INTENDED),
             (test_cli_hooks, "a tool's input in hook stdin: ", test_cli_hooks.INPUT_INTENDED),
             (test_cli_headless, "-p: ", test_cli_headless.INTENDED)]
    return [(f"tests/{module.__name__}.py", where + key, why)
            for module, where, listed in found for key, why in listed.items()]


def table():
    lines = ["| held by | what differs | why |", "| --- | --- | --- |"]
    lines += [f"| `{where}` | {key} | {why} |" for where, key, why in rows()]
    return "\n".join([BEGIN, *lines, END])


def rewritten(text):
    """text with the table between the markers made anew; ValueError without them."""
    start, end = text.find(BEGIN), text.find(END)
    if start < 0 or end < start:
        raise ValueError("no compat-table markers")
    return text[:start] + table() + text[end + len(END):]


def main():
    for name in PAGES:
        path = ROOT / name
        path.write_text(rewritten(path.read_text(encoding="utf-8")), encoding="utf-8")
        print(f"{name}: {len(rows())} rows")


if __name__ == "__main__":
    main()
