"""The READMEs and the reference pages stay in step with the files and with each other.

README.md is the landing page, README.zh-CN.md its Chinese translation; docs/ holds one
reference page per chapter file (docs/s07_permissions.md ... docs/agent_full.md) and
docs/zh-CN/ the same pages in Chinese. Each English page and its Chinese twin have the
same headings (level and chapter names), the same tables (shape and code), the same
commands (code blocks and inline `python ...` commands), and link to each other at the
top. Both READMEs carry the chapter table: it lists exactly the chapter files there are,
in reading order, and each row's last cell is `N (+D)`, N the file's lines and D the
lines added since the previous file, the cell before it `C / H / E`, the lines of the
chapter's own section by reading tier (`python tests/readme_counts.py` rewrites those
cells, and the quote of s01's loop, after a merge). The counts here are taken from the
files directly, not from readme_counts. Every relative link in these files lands on a
file that exists, and every anchor on a heading of its page.
"""
import ast
import os
import re
from collections import Counter
from pathlib import Path

import pytest

import readme_counts
from conftest import ROOT

READMES = ["README.md", "README.zh-CN.md"]
CHAPTER_TAG = re.compile(r"\bs\d\d\b|\bagent_full\b")  # a chapter named in a heading
LANDING_MAX_LINES = 300   # the landing page stays one (about 250 lines); the reference is in docs/


def chapters():
    names = sorted(p.name for p in ROOT.glob("s[0-9][0-9]_*.py"))
    return names + (["agent_full.py"] if (ROOT / "agent_full.py").exists() else [])


def pairs():
    """(English file, Chinese file) of every page that has a twin: the READMEs, then
    one reference page per chapter file."""
    return [("README.md", "README.zh-CN.md")] + [
        (f"docs/{Path(name).stem}.md", f"docs/zh-CN/{Path(name).stem}.md") for name in chapters()]


def markdown_files():
    return sorted({*READMES, *(p.relative_to(ROOT).as_posix() for p in (ROOT / "docs").rglob("*.md"))})


def read(name):
    return (ROOT / name).read_text(encoding="utf-8")


def expected_cells():
    cells, previous = {}, 0
    for name in chapters():
        n = len((ROOT / name).read_text(encoding="utf-8").splitlines())
        cells[name] = f"{n} (+{n - previous})"
        previous = n
    return cells


def expected_tiers():
    """{file: "C / H / E"}: the lines of each [core], [hardening...] and [extra]
    sub-section of the file's own section, from its ruler to the next ruler."""
    cells = {}
    for name in chapters():
        key = "full" if name == "agent_full.py" else name[:3]
        lines = (ROOT / name).read_text(encoding="utf-8").splitlines()
        rulers = [i for i, line in enumerate(lines) if re.match(r"# --- .+ ---$", line)] + [len(lines)]
        total = {"core": 0, "hardening": 0, "extra": 0}
        for i, j in zip(rulers, rulers[1:]):
            m = re.match(rf"# --- {key}\.\d+: .+ \[(core|hardening|extra)\b", lines[i])
            if m:
                total[m.group(1)] += j - i
        cells[name] = " / ".join(map(str, total.values())) if any(total.values()) else "—"
    return cells


def tier_cells(readme):
    """[(chapter file name, the cell before the last)] of the README's chapter table."""
    lines = (ROOT / readme).read_text(encoding="utf-8").splitlines()
    return [(name, lines[i].rstrip().rstrip("|").rsplit("|", 2)[-2].strip())
            for i, name in readme_counts.table_rows("\n".join(lines))]


def table(readme):
    """[(chapter file name, last cell)] of the README's chapter table."""
    lines = read(readme).splitlines()
    return [(name, lines[i].rstrip().rstrip("|").rsplit("|", 1)[-1].strip())
            for i, name in readme_counts.table_rows("\n".join(lines))]


# --------------------------------------------------------------------------
# Reading markdown: what the checks compare.
# --------------------------------------------------------------------------

FENCE = re.compile(r"^ *```.*?^ *```[ \t]*$", re.M | re.S)
SPAN = re.compile(r"(?<!`)(`+)(?!`)(.+?)(?<!`)\1(?!`)", re.S)   # a code span, `x` or `` x ``
LINK = re.compile(r"\]\(([^)\s]+)\)")


def prose(text):
    """The text without code blocks and code spans: where links and headings are."""
    return SPAN.sub("", FENCE.sub("", text))


def headings(name):
    """[(level, text)] of a page's headings, code blocks skipped."""
    return [(len(m[1]), m[2].strip()) for m in re.finditer(r"^(#+) (.+)$", FENCE.sub("", read(name)), re.M)]


def slug(heading):
    """GitHub's anchor for a heading: lower case, punctuation (full-width too) dropped,
    spaces to hyphens; CJK characters stay."""
    return re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-")


def anchors(name):
    """Every anchor a page has; a repeated heading gets -1, -2, ... as on GitHub."""
    seen, out = Counter(), set()
    for _, text in headings(name):
        base = slug(text)
        out.add(base if not seen[base] else f"{base}-{seen[base]}")
        seen[base] += 1
    return out


def fences(name):
    return [m[0].strip() for m in FENCE.finditer(read(name))]


def spans(text):
    return [" ".join(m[2].split()) for m in SPAN.finditer(text)]


def tables(name):
    """[(rows, columns per row, Counter of the code spans in it)] of a page's tables."""
    found, rows = [], []
    for line in FENCE.sub("", read(name)).splitlines() + [""]:
        if line.strip().startswith("|"):
            rows.append(line.strip())
        elif rows:
            cells = [len(re.split(r"(?<!\\)\|", SPAN.sub("x", r).strip("|"))) for r in rows]
            found.append((len(rows), cells, Counter(spans("\n".join(rows)))))
            rows = []
    return found


def commands(name):
    """The inline commands a page gives (`python ...`), whatever the language around them."""
    return Counter(s for s in spans(FENCE.sub("", read(name))) if s.startswith("python "))


# --------------------------------------------------------------------------
# The chapter table and the quoted loop.
# --------------------------------------------------------------------------

@pytest.mark.parametrize("readme", READMES)
def test_chapter_table_lists_every_chapter_file_in_order(readme):
    assert [name for name, _ in table(readme)] == chapters()


@pytest.mark.parametrize("readme", READMES)
def test_chapter_table_line_counts_match_the_files(readme):
    want = expected_cells()
    wrong = [f"{name}: {cell!r}, the file says {want.get(name)!r}"
             for name, cell in table(readme) if cell != want.get(name)]
    assert not wrong, f"{readme}: run python tests/readme_counts.py\n" + "\n".join(wrong)


@pytest.mark.parametrize("readme", READMES)
def test_chapter_table_tier_counts_match_the_files(readme):
    want = expected_tiers()
    wrong = [f"{name}: {cell!r}, the file says {want.get(name)!r}"
             for name, cell in tier_cells(readme) if cell != want.get(name)]
    assert not wrong, f"{readme}: run python tests/readme_counts.py\n" + "\n".join(wrong)


def test_readme_counts_rewrites_a_stale_tier_cell_and_only_that_cell():
    counts, tiers = readme_counts.line_counts(), readme_counts.all_tier_counts()
    text = readme_counts.rewrite((ROOT / "README.md").read_text(encoding="utf-8"), counts, tiers)[0]
    row = next(line for line in text.splitlines() if line.startswith("| `s07_permissions.py` |"))
    good = readme_counts.tier_cell(tiers["s07_permissions.py"])
    stale_text = text.replace(row, row.replace(good, "| 1 / 2 / 3 "))
    fixed, stale = readme_counts.rewrite(stale_text, counts, tiers)
    assert stale == [("s07_permissions.py", "| 1 / 2 / 3 |", good + "|")]
    assert fixed == text and readme_counts.rewrite(fixed, counts, tiers)[1] == []


def test_readme_counts_rewrites_a_stale_cell_and_only_that_cell():
    counts = readme_counts.line_counts()
    text = readme_counts.rewrite(read("README.md"), counts)[0]
    name = "s02_tools.py"
    good = readme_counts.count_cell(*counts[name])
    row = next(line for line in text.splitlines() if line.startswith(f"| `{name}` |"))
    stale_text = text.replace(row, row[:row.rindex(good)] + "| 1 (+1) |")
    fixed, stale = readme_counts.rewrite(stale_text, counts)
    assert stale == [(name, "| 1 (+1) |", good)]
    assert fixed == text
    assert readme_counts.rewrite(fixed, counts)[1] == []


def s01_loop():
    """s01's agent_loop from its def to its first except, read here without readme_counts."""
    text = read("s01_agent_loop.py")
    fn = next(n for n in ast.parse(text).body if getattr(n, "name", "") == "agent_loop")
    tried = next(n for n in fn.body if isinstance(n, ast.Try))
    return text.splitlines()[fn.lineno - 1:tried.handlers[0].lineno - 1]


@pytest.mark.parametrize("readme", READMES)
def test_the_core_loop_the_readme_shows_is_s01s_own(readme):
    text = read(readme)
    assert "<!-- core-loop:" in text, f"{readme} shows no core loop"
    quoted = text.split("<!-- core-loop:", 1)[1].split("```python\n", 1)[1].split("```", 1)[0]
    loop = s01_loop()
    assert 20 <= len(loop) <= 35, f"s01's loop is {len(loop)} lines: no longer a short quote"
    assert quoted.splitlines() == loop, f"{readme}: run python tests/readme_counts.py"


def test_readme_counts_quotes_the_loop_again_after_s01_changes(tmp_path):
    (tmp_path / "s01_agent_loop.py").write_text(
        read("s01_agent_loop.py").replace("    unknown = 0\n", "    unknown = 0  # changed\n", 1))
    loop = readme_counts.core_loop(tmp_path)
    fixed, stale = readme_counts.rewrite_loop(read("README.md"), loop)
    assert stale and "    unknown = 0  # changed\n" in fixed
    assert readme_counts.rewrite_loop(fixed, loop) == (fixed, False)


# --------------------------------------------------------------------------
# The landing page.
# --------------------------------------------------------------------------

@pytest.mark.parametrize("readme", READMES)
def test_the_set_up_commands_come_before_the_first_demo(readme):
    lines = read(readme).splitlines()
    install = next(i for i, line in enumerate(lines) if "pip install -r requirements.txt" in line)
    demo = next(i for i, line in enumerate(lines) if "tests/demo.py" in line)
    assert install < demo, f"{readme}: the first demo (line {demo + 1}) comes before the install"


def test_the_readme_is_a_landing_page():
    n = len(read("README.md").splitlines())
    assert n <= LANDING_MAX_LINES, f"README.md has {n} lines: move reference material to docs/"


def test_ci_runs_the_readmes_test_command():
    """.ci/run runs the command the README's Tests section gives, word for word."""
    section = read("README.md").split("\n## Tests\n", 1)[1]
    command = section.split("```sh\n", 1)[1].splitlines()[0].strip()
    run = read(".ci/run").splitlines()
    at = next(i for i, line in enumerate(run) if line.startswith("# The README's test command"))
    assert run[at + 1].strip() == command


@pytest.mark.parametrize("readme", READMES)
def test_the_readme_links_every_reference_page(readme):
    folder = "docs/" if readme == "README.md" else "docs/zh-CN/"
    linked = set(re.findall(rf"\]\({re.escape(folder)}([\w]+\.md)\)", read(readme)))
    assert linked == {f"{Path(name).stem}.md" for name in chapters()}


# --------------------------------------------------------------------------
# English and Chinese in step, page by page.
# --------------------------------------------------------------------------

def test_every_chapter_has_a_reference_page_in_both_languages():
    missing = [p for en, zh in pairs() for p in (en, zh) if not (ROOT / p).exists()]
    assert not missing, f"no page: {missing}"
    extra = {p.relative_to(ROOT).as_posix() for p in (ROOT / "docs").rglob("*.md")} - {
        p for pair in pairs() for p in pair}
    assert not extra, f"pages with no chapter file: {sorted(extra)}"


@pytest.mark.parametrize("en,zh", pairs())
def test_the_chinese_page_has_the_english_headings_in_order(en, zh):
    h_en, h_zh = headings(en), headings(zh)
    assert len(h_zh) == len(h_en), (
        f"{en} has {len(h_en)} headings, {zh} {len(h_zh)}: translate the new sections\n"
        + "\n".join(f"{'#' * lvl} {text}" for lvl, text in h_en))
    for (lvl_en, text_en), (lvl_zh, text_zh) in zip(h_en, h_zh):
        assert lvl_zh == lvl_en, f"{text_zh!r} is level {lvl_zh}, {text_en!r} level {lvl_en}"
        assert CHAPTER_TAG.findall(text_zh) == CHAPTER_TAG.findall(text_en), (text_en, text_zh)


@pytest.mark.parametrize("en,zh", pairs())
def test_the_chinese_page_has_the_english_tables(en, zh):
    """The same tables, in order: as many rows and cells, and the same code in them."""
    t_en, t_zh = tables(en), tables(zh)
    assert len(t_zh) == len(t_en), f"{en} has {len(t_en)} tables, {zh} {len(t_zh)}"
    for k, ((rows_en, cells_en, code_en), (rows_zh, cells_zh, code_zh)) in enumerate(zip(t_en, t_zh), 1):
        assert (rows_zh, cells_zh) == (rows_en, cells_en), f"table {k}: rows or cells differ"
        assert code_zh == code_en, (f"table {k}: code only in {en}: {sorted(code_en - code_zh)}, "
                                    f"only in {zh}: {sorted(code_zh - code_en)}")


@pytest.mark.parametrize("en,zh", pairs())
def test_the_chinese_page_has_the_english_commands(en, zh):
    assert fences(zh) == fences(en), f"{zh}: its code blocks differ from {en}'s"
    assert commands(zh) == commands(en), (f"inline commands only in {en}: {commands(en) - commands(zh)}, "
                                          f"only in {zh}: {commands(zh) - commands(en)}")


@pytest.mark.parametrize("en,zh", pairs())
def test_each_page_links_to_its_twin_at_the_top(en, zh):
    for page, other in [(en, zh), (zh, en)]:
        first = read(page).lstrip().splitlines()[0]
        target = os.path.relpath(other, os.path.dirname(page) or ".")
        assert f"]({target})" in first, f"{page} starts with {first!r}, not a link to {other}"


# --------------------------------------------------------------------------
# Links.
# --------------------------------------------------------------------------

def broken_links(name):
    """Every relative link of a page that lands on no file, or on no heading."""
    broken, here = [], (ROOT / name).parent
    for target in LINK.findall(prose(read(name))):
        if re.match(r"[a-z][a-z0-9+.-]*:", target, re.I):
            continue   # a web address: not checked offline
        path, _, anchor = target.partition("#")
        dest = (here / path).resolve() if path else ROOT / name
        if not dest.exists():
            broken.append(f"{target}: no such file")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest.relative_to(ROOT).as_posix()):
            broken.append(f"{target}: no such heading")
    return broken


@pytest.mark.parametrize("name", markdown_files())
def test_relative_links_and_anchors_resolve(name):
    assert broken_links(name) == [], name


def test_the_link_check_sees_a_missing_file_and_a_missing_heading(tmp_path, monkeypatch):
    import test_readme_tables as me
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "a.md").write_text("# A page\n\n## Some part\n")
    (tmp_path / "README.md").write_text(
        "# Title\n\n[ok](docs/a.md#some-part) [ok](#title) [web](https://example.com/x)\n"
        "[gone](docs/b.md) [typo](docs/a.md#some-parts) [self](#nothing) `[code](not/a/link.md)`\n")
    monkeypatch.setattr(me, "ROOT", tmp_path)
    assert broken_links("README.md") == [
        "docs/b.md: no such file", "docs/a.md#some-parts: no such heading", "#nothing: no such heading"]


# --------------------------------------------------------------------------
# The tables other tools write or name.
# --------------------------------------------------------------------------

SECURITY = ["docs/s07_permissions.md", "docs/zh-CN/s07_permissions.md"]   # the boundary, by rule


@pytest.mark.parametrize("page", SECURITY)
def test_the_boundary_tables_tests_exist(page):
    """Each test the security table names is a test function in that file."""
    named = re.findall(r"`(test_\w+\.py)::(test_\w+)`", read(page))
    assert len(named) >= 20
    for file, test in named:
        assert re.search(rf"^def {test}\(", (ROOT / "tests" / file).read_text(), re.M), (file, test)


@pytest.mark.parametrize("page", ["docs/agent_full.md", "docs/zh-CN/agent_full.md"])
def test_the_compatibility_table_is_the_oracle_tests_list(page):
    """The table of differences left against the real CLI is made from the oracle
    tests' INTENDED lists (python tests/compat_table.py rewrites it)."""
    import compat_table
    assert page in compat_table.PAGES
    text = read(page)
    assert compat_table.rewritten(text) == text, "run python tests/compat_table.py"
