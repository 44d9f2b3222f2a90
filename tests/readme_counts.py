"""Rewrite what the READMEs copy from the chapter files: the line counts of the
chapter tables, and the core loop, quoted from s01_agent_loop.py.

    python tests/readme_counts.py            # rewrite README.md and README.zh-CN.md in place
    python tests/readme_counts.py --check    # change nothing; exit 1 and name what is stale

A chapter table is the markdown table whose rows start with a chapter file name
(`s01_agent_loop.py` ... `agent_full.py`). Its last cell is `N (+D)`: N lines in
the file, D lines more than the previous chapter's file (s01: D = N). The cell
before it is the chapter's own section by reading tier, `C / H / E`: the lines of
its [core], [hardening: ...] and [extra] sub-sections (s01, which has no section of
its own, `—`). The core loop is the python block after the `<!-- core-loop: ... -->`
line: s01's agent_loop from its `def` to the line before its first `except`. Run it
after a merge that moved a chapter's line count or changed s01's loop;
tests/test_readme_tables.py checks the result (the chapter names, the order, the
counts, the tiers, the loop, and that both READMEs agree).
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
TIER_CELL = re.compile(r"\| *[^|]*? *(?=\| *\d+ \(\+-?\d+\) *\|$)")  # the cell before it
RULER = re.compile(r"# --- (.+) ---$")
TIER = re.compile(r"\[(core|hardening|extra)\b")
NO_SECTION = "—"  # s01: the whole file is the first chapter


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


def all_tier_counts(root=ROOT):
    """{file name: tier_counts}, in reading order."""
    return {name: tier_counts(root / name) for name in chapter_files(root)}


def tier_counts(path):
    """(core, hardening, extra): the lines of the sub-sections of the file's own section
    (`# --- sNN: ... ---`, agent_full's `full:`), each from its ruler to the next ruler,
    by the tier its ruler names; None for a file with no section of its own (s01)."""
    key = "full" if path.name == "agent_full.py" else path.name[:3]
    counts, tier = {"core": 0, "hardening": 0, "extra": 0}, None
    inside = False
    for line in path.read_text(encoding="utf-8").splitlines():
        m = RULER.match(line)
        if m:
            label = m.group(1)
            inside = label.startswith(key + ":") or (inside and label.startswith(key + "."))
            found = TIER.search(label) if inside and label.startswith(key + ".") else None
            tier = found.group(1) if found else None
        if inside and tier:
            counts[tier] += 1
    return tuple(counts.values()) if any(counts.values()) else None


def tier_cell(counts):
    return f"| {NO_SECTION if counts is None else ' / '.join(map(str, counts))} "


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


def rewrite(text, counts, tiers=None):
    """The text with every chapter row's last cell set from counts (and the cell before
    it from tiers, when given), and the stale cells as [(file name, old cell, new cell)].
    A row for a file that no longer exists, or a row whose last cell is not `N (+D)`,
    is left for the test to report."""
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
            body = body[:m.start()] + new
        t = TIER_CELL.search(body) if tiers is not None and name in tiers else None
        if t and t.group(0) != tier_cell(tiers[name]):
            stale.append((name, t.group(0) + "|", tier_cell(tiers[name]) + "|"))
            body = body[:t.start()] + tier_cell(tiers[name]) + body[t.end():]
        lines[i] = body + lines[i][len(lines[i].rstrip("\r\n")):]
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
    counts, tiers, stale_any, loop = line_counts(), all_tier_counts(), False, core_loop()
    for readme in READMES:
        path = ROOT / readme
        if not path.exists():
            print(f"{readme}: missing")
            stale_any = True
            continue
        text = path.read_text(encoding="utf-8")
        new_text, stale = rewrite(text, counts, tiers)
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
