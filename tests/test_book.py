"""The chapter book (tests/book.py): built for two chapters, then opened in headless
Chromium as a reader opens it, from disk. Besides a chapter's page, the book has
one for its new section (the sub-sections by reading tier: the core open, the
rest folded under what each stops), one for its exercises and one for its source;
every page links inside the book, never to a raw .py or .md file.

The build runs in-process; only the two demos it records run as subprocesses. The
Chromium test skips, and says why, only where no chromium binary exists (.ci/run
installs Debian's). The other tests need no browser: the HTML links to nothing
outside the book, the same files give the same book, the transcripts lose what
changes from run to run, the exercises are linked only once they exist, the reference
pages of docs/ are rendered into the book and every chapter page links to its own.
"""
import re
import shutil
import subprocess
import urllib.parse
from html.parser import HTMLParser

import pytest

from conftest import ROOT

import book

BUILT = ["s01", "s02"]      # two chapters keep the suite fast; s02 is the page with a diff
BROWSERS = ["chromium", "chromium-browser", "google-chrome", "google-chrome-stable"]
VOID = {"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source",
        "track", "wbr"}


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    out = tmp_path_factory.mktemp("book")
    failed = book.build(out, BUILT)   # records the two demos: python tests/demo.py sNN
    assert failed == [], failed
    return out


class Elements(HTMLParser):
    """Every element as (tag, attributes, text inside it, children's text included)."""

    def __init__(self, text):
        super().__init__(convert_charrefs=True)
        self.stack, self.found = [], []
        self.feed(text)
        self.close()

    def handle_starttag(self, tag, attrs):
        entry = (tag, dict(attrs), [])
        if tag in VOID:
            self.found.append((tag, entry[1], ""))
        else:
            self.stack.append(entry)

    def handle_endtag(self, tag):
        while self.stack:   # an element left open by the page closes with its parent
            t, attrs, parts = self.stack.pop()
            text = "".join(parts)
            self.found.append((t, attrs, text))
            if self.stack:
                self.stack[-1][2].append(text)
            if t == tag:
                break

    def handle_data(self, data):
        if self.stack:
            self.stack[-1][2].append(data)

    def having(self, tag=None, *classes):
        """Texts of the elements with this tag (any, if None) and all these classes."""
        return [text for t, attrs, text in self.found
                if (tag is None or t == tag) and set(classes) <= set((attrs.get("class") or "").split())]


# --------------------------------------------------------------------------
# Without a browser.
# --------------------------------------------------------------------------

URL_ATTRS = {"src", "href", "srcset", "action", "formaction", "poster", "data", "background"}


def outside_links(page, allowed=()):
    """Every way the page could reach past the book: a resource or a link off disk."""
    found = []
    for tag, attrs, _ in Elements(page).found:
        if tag in ("script", "link", "iframe", "object", "embed", "img", "video", "audio", "base"):
            found.append(f"<{tag}>")
        for name, value in attrs.items():
            value = (value or "").strip()
            if name in URL_ATTRS and re.match(r"([a-z][a-z0-9+.-]*:|//)", value, re.I):
                if not (tag == "a" and name == "href" and value in allowed):
                    found.append(f"<{tag} {name}={value!r}>")
    found += re.findall(r"@import|url\(", page)
    return found


def test_the_reference_pages_reach_nothing_outside_the_book_but_their_own_web_links(tmp_path):
    book.build(tmp_path, ["s01"], demos=False)
    for rel in book.reference_pages():
        written = set(re.findall(r"\]\((https?://[^)\s]+)\)", (ROOT / rel).read_text(encoding="utf-8")))
        page = book.reference_out(rel, tmp_path).read_text(encoding="utf-8")
        assert outside_links(page, written) == [], rel
    assert outside_links(book.markdown_html("<script>alert(1)</script> [x](https://x.example/)\n",
                                            lambda t: t)) == ["<a href='https://x.example/'>"]


def test_the_html_reaches_nothing_outside_the_book(tmp_path, monkeypatch):
    # A docstring's own address becomes a link (text the author wrote), never a resource;
    # a transcript's stays text.
    real = book.docstring
    monkeypatch.setattr(book, "docstring", lambda text: real(text) + "\nSee https://example.com/spec.\n")
    book.build(tmp_path, ["s01", "s02", "s03"], demos=False)
    page = book.chapter_page(1, book.chapters(), book.table(book.chapters()), ["s02"], tmp_path,
                             "", (0, "fetched http://example.org/x\n"))
    pages = sorted(tmp_path.glob("*.html"))
    assert [p.name for p in pages] == [
        "index.html", "s01-exercises.html", "s01-source.html", "s01.html", "s02-exercises.html",
        "s02-section.html", "s02-source.html", "s02.html", "s03-exercises.html", "s03-section.html",
        "s03-source.html", "s03.html"]
    allowed = {"https://example.com/spec"}
    for p in pages:
        assert outside_links(p.read_text(encoding="utf-8"), allowed) == [], p.name
    assert outside_links(page, allowed) == []
    assert '<a href="https://example.com/spec">' in (tmp_path / "s02.html").read_text()
    assert "fetched http://example.org/x" in page and 'href="http://example.org' not in page
    # ... and the checker itself sees each way out.
    bad = ('<script src="https://cdn.example/x.js"></script><link rel="stylesheet" href="//f.example/a.css">'
           '<img src="http://x/y.png"><a href="https://x/">x</a><style>@import "https://x";</style>')
    assert len(outside_links(bad)) == 8


def test_relative_links_land_on_pages_of_the_book(tmp_path):
    """Every relative link of every page (the reference pages in docs/ too) lands on a
    file, a chapter or its exercises always on their page of the book (never the raw
    .py or .md file, nor a README), and a link into a page on an element with that id."""
    book.build(tmp_path, ["s01", "s02"], demos=False)
    pages = sorted(tmp_path.rglob("*.html"))
    assert len(pages) > 3 + 2 * len(book.chapters()) - 1   # the index, two chapters, the reference pages
    ids = {p: {attrs["id"] for _, attrs, _ in Elements(p.read_text(encoding="utf-8")).found if "id" in attrs}
           for p in pages}
    for page in pages:
        for tag, attrs, _ in Elements(page.read_text(encoding="utf-8")).found:
            href = attrs.get("href") or ""
            if tag != "a" or not href or re.match(r"[a-z]+:", href):
                continue
            target, _, anchor = href.partition("#")
            dest = (page.parent / urllib.parse.unquote(target)).resolve() if target else page
            raw = dest.suffix in (".py", ".md") and dest.parent in (ROOT.resolve(), (ROOT / "exercises").resolve())
            assert not raw, f"{page.name} links to {target}: a chapter or exercise file, not its page of the book"
            assert dest.exists(), f"{page.name} links to {target}"
            if anchor and dest in ids:
                assert urllib.parse.unquote(anchor) in ids[dest], f"{page.relative_to(tmp_path)} links to {href}: no such id"
    s02 = (tmp_path / "s02.html").read_text(encoding="utf-8")
    assert 'href="s01.html"' in s02 and 'href="s03.html"' not in s02   # s03 was not built


def test_each_chapter_page_links_its_reference_page_and_the_pages_link_inside_the_book(tmp_path):
    book.build(tmp_path, ["s06", "s07"], demos=False)
    s07 = Elements((tmp_path / "s07.html").read_text(encoding="utf-8"))
    links = {attrs.get("href") for tag, attrs, _ in s07.found if tag == "a"}
    assert {"docs/s07_permissions.html", "docs/zh-CN/s07_permissions.html"} <= links
    index = (tmp_path / "index.html").read_text(encoding="utf-8")
    assert index.count('class="ref"') == len(book.chapters())          # a reference link per row
    page = Elements((tmp_path / "docs" / "s07_permissions.html").read_text(encoding="utf-8"))
    hrefs = [attrs.get("href") for tag, attrs, _ in page.found if tag == "a"]
    assert "s08_hooks.html" in hrefs and "s06_compact.html" in hrefs   # the next and previous pages
    assert "zh-CN/s07_permissions.html" in hrefs                       # the Chinese twin
    assert "../s07.html" in hrefs          # the chapter file: its page, built this time
    assert "../index.html" in hrefs        # the README: the book's index
    assert "../s07-exercises.html" in hrefs   # the exercises: their page of the book
    raw = [h for h in hrefs if h.split("#")[0].endswith((".md", ".py"))]
    assert not raw, raw                     # no raw .md or .py file, the page's own source neither
    ids = {attrs.get("id") for _, attrs, _ in page.found}
    assert {"permissions-s07-and-later", "the-boundary-by-rule"} <= ids   # GitHub's anchors
    text = "".join(page.having("td"))
    assert "test_s02_door.py::test_the_path_judged_is_the_path_written" in text   # the security table
    s08 = Elements((tmp_path / "docs" / "s08_hooks.html").read_text(encoding="utf-8"))
    targets = {(tmp_path / "docs" / attrs["href"]).resolve() for tag, attrs, _ in s08.found
               if tag == "a" and not attrs.get("href", "").startswith(("http", "#"))}
    assert (ROOT / "s08_hooks.py").resolve() not in targets   # s08 was not built: not the raw file,
    assert (tmp_path / "index.html").resolve() in targets      # its row in the index
    compat = (tmp_path / "docs" / "agent_full.html").read_text(encoding="utf-8")
    assert "compat-table" not in compat and "held by" in compat      # the marker comments are not shown


def test_the_same_files_give_the_same_book(tmp_path):
    book.build(tmp_path / "a", BUILT, demos=False)
    book.build(tmp_path / "b", BUILT, demos=False)
    names = sorted(p.relative_to(tmp_path / "a") for p in (tmp_path / "a").rglob("*") if p.is_file())
    assert names == sorted(p.relative_to(tmp_path / "b") for p in (tmp_path / "b").rglob("*") if p.is_file())
    for name in names:
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes(), name


def test_a_transcript_loses_what_changes_from_run_to_run(tmp_path):
    raw = (f"  (scripted model at http://127.0.0.1:39979, workspace {tmp_path}/agent-demo-s01-o07_fxv5)\n"
           f"home {tmp_path}/agent-demo-s01-home-abcdefgh, agent_full's {tmp_path}/agent-demo-agent-x1_y2z3w\n"
           "\x1b[1;33mloud\x1b[0m\nspinner 1\rspinner 2\n"
           "demo s01: ok (4 requests, 4/4 scripted replies used, 5.0 s, check held: it held)\n")
    assert book.normalise(raw, tmp_path) == (
        "  (scripted model at http://127.0.0.1:PORT, workspace $TMPDIR/agent-demo-s01-XXXXXXXX)\n"
        "home $TMPDIR/agent-demo-s01-home-XXXXXXXX, agent_full's $TMPDIR/agent-demo-agent-XXXXXXXX\n"
        "loud\nspinner 2\n"
        "demo s01: ok (4 requests, 4/4 scripted replies used, N.N s, check held: it held)\n")


def test_exercises_are_linked_once_their_file_exists(tmp_path, monkeypatch):
    monkeypatch.setattr(book, "ROOT", tmp_path)
    out = tmp_path / "book"
    assert "No exercises yet" in book.exercises_section("s03", out)
    (tmp_path / "exercises").mkdir()
    (tmp_path / "exercises" / "s03.md").write_text("# s03 exercises\n")
    assert 'href="s03-exercises.html"' in book.exercises_section("s03", out)


def test_an_exercise_page_is_the_markdown_as_html():
    text = ("# s09 exercises: memory\n\nRead **this** first: `s09.3`.\n\n    cp a b\n    run it\n\n"
            "## s09.1 `/recall` a thing\n\n**Goal.** x < y.\n")
    assert book.exercise_html(text) == (
        "<h1>s09 exercises: memory</h1>\n<p>Read <b>this</b> first: <code>s09.3</code>.</p>\n"
        '<pre class="term">cp a b\nrun it</pre>\n<h2 id="s09.1">s09.1 <code>/recall</code> a thing</h2>\n'
        "<p><b>Goal.</b> x &lt; y.</p>")


def test_an_exercise_page_links_the_sub_sections_it_names_into_the_section_page(tmp_path):
    """A Read line's "s07.5 (the config files and the start)" opens that sub-section in
    the book, and the reading order's core span opens the core; an exercise's own
    name, the same digits with no title after it, stays text."""
    files = book.chapters()
    k = [n for n, _ in files].index("s07")
    page = Elements(book.exercises_page(k, files, ["s07"], tmp_path))
    links = {(attrs["href"], text) for tag, attrs, text in page.found if tag == "a" and "href" in attrs}
    for ref in ("s07.5", "s07.2", "s07.23", "s07.6"):          # exercise s07.1's Read line
        assert (f"s07-section.html#{ref}", ref) in links, ref
    assert ("s07-section.html#core", "s07.1 to s07.7") in links
    assert not any(text == "s07.1" for _, text in links)        # the exercise, not the gate
    assert "s12.1 needs git" in book.exercise_html("s12.1 needs git: (a) repository.", [
        {"id": "s12.1", "title": "a lane: made or reused"}])


def test_the_section_page_lists_each_sub_section_by_tier_core_open_the_rest_folded(tmp_path):
    files = book.chapters()
    k = [n for n, _ in files].index("s07")
    section = book.own_section("s07", book.analysed(files[k][1])[1])
    page = Elements(book.section_page(k, files, ["s07"], tmp_path))
    rows = page.having("li")
    for sub in section["subs"]:                    # the contents: every sub-section, its tier, its lines
        row = next(t for t in rows if t.startswith(f"{sub['id']} {sub['title']}"))
        assert f"{sub['end'] - sub['start']:,} lines" in row and book.TIER_WORDS[sub["tier"]] in row
        if sub["tier"] == "hardening":
            assert f"Stops: {sub['stops']}" in row
    core = [sub["id"] for sub in section["subs"] if sub["tier"] == "core"]
    folded = [sub["id"] for sub in section["subs"] if sub["tier"] != "core"]
    assert core and folded
    shown = {attrs.get("id") for tag, attrs, _ in page.found if tag == "section"}
    closed = {attrs.get("id") for tag, attrs, _ in page.found if tag == "details" and "open" not in attrs}
    assert set(core) <= shown and not set(core) & closed        # the core is open
    assert set(folded) <= closed                                # hardening and extras folded
    summaries = page.having("summary")
    for sub in section["subs"]:
        if sub["tier"] == "hardening":
            assert any(t.startswith(sub["id"]) and f"Stops: {sub['stops']}" in t and sub["test"] in t
                       for t in summaries), sub["id"]


def test_each_chapter_page_opens_with_its_reading_path(tmp_path):
    files = book.chapters()
    rows = book.table(files)
    k = [n for n, _ in files].index("s07")
    page = Elements(book.chapter_page(k, files, rows, ["s07"], tmp_path, "", None))
    path = page.having("aside", "path")[0]
    for words in ("The docstring", "The hook lines", "The core of the new section, s07.1 to",
                  "The offline demo", "One exercise, such as s07.1, git push always asks"):
        assert words in path, words
    links = [attrs["href"] for tag, attrs, _ in page.found if tag == "a" and "href" in attrs]
    for target in ("s07.html#doc", "s07.html#hooks", "s07-section.html#core", "s07.html#demo",
                   "s07-exercises.html#s07.1", "s07-source.html"):
        assert target in links, target


def test_the_index_counts_lines_as_the_readme_table_does():
    rows = {r["file"]: (r["lines"], r["added"]) for r in book.table(book.chapters())}
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    listed = {m[1]: (int(m[2]), int(m[3]))
              for m in re.finditer(r"^\| `((?:s\d\d_\w+|agent_full)\.py)` \|.*\| (\d+) \(\+(\d+)\) \|$",
                                   readme, re.M)}
    assert listed and listed == {f: rows[f] for f in listed}
    assert set(f for f in rows if f.startswith("s")) <= set(listed)   # agent_full's row: where there is one


def test_a_failed_demo_says_so_on_its_page():
    text = book.demo_section("s03", (1, "demo s03: FAILED: the chapter exited with status 1\n"))
    assert "did not succeed" in text and "exit status 1" in text and 'class="t-fail"' in text


# --------------------------------------------------------------------------
# In a browser: what a reader sees.
# --------------------------------------------------------------------------

def dump_dom(browser, page, profile):
    """The page's DOM once Chromium has loaded and rendered it from disk."""
    r = subprocess.run([browser, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                        "--disable-background-networking", "--disable-component-update",
                        "--disable-sync", "--no-first-run", f"--user-data-dir={profile}",
                        "--dump-dom", page.as_uri()],
                       capture_output=True, text=True, timeout=180)
    assert r.returncode == 0 and "</html>" in r.stdout, r.stderr[-2000:]
    return Elements(r.stdout)


def test_chromium_renders_the_index_and_a_chapter_page(request, tmp_path):
    browser = next((shutil.which(b) for b in BROWSERS if shutil.which(b)), None)
    if browser is None:
        pytest.skip("no chromium binary on PATH (.ci/run installs Debian's chromium package)")
    built = request.getfixturevalue("built")   # only now: the build records two demos
    index = dump_dom(browser, built / "index.html", tmp_path / "profile")
    rows = index.having("tr")
    for r in book.table(book.chapters()):   # the chapter table, with every chapter's counts
        row = next((t for t in rows if t.startswith(r["name"] + r["file"])), None)
        assert row is not None, f"no row for {r['name']}"
        assert f"{r['lines']:,}" in row and f"+{r['added']:,}" in row
    assert len(index.having("div", "bar")) == len(book.chapters())
    assert ("a", {"href": "s02.html"}, "s02") in index.found

    page = dump_dom(browser, built / "s02.html", tmp_path / "profile")
    s02 = (ROOT / "s02_tools.py").read_text(encoding="utf-8")
    assert page.having("pre", "doc") == [book.docstring(s02)]      # the docstring, exactly
    assert "s02_tools.py - a tool system" in book.docstring(s02)
    before = (ROOT / "s01_agent_loop.py").read_text(encoding="utf-8")
    old, new = book.source_lines(before), book.source_lines(s02)
    i, j = next((i, j) for rows in book.hunks(old, new) for kind, i, j in rows   # a changed code line
                if kind == "chg" and i >= book.docstring_end(before) and old[i].strip())
    assert old[i] in page.having("td", "code", "del", "left")       # both sides of it
    assert new[j] in page.having("td", "code", "add", "right")
    assert page.having("details", "doc-hunk")                       # the docstring's part, folded
    assert "def safe_path(p):" in page.having("td", "code", "add")   # an added line, s02's sandbox
    assert "def" in page.having("span", "k") and "import" in page.having("span", "kn")  # highlighted
    assert page.having("div", "hunk-head") and page.having("div", "fold")
    assert page.having("aside", "path")                               # the reading path, at the top
    section = dump_dom(browser, built / "s02-section.html", tmp_path / "profile")
    assert section.having("h2") and "The core" in "".join(section.having("h2"))
    assert [t for t in section.having("span", "tier", "core")]      # tier badges, drawn
    assert all("open" not in attrs for tag, attrs, _ in section.found if tag == "details" and
               "sub" in (attrs.get("class") or ""))                  # hardening and extras folded
    term = page.having("pre", "term")[0]                             # the demo's transcript
    assert '> read_file {"path": "/etc/passwd"}' in term
    assert "is outside the workspace ($TMPDIR/agent-demo-s02-XXXXXXXX)" in term
    assert "demo s02: ok (" in term and "check held" in term
    assert "python tests/demo.py s02" in "".join(page.having("code"))
    ref = dump_dom(browser, built / "docs" / "s02_tools.html", tmp_path / "profile")   # a reference page
    assert ref.having("h1") == ["s02: tools"] and "`" not in "".join(ref.having("h2"))
    assert any(cell.startswith("read_file") for cell in ref.having("td"))          # its tools table
    assert ("a", {"href": "../s02.html"}, "s02_tools.py") in ref.found                # the chapter's page
