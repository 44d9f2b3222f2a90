"""Rewrite what the READMEs copy from the chapter files: the line counts of the
chapter tables, and the core loop, quoted from s01_agent_loop.py.

    python tests/readme_counts.py            # rewrite README.md and README.zh-CN.md in place
    python tests/readme_counts.py --check    # change nothing; exit 1 and name what is stale

A chapter table is the markdown table whose rows start with a chapter file name
(`s01_agent_loop.py` ... `agent_full.py`). Its last cell is `N (+D)`: N lines in
the file, D lines more than the previous chapter's file (s01: D = N). The core loop
is the python block after the `<!-- core-loop: ... -->` line: s01's agent_loop from
its `def` to the line before its first `except`. Run it after a merge that moved a
chapter's line count or changed s01's loop; tests/test_readme_tables.py checks the
result (the chapter names, the order, the counts, the loop, and that both READMEs agree).
"""
import ast
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
READMES = ["README.md", "README.zh-CN.md"]  # the English README and its Chinese translation
CHAPTER_ROW = re.compile(r"^\| `((?:s\d\d_\w+|agent_full)\.py)` \|")  # a chapter table row
COUNT_CELL = re.compile(r"\| *\d+ \(\+-?\d+\) *\|$")  # the row's last cell, `| N (+D) |`
LOOP_MARK = "<!-- core-loop:"   # the line before the README's quote of s01's loop
LOOP_FILE = "s01_agent_loop.py"


def chapter_files(root=ROOT):
    """The chapter files in reading order: s01 ... s12, then agent_full.py when it exists."""
    names = sorted(p.name for p in root.glob("s[0-9][0-9]_*.py"))
    return names + (["agent_full.py"] if (root / "agent_full.py").exists() else [])


def line_counts(root=ROOT):
    """{file name: (lines, lines added since the previous chapter)}, in reading order."""
    counts, previous = {}, 0
    for name in chapter_files(root):
        n = len((root / name).read_text(encoding="utf-8").splitlines())
        counts[name] = (n, n - previous)
        previous = n
    return counts


def table_rows(text):
    """[(line index, chapter file name)] of the chapter table: the table block holding
    the first chapter row. One table only, so a later table that names a chapter file
    in its first cell is not taken for it."""
    lines = text.splitlines()
    first = next((i for i, line in enumerate(lines) if CHAPTER_ROW.match(line)), None)
    if first is None:
        return []
    start = first
    while start > 0 and lines[start - 1].startswith("|"):
        start -= 1
    rows, i = [], start
    while i < len(lines) and lines[i].startswith("|"):
        m = CHAPTER_ROW.match(lines[i])
        if m:
            rows.append((i, m.group(1)))
        i += 1
    return rows


def count_cell(n, d):
    return f"| {n} (+{d}) |"


def rewrite(text, counts):
    """The text with every chapter row's last cell set from counts, and the stale cells
    as [(file name, old cell, new cell)]. A row for a file that no longer exists, or a
    row whose last cell is not `N (+D)`, is left for the test to report."""
    lines = text.splitlines(keepends=True)
    stale = []
    for i, name in table_rows(text):
        body = lines[i].rstrip("\r\n")
        m = COUNT_CELL.search(body)
        if name not in counts or not m:
            continue
        new = count_cell(*counts[name])
        if m.group(0) != new:
            stale.append((name, m.group(0), new))
            lines[i] = body[:m.start()] + new + lines[i][len(body):]
    return "".join(lines), stale


def core_loop(root=ROOT):
    """s01's agent_loop as the README quotes it: from its `def` to the line before
    the first `except` of its try, the loop without its error handling."""
    text = (root / LOOP_FILE).read_text(encoding="utf-8")
    tree = ast.parse(text)
    fn = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "agent_loop")
    handled = next(n for n in fn.body if isinstance(n, ast.Try))
    return "\n".join(text.splitlines()[fn.lineno - 1:handled.handlers[0].lineno - 1]) + "\n"


def quoted_loop(text):
    """(start, end) of the quoted loop's lines in text (the code inside the fence), or None."""
    mark = text.find(LOOP_MARK)
    if mark < 0:
        return None
    fence = text.find("```python\n", mark)
    if fence < 0:
        return None
    start = fence + len("```python\n")
    end = text.find("```\n", start)
    return (start, end) if end >= 0 else None


def rewrite_loop(text, loop):
    """The text with its quoted loop set to `loop`, and whether it was stale; a
    README without the marker is left for the test to report."""
    span = quoted_loop(text)
    if span is None or text[span[0]:span[1]] == loop:
        return text, False
    return text[:span[0]] + loop + text[span[1]:], True


def main(argv):
    check = "--check" in argv
    counts, stale_any, loop = line_counts(), False, core_loop()
    for readme in READMES:
        path = ROOT / readme
        if not path.exists():
            print(f"{readme}: missing")
            stale_any = True
            continue
        text = path.read_text(encoding="utf-8")
        new_text, stale = rewrite(text, counts)
        new_text, loop_stale = rewrite_loop(new_text, loop)
        for name, old, new in stale:
            print(f"{readme}: {name} {old.strip('| ')} -> {new.strip('| ')}")
        if loop_stale:
            print(f"{readme}: the core loop, quoted again from {LOOP_FILE}")
        stale_any = stale_any or bool(stale) or loop_stale
        if (stale or loop_stale) and not check:
            path.write_text(new_text, encoding="utf-8")
    if not stale_any:
        print("chapter tables and the core loop up to date")
    return 1 if check and stale_any else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
