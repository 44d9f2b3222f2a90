"""agent_full's docstring maps each chapter to the names it contributes: every name
listed is defined in agent_full, arrives in the chapter it is listed under, and
every chapter has a row (the map cannot drift from the files)."""
import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def defined(path):
    return {n.name for n in ast.parse(path.read_text()).body if isinstance(n, (ast.FunctionDef, ast.ClassDef))}


def docstring_map():
    doc = ast.get_docstring(ast.parse((ROOT / "agent_full.py").read_text()))
    block = doc.split("Where each chapter's mechanism lives")[1].split("Key insight")[0]
    rows, current = {}, None
    for line in block.splitlines():  # the heading's own lines match no row
        head = re.match(r"    (s\d\d|full) ", line)
        if head:
            current = head.group(1)
            line = re.sub(r"^    \S+ .*?\s{2,}", "", line)
        if current:
            rows.setdefault(current, set()).update(re.findall(r"[A-Za-z_]\w*", line))
    return rows


def test_every_chapter_has_a_row_and_each_name_arrives_in_its_chapter():
    files = sorted(ROOT.glob("s[0-9][0-9]_*.py"))
    rows = docstring_map()
    assert sorted(rows) == sorted([f.stem[:3] for f in files] + ["full"])
    full, before = defined(ROOT / "agent_full.py"), set()
    for f in files + [ROOT / "agent_full.py"]:
        names = defined(f)
        listed = rows[f.stem[:3] if f.stem != "agent_full" else "full"]
        assert listed <= full, f"not in agent_full: {sorted(listed - full)}"
        assert listed <= names - before, f"{f.name} does not introduce {sorted(listed - (names - before))}"
        before |= names
