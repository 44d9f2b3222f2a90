"""The READMEs stay in step with the files and with each other.

Both README.md and its Chinese translation README.zh-CN.md carry the chapter table:
it lists exactly the chapter files there are, in reading order, and each row's last
cell is `N (+D)`, N the file's lines and D the lines added since the previous file
(`python tests/readme_counts.py` rewrites those cells after a merge). The Chinese
README has the English one's sections, in the same order, and each links to the other
at the top. The counts here are taken from the files directly, not from readme_counts.
"""
import re

import pytest

import readme_counts
from conftest import ROOT

READMES = ["README.md", "README.zh-CN.md"]
CHAPTER_TAG = re.compile(r"\bs\d\d\b|\bagent_full\b")  # a chapter named in a heading


def chapters():
    names = sorted(p.name for p in ROOT.glob("s[0-9][0-9]_*.py"))
    return names + (["agent_full.py"] if (ROOT / "agent_full.py").exists() else [])


def expected_cells():
    cells, previous = {}, 0
    for name in chapters():
        n = len((ROOT / name).read_text(encoding="utf-8").splitlines())
        cells[name] = f"{n} (+{n - previous})"
        previous = n
    return cells


def table(readme):
    """[(chapter file name, last cell)] of the README's chapter table."""
    lines = (ROOT / readme).read_text(encoding="utf-8").splitlines()
    return [(name, lines[i].rstrip().rstrip("|").rsplit("|", 1)[-1].strip())
            for i, name in readme_counts.table_rows("\n".join(lines))]


def headings(readme):
    """[(level, text)] of the README's headings, code fences skipped."""
    out, fenced = [], False
    for line in (ROOT / readme).read_text(encoding="utf-8").splitlines():
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced and (m := re.match(r"(#+) (.+)", line)):
            out.append((len(m.group(1)), m.group(2).strip()))
    return out


def slug(heading):
    """GitHub's anchor for a heading: lower case, punctuation (full-width too) dropped,
    spaces to hyphens; CJK characters stay."""
    return re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-")


@pytest.mark.parametrize("readme", READMES)
def test_chapter_table_lists_every_chapter_file_in_order(readme):
    assert [name for name, _ in table(readme)] == chapters()


@pytest.mark.parametrize("readme", READMES)
def test_chapter_table_line_counts_match_the_files(readme):
    want = expected_cells()
    wrong = [f"{name}: {cell!r}, the file says {want.get(name)!r}"
             for name, cell in table(readme) if cell != want.get(name)]
    assert not wrong, f"{readme}: run python tests/readme_counts.py\n" + "\n".join(wrong)


def test_chinese_readme_has_the_english_sections_in_order():
    en, zh = headings("README.md"), headings("README.zh-CN.md")
    assert len(zh) == len(en), (
        f"README.md has {len(en)} headings, README.zh-CN.md {len(zh)}: translate the new "
        f"sections\n" + "\n".join(f"{'#' * lvl} {text}" for lvl, text in en))
    for (lvl_en, text_en), (lvl_zh, text_zh) in zip(en, zh):
        assert lvl_zh == lvl_en, f"{text_zh!r} is level {lvl_zh}, {text_en!r} level {lvl_en}"
        assert CHAPTER_TAG.findall(text_zh) == CHAPTER_TAG.findall(text_en), (text_en, text_zh)


def test_each_readme_links_to_the_other_at_the_top():
    for readme, other in [("README.md", "README.zh-CN.md"), ("README.zh-CN.md", "README.md")]:
        first = (ROOT / readme).read_text(encoding="utf-8").lstrip().splitlines()[0]
        assert f"]({other})" in first, f"{readme} starts with {first!r}"


@pytest.mark.parametrize("readme", READMES)
def test_section_links_point_at_headings(readme):
    text = (ROOT / readme).read_text(encoding="utf-8")
    anchors = {slug(h) for _, h in headings(readme)}
    broken = sorted(set(re.findall(r"\]\(#([^)]+)\)", text)) - anchors)
    assert not broken, f"{readme}: links to no heading: {broken}"


def test_readme_counts_rewrites_a_stale_cell_and_only_that_cell():
    counts = readme_counts.line_counts()
    text = readme_counts.rewrite((ROOT / "README.md").read_text(encoding="utf-8"), counts)[0]
    name = "s02_tools.py"
    good = readme_counts.count_cell(*counts[name])
    row = next(line for line in text.splitlines() if line.startswith(f"| `{name}` |"))
    stale_text = text.replace(row, row[:row.rindex(good)] + "| 1 (+1) |")
    fixed, stale = readme_counts.rewrite(stale_text, counts)
    assert stale == [(name, "| 1 (+1) |", good)]
    assert fixed == text
    assert readme_counts.rewrite(fixed, counts)[1] == []


@pytest.mark.parametrize("readme", READMES)
def test_the_boundary_tables_tests_exist(readme):
    """Each test the security table names is a test function in that file."""
    text = (ROOT / readme).read_text(encoding="utf-8")
    named = re.findall(r"`(test_\w+\.py)::(test_\w+)`", text)
    assert len(named) >= 20
    for file, test in named:
        assert re.search(rf"^def {test}\(", (ROOT / "tests" / file).read_text(), re.M), (file, test)


@pytest.mark.parametrize("readme", READMES)
def test_the_compatibility_table_is_the_oracle_tests_list(readme):
    """The table of differences left against the real CLI is made from the oracle
    tests' INTENDED lists (python tests/compat_table.py rewrites it)."""
    import compat_table
    text = (ROOT / readme).read_text(encoding="utf-8")
    assert compat_table.rewritten(text) == text, "run python tests/compat_table.py"
