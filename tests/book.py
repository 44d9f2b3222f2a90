#!/usr/bin/env python3
"""The chapter book: one HTML page per chapter, generated from the files.

    python tests/book.py                        # every chapter, into book/ (git-ignored)
    python tests/book.py --chapters s01 s02     # only those pages, and the index
    python tests/book.py --no-demos             # without recording the demos (fast)
    python tests/book.py --out ../book          # somewhere else

Each chapter page opens with a reading path (the docstring, the hook lines, the
core of the new section, the demo, one exercise) and holds the chapter's docstring
(its diagram kept exactly), the diff from the previous chapter side by side
(pygments' Python lexer colours each side, difflib pairs the lines, unchanged runs
are folded to a few lines of context), the transcript of its offline demo
(`python tests/demo.py sNN`, run when the book is built), and a link to its
exercises, and a link to its reference page. Each chapter also has a page for its new section, `sNN-section.html`:
its sub-sections listed with their reading tier and line count, the [core] ones
open, in the order the mechanism runs, the [hardening] and [extra] ones folded
under the line that says what each stops (or adds); a page for its exercises,
`sNN-exercises.html`; and one for the whole file, `sNN-source.html`. The index is
the chapter table of the README, line counts computed from the files, with the
lines each chapter adds as a bar chart. The pages are plain HTML with their CSS
inline and relative links only: they open from disk, with no server, no script
and no network, and they link only to each other, never to a raw .py or .md file.
The reference pages (docs/*.md and docs/zh-CN/*.md) are rendered into book/docs/
whatever chapters are built, so a link between them, or from a chapter page, opens
a page of the book; a link to a chapter file opens that chapter's page when it was
built, the README the index.

Because the book is generated, it cannot drift from the files. The same files
give the same book, byte for byte, except where a demo itself varies from run to
run (s11's race for a task, s12's lane names and commit ids, timestamps); the
temporary paths, the scripted server's port and the run time in the transcripts
are replaced by placeholders.
"""
import argparse
import ast
import concurrent.futures
import difflib
import functools
import html
import io
import itertools
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import tokenize
import urllib.parse
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from packages import require  # noqa: E402

require("pygments", "markdown_it")  # before pip install: one line that says how, not a traceback
from markdown_it import MarkdownIt          # markdown-it-py and pygments come with rich
from pygments.lexers import PythonLexer
from pygments.token import STANDARD_TYPES

TESTS = Path(__file__).resolve().parent
ROOT = TESTS.parent
DOCS = "docs"          # the reference pages, docs/<chapter file>.md and docs/zh-CN/, as book/docs/...html

CONTEXT = 3            # unchanged lines shown around each change, as `diff -u` does
WIDE = 16              # this many lines added in a row (a new section) span the full width
SIMILAR = 0.5          # a changed pair of lines this alike (difflib ratio) gets its changed words marked
DEMO_TIMEOUT = 600     # seconds one demo may run before the book gives up on it
JOBS = 2               # demos recorded at once: they mostly wait for the scripted model
TITLE = "Build a coding agent, one mechanism at a time"


# --------------------------------------------------------------------------
# The chapters and what the index says about them.
# --------------------------------------------------------------------------

def chapters():
    """[(name, path)] in reading order: s01 ... s12, then agent_full."""
    found = [(p.stem.split("_")[0], p) for p in sorted(ROOT.glob("s[0-9][0-9]_*.py"))]
    if (ROOT / "agent_full.py").exists():
        found.append(("agent_full", ROOT / "agent_full.py"))
    return found


def source_lines(text):
    """The file's lines without their newlines; the count is what `wc -l` says."""
    lines = text.split("\n")
    return lines[:-1] if lines and lines[-1] == "" else lines


def docstring_token(text):
    """The module docstring's token: the first one after the comments, read by
    tokenize, so the file is not parsed whole; None if the file has none."""
    try:
        for tok in tokenize.generate_tokens(io.StringIO(text).readline):
            if tok.type == tokenize.STRING:
                return tok
            if tok.type not in (tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.ENCODING):
                return None
    except (tokenize.TokenError, SyntaxError):
        pass
    return None


def docstring(text):
    """The module docstring exactly as written (no dedent, no trimming)."""
    tok = docstring_token(text)
    try:
        value = ast.literal_eval(tok.string) if tok else ""
    except (SyntaxError, ValueError):
        return ""
    return value if isinstance(value, str) else ""


def docstring_end(text):
    """The last line (1-based) of the module docstring, 0 without one."""
    tok = docstring_token(text)
    return tok.end[0] if tok else 0


@functools.lru_cache(maxsize=None)
def _analysed(path, stamp):
    text = path.read_text(encoding="utf-8")
    lines = source_lines(text)
    return text, lines, tokens_by_line(text, lines)


def analysed(path):
    """(text, lines, highlighted tokens per line) of a file, lexed once per build
    (a chapter is the new side of one diff and the old side of the next)."""
    st = path.stat()
    return _analysed(path, (st.st_mtime_ns, st.st_size))


def mechanism(doc):
    """The docstring's first paragraph after 'file.py - ': what the chapter adds."""
    first = " ".join(doc.strip().split("\n\n")[0].split())
    return first.split(" - ", 1)[-1]


def table(files):
    """One row per chapter: name, file, lines, lines added vs the previous file (as
    the README's table counts them), and what it adds."""
    rows, before = [], 0
    for name, path in files:
        text = path.read_text(encoding="utf-8")
        lines = len(source_lines(text))
        section = own_section(name, source_lines(text))
        rows.append({"name": name, "file": path.name, "lines": lines, "added": lines - before,
                     "what": mechanism(docstring(text)), "tiers": tier_lines(section) if section else None})
        before = lines
    return rows


# --------------------------------------------------------------------------
# Highlighting: pygments tokens, one list per line.
# --------------------------------------------------------------------------

def token_class(ttype):
    while ttype not in STANDARD_TYPES:
        ttype = ttype.parent
    return STANDARD_TYPES[ttype]


PLAIN = {"", "n", "p", "w", "o"}   # names, punctuation, spaces, operators: no span, a smaller page


def tokens_by_line(text, lines):
    """[[(css class, text)] per line], lexed over the whole file so a string that
    spans lines is coloured as one; a line the lexer altered is left plain."""
    out, cur = [], []
    for ttype, value in PythonLexer(stripnl=False, ensurenl=True).get_tokens(text):
        css = token_class(ttype)
        for k, piece in enumerate(value.split("\n")):
            if k:
                out.append(cur)
                cur = []
            if piece:
                cur.append(("" if css in PLAIN else css, piece))
    out = out[:len(lines)]
    out += [[] for _ in range(len(lines) - len(out))]
    return [toks if "".join(t for _, t in toks) == line else [("", line)]
            for toks, line in zip(out, lines)]


def line_html(tokens, marks=()):
    """One line as HTML; `marks` are (start, end) character ranges to emphasise."""
    out, pos = [], 0
    for css, text in tokens:
        end = pos + len(text)
        cuts = sorted({pos, end} | {c for a, b in marks for c in (a, b) if pos < c < end})
        for a, b in zip(cuts, cuts[1:]):
            piece = html.escape(text[a - pos:b - pos], quote=False)
            if any(s <= a and b <= e for s, e in marks):
                piece = f'<span class="mark">{piece}</span>'
            out.append(f'<span class="{css}">{piece}</span>' if css else piece)
        pos = end
    return "".join(out)


WORD = re.compile(r"\w+|[^\w\s]")   # a name, a number or one sign; the spaces between never count


def changed_words(old, new):
    """Character ranges of the words that differ in a pair of similar lines, or
    nothing when the lines are too different for marks to help."""
    a, b = list(WORD.finditer(old)), list(WORD.finditer(new))
    sm = difflib.SequenceMatcher(None, [m[0] for m in a], [m[0] for m in b], autojunk=False)
    if sm.ratio() < SIMILAR:
        return [], []
    marks_a, marks_b = [], []
    for tag, i1, i2, j1, j2 in sm.get_opcodes():
        if tag != "equal":
            if i2 > i1:
                marks_a.append((a[i1].start(), a[i2 - 1].end()))
            if j2 > j1:
                marks_b.append((b[j1].start(), b[j2 - 1].end()))
    return marks_a, marks_b


# --------------------------------------------------------------------------
# The diff: hunks of side-by-side rows, unchanged runs folded.
# --------------------------------------------------------------------------

def hunks(old, new):
    """[[(kind, old index or None, new index or None)] per hunk]; kind is same, del,
    add or chg (a pair of changed lines, side by side, as GitHub's split view), or
    wadd / wdel: one of WIDE or more lines added (removed) in a row, a new section
    say, shown across the whole width instead of beside an empty column."""
    sm = difflib.SequenceMatcher(None, old, new, autojunk=False)
    out = []
    for group in sm.get_grouped_opcodes(CONTEXT):
        rows = []
        for tag, i1, i2, j1, j2 in group:
            if tag == "equal":
                rows += [("same", i, j) for i, j in zip(range(i1, i2), range(j1, j2))]
                continue
            pairs = min(i2 - i1, j2 - j1)
            rows += [("chg", i1 + k, j1 + k) for k in range(pairs)]
            wide = "w" if max(i2 - i1, j2 - j1) - pairs >= WIDE else ""
            rows += [(wide + "del", i, None) for i in range(i1 + pairs, i2)]
            rows += [(wide + "add", None, j) for j in range(j1 + pairs, j2)]
        if any(kind != "same" for kind, _, _ in rows):
            out.append(rows)
    return out


RULER = re.compile(r"# --- (.+?) ---\s*$")


SUB_RULER = re.compile(r"# --- ((?:s\d\d|full)\.(\d+)): (.+?) \[(core|hardening|extra)([^\]]*)\] ---\s*$")
TIER_NAMES = {"core": "core", "hardening": "hardening", "extra": "extra"}
ABOUT_CHARS = 200          # characters of a sub-section's first sentence shown beside its title


def own_section(name, lines):
    """The chapter's own section (`# --- sNN: ... ---`, agent_full's `full:`) as
    {"key", "start", "end", "intro": (first, last), "subs": [...]}, 0-based lines, end
    exclusive; each sub-section {"id", "num", "title", "tier", "start", "end",
    "stops", "test", "about"}; None for a file with no section of its own (s01)."""
    key = "full" if name == "agent_full" else name
    start = next((i for i, line in enumerate(lines) if line.startswith(f"# --- {key}: ")), None)
    if start is None:
        return None
    end = next((i for i in range(start + 1, len(lines))
                if RULER.match(lines[i]) and not lines[i].startswith(f"# --- {key}.")), len(lines))
    rulers = [i for i in range(start + 1, end) if SUB_RULER.match(lines[i])]
    subs = []
    for a, b in zip(rulers, rulers[1:] + [end]):
        m = SUB_RULER.match(lines[a])
        comment = list(itertools.takewhile(lambda line: line.startswith("#"), lines[a + 1:b]))
        stops = next((c[len("# Stops: "):] for c in comment if c.startswith("# Stops: ")), "")
        test = ", ".join(c[len("# Test: "):] for c in comment if c.startswith("# Test: "))
        prose = " ".join(c.lstrip("#").strip() for c in comment
                         if not c.startswith(("# Stops: ", "# Test: ")))
        about = re.split(r"(?<=\.)\s(?=[A-Z])", prose, maxsplit=1)[0] if prose else ""
        about = about if len(about) <= ABOUT_CHARS else about[:ABOUT_CHARS - 1].rsplit(" ", 1)[0] + " …"
        subs.append({"id": m.group(1), "num": int(m.group(2)), "title": m.group(3), "tier": m.group(4),
                     "start": a, "end": b, "stops": stops, "test": test, "about": about})
    return {"key": key, "start": start, "end": end, "intro": (start, rulers[0] if rulers else end),
            "subs": subs}


def tier_lines(section):
    """{tier: lines} of a section's sub-sections."""
    out = dict.fromkeys(TIER_NAMES, 0)
    for sub in section["subs"] if section else []:
        out[sub["tier"]] += sub["end"] - sub["start"]
    return out


def outline(text):
    """[(first line, last line, label)] of each top-level def, class and assignment,
    and of each method, 1-based, for the hunk headers."""
    try:
        body = ast.parse(text).body
    except SyntaxError:
        return []
    spans = []
    for node in body:
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and node is body[0]:
            spans.append((node.lineno, node.end_lineno, "the docstring"))
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            spans.append((node.lineno, node.end_lineno, f"def {node.name}"))
        elif isinstance(node, ast.ClassDef):
            spans.append((node.lineno, node.end_lineno, f"class {node.name}"))
            spans += [(m.lineno, m.end_lineno, f"class {node.name} › def {m.name}") for m in node.body
                      if isinstance(m, (ast.FunctionDef, ast.AsyncFunctionDef))]
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names = [t.id for t in targets if isinstance(t, ast.Name)]
            if names:
                spans.append((node.lineno, node.end_lineno, " = ".join(names)))
    return spans


def where(lines, spans, j):
    """'section · definition' that new line j (0-based) sits in."""
    section = next((m[1] for line in reversed(lines[:j + 1]) if (m := RULER.match(line))), "")
    inside = [label for first, last, label in spans if first <= j + 1 <= last]
    return " · ".join(x for x in (section, inside[-1] if inside else "") if x)


def hook_tag(name):
    """The trailing comment that tags a carried line this chapter changed: '# s06:'."""
    tag = "full" if name == "agent_full" else name
    return re.compile(rf"#\s*{tag}(\.\d+)?:")


def cell(side, kind, number, code):
    """A line number cell and a code cell for one side of a row."""
    if number is None:
        return '<td class="num empty"></td><td class="code empty"></td>'
    css = {"same": "", "add": "add", "del": "del"}[kind]
    return (f'<td class="num {css}">{number + 1}</td>'
            f'<td class="code {css} {side}">{code}</td>')


def row_html(kind, i, j, old, new, old_toks, new_toks, is_hook):
    if kind in ("wadd", "wdel"):
        side, n, toks = ("add", j, new_toks[j]) if kind == "wadd" else ("del", i, old_toks[i])
        rid = f' id="n{j + 1}"' if j is not None else ""
        return (f'<tr class="{kind}{" hook" * is_hook}"{rid}><td class="num {side}">{n + 1}</td>'
                f'<td class="code {side} wide" colspan="3">{line_html(toks)}</td></tr>')
    marks_a, marks_b = changed_words(old[i], new[j]) if kind == "chg" else ((), ())
    left = cell("left", "same" if kind == "same" else "del", i,
                line_html(old_toks[i], marks_a) if i is not None else "")
    right = cell("right", "same" if kind == "same" else "add", j,
                 line_html(new_toks[j], marks_b) if j is not None else "")
    rid = f' id="n{j + 1}"' if j is not None and kind != "same" else ""
    return f'<tr class="{kind}{" hook" * is_hook}"{rid}>{left}{right}</tr>'


def wide_note(rows, r):
    """The line above a run of full-width rows: how many, and which."""
    kind = rows[r][0]
    run = list(itertools.takewhile(lambda x: x[0] == kind, rows[r:]))
    first, last = (run[0][2], run[-1][2]) if kind == "wadd" else (run[0][1], run[-1][1])
    what = "added" if kind == "wadd" else "removed"
    side = "right" if kind == "wadd" else "left"
    return (f'<tr class="wide-note {kind}"><td colspan="4">{len(run):,} lines {what} in a row '
            f'({side} {first + 1}-{last + 1}), shown across the full width</td></tr>')


def fold(count, old_from, new_from):
    if count <= 0:
        return ""
    s = "s" * (count != 1)
    return (f'<div class="fold">⋯ {count:,} unchanged line{s} '
            f'<span class="range">({old_from + 1}-{old_from + count} left, '
            f'{new_from + 1}-{new_from + count} right)</span></div>')


COLGROUP = ('<colgroup><col class="c-num"><col class="c-code"><col class="c-num">'
            '<col class="c-code"></colgroup>')


def hunk_html(n, rows, sides, start, tag, label):
    """One hunk: a header that sticks while it is on screen, then its rows; with
    the hook lines among them, [(new index, text)]."""
    old, new, old_toks, new_toks = sides
    i_n = sum(i is not None for _, i, _ in rows)
    j_n = sum(j is not None for _, _, j in rows)
    head = f"@@ -{start[0] + 1},{i_n} +{start[1] + 1},{j_n} @@"
    body, hooks = [], []
    for r, (kind, i, j) in enumerate(rows):
        if kind in ("wadd", "wdel") and (r == 0 or rows[r - 1][0] != kind):
            body.append(wide_note(rows, r))
        is_hook = kind in ("add", "chg", "wadd") and bool(tag.search(new[j]))
        if is_hook:
            hooks.append((j, new[j].strip()))
        body.append(row_html(kind, i, j, old, new, old_toks, new_toks, is_hook))
    return (head, hooks, f'<div class="hunk" id="h{n}"><div class="hunk-head"><span class="at">'
            f'{head}</span> <span class="where">{html.escape(label)}</span></div>'
            f'<table>{COLGROUP}<tbody>{"".join(body)}</tbody></table></div>')


def split_at_docstring(found, old_end, new_end):
    """Hunks with a hunk that runs on past the docstrings cut in two there, so the
    docstring's part can start folded on its own."""
    out = []
    for rows in found:
        cut = next((r for r, (_, i, j) in enumerate(rows)
                    if (i is None or i >= old_end) and (j is None or j >= new_end)), len(rows))
        parts = [rows[:cut], rows[cut:]]
        if all(any(kind != "same" for kind, _, _ in part) for part in parts):
            out += parts
        else:
            out.append(rows)
    return out


def in_docstring(rows, old_end, new_end):
    """Whether every change of a hunk is inside the two docstrings (1-based ends)."""
    return all((i is None or i < old_end) and (j is None or j < new_end)
               for kind, i, j in rows if kind != "same")


def diff_html(name, prev_path, path):
    """The side-by-side diff of prev_path -> path, its hunk headers and its hook lines.
    A hunk that changes only the docstring (rewritten for every chapter, shown in
    full above it) starts folded, so the diff opens on the code."""
    old_text, old, old_toks = analysed(prev_path)
    new_text, new, new_toks = analysed(path)
    sides, spans, tag = (old, new, old_toks, new_toks), outline(new_text), hook_tag(name)
    doc_ends = docstring_end(old_text), docstring_end(new_text)
    parts, heads, hooks, last_i, last_j = [], [], [], 0, 0
    found_hunks = split_at_docstring(hunks(old, new), *doc_ends)
    for n, rows in enumerate(found_hunks, 1):
        i0 = next((i for _, i, _ in rows if i is not None), last_i)
        j0 = next((j for _, _, j in rows if j is not None), last_j)
        parts.append(fold(i0 - last_i, last_i, last_j))
        label = where(new, spans, next(j0 if j is None else j for kind, _, j in rows if kind != "same"))
        head, found, block = hunk_html(n, rows, sides, (i0, j0), tag, label)
        if in_docstring(rows, *doc_ends):
            changed = sum(kind != "same" for kind, _, _ in rows)
            block = (f'<details class="doc-hunk"><summary>{head} the docstring: {changed} rows '
                     f'changed. It is rewritten for every chapter and shown in full above; '
                     f'open to see its diff</summary>{block}</details>')
        parts.append(block)
        heads.append((n, head, label))
        hooks += found
        last_i = i0 + sum(i is not None for _, i, _ in rows)
        last_j = j0 + sum(j is not None for _, _, j in rows)
    parts.append(fold(len(old) - last_i, last_i, last_j))
    changed = [(i, j) for rows in found_hunks for kind, i, j in rows if kind != "same"]
    return {"html": "".join(parts) if heads else '<div class="fold">the two files are identical</div>',
            "heads": heads, "hooks": hooks, "old": prev_path.name, "new": path.name,
            "added": sum(j is not None for _, j in changed),
            "removed": sum(i is not None for i, _ in changed)}


def listing_html(path):
    """The whole first chapter, one column: there is nothing before it to diff."""
    rows = "".join(f'<tr><td class="num">{k + 1}</td><td class="code">{line_html(toks)}</td></tr>'
                   for k, toks in enumerate(analysed(path)[2]))
    return (f'<div class="diff listing"><table><colgroup><col class="c-num"><col></colgroup>'
            f'<tbody>{rows}</tbody></table></div>')


# --------------------------------------------------------------------------
# The offline demo, recorded as a learner's terminal shows it.
# --------------------------------------------------------------------------

ANSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)")


def normalise(text, tmp):
    """The transcript without colour codes or overwritten lines, and without what
    changes on every run: the temporary folder, the server's port, the run time."""
    text = ANSI.sub("", text).replace("\r\n", "\n")
    text = re.sub(r"[^\n]*\r", "", text)   # a line rewritten in place: its last version
    for path in sorted({str(tmp), os.path.realpath(tmp)}, key=len, reverse=True):
        text = text.replace(path, "$TMPDIR")
    text = re.sub(r"(\$TMPDIR/agent-demo-(?:s\d\d|agent)-(?:home-)?)[A-Za-z0-9_]{8}", r"\1XXXXXXXX", text)
    text = re.sub(r"(http://(?:127\.0\.0\.1|localhost)):\d+", r"\1:PORT", text)
    return re.sub(r"(scripted replies used, )\d+(?:\.\d+)? s\b", r"\1N.N s", text)


def demo_name(name):
    """What tests/demo.py calls a chapter: 'agent' runs agent_full.py (its file name's start)."""
    return "agent" if name == "agent_full" else name


def demo_command(name):
    return f"python tests/demo.py {demo_name(name)}"


def record_demo(name, scratch):
    """(exit status or None on timeout, transcript) of the chapter's offline demo,
    run as a learner runs it; stdout and stderr together, as a terminal shows them."""
    tmp = Path(tempfile.mkdtemp(prefix=f"{name}-", dir=scratch))
    # Not TMUX: run inside tmux, s11's demo would open its teammates' panes in that window.
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ANTHROPIC", "TMUX"))}
    env |= {"HOME": str(tmp), "TMPDIR": str(tmp), "NO_COLOR": "1"}
    try:
        r = subprocess.run([sys.executable, str(TESTS / "demo.py"), demo_name(name)], cwd=tmp, env=env,
                           stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, timeout=DEMO_TIMEOUT)
        code, out = r.returncode, r.stdout
    except subprocess.TimeoutExpired as e:
        code, out = None, e.stdout or b""
    return code, normalise(out.decode("utf-8", "replace"), tmp)


def record_demos(names, jobs=JOBS):
    """{name: (status, transcript)} for the chapters that have a demo scenario."""
    names = [n for n in names if (TESTS / "scenarios" / f"{demo_name(n)}.py").exists()]
    with tempfile.TemporaryDirectory(prefix="agent-book-") as scratch:
        with concurrent.futures.ThreadPoolExecutor(max(1, jobs)) as pool:
            done = dict(zip(names, pool.map(lambda n: record_demo(n, scratch), names)))
        shutil.rmtree(scratch, ignore_errors=True)
    return done


LINE_KINDS = [   # (pattern, css class) for a transcript line; the first match wins
    (re.compile(r"=== "), "t-head"),
    (re.compile(r"(What it shows|What is faked|What is real|Checked at the end|Shown at the end):$"),
     "t-label"),
    (re.compile(r"\$ "), "t-cmd"),
    (re.compile(r"demo \S+: ok \("), "t-ok"),
    (re.compile(r"demo \S+: FAILED|.*Traceback \(most recent call last\)"), "t-fail"),
    (re.compile(r"(\s*\[[^\]]*\])* *> \S"), "t-tool"),
    (re.compile(r"\s*(\[[^\]]*\] *)*\s*error: "), "t-err"),
    (re.compile(r"permission needed|Allow .*\? \[|.*\? \[y/N\]"), "t-ask"),
    (re.compile(r"\s*(\[[^\]]*\] *)*\[(context|subagent|worktree|inbox|mcp|permission mode)\b"), "t-meta"),
]


def transcript_html(text):
    out = []
    for line in text.rstrip("\n").split("\n"):
        css = next((c for pattern, c in LINE_KINDS if pattern.match(line)), "")
        esc = html.escape(line, quote=False)
        out.append(f'<span class="{css}">{esc}</span>' if css else esc)
    return "\n".join(out)


# --------------------------------------------------------------------------
# Pages.
# --------------------------------------------------------------------------

CSS = """
:root { --fg: #1f2328; --muted: #59636e; --faint: #8c959f; --line: #d1d9e0; --soft: #f6f8fa;
  --link: #0969da; --add: #e6ffec; --add-num: #ccffd8; --add-mark: #abf2bc;
  --del: #ffebe9; --del-num: #ffd7d5; --del-mark: #ffb8b0; --hunk: #ddf4ff; --hook: #d4a72c;
  --mono: ui-monospace, "SFMono-Regular", "DejaVu Sans Mono", Menlo, Consolas, monospace;
  --sans: system-ui, -apple-system, "Segoe UI", "Noto Sans", "DejaVu Sans", Helvetica, Arial, sans-serif; }
* { box-sizing: border-box; }
html { background: #fff; color: var(--fg); font: 16px/1.6 var(--sans); }
body { margin: 0; }
a { color: var(--link); text-decoration: none; }
a:hover { text-decoration: underline; }
code, pre, kbd { font-family: var(--mono); }
code { font-size: 0.88em; background: var(--soft); border: 1px solid var(--line); border-radius: 4px;
  padding: 0 0.3em; }
header.top { background: var(--soft); border-bottom: 1px solid var(--line); }
header.top .in, main, footer .in { max-width: 1680px; margin: 0 auto; padding-left: 28px;
  padding-right: 28px; }
header.top .in { display: flex; gap: 1.5em; align-items: baseline; padding-top: 10px; padding-bottom: 10px;
  font-size: 0.92rem; }
header.top .book { font-weight: 600; color: var(--fg); margin-right: auto; }
nav.pn { display: flex; gap: 1.2em; }
nav.pn .off { color: var(--faint); }
main { padding-bottom: 40px; }
.prose { max-width: 46rem; }
h1 { font-size: 2rem; line-height: 1.25; margin: 1.4rem 0 0.2rem; }
h1 .file { font: 500 1.1rem var(--mono); color: var(--muted); margin-left: 0.5em; }
.lead { font-size: 1.12rem; color: #31373d; margin: 0.3rem 0 0.8rem; }
.meta { color: var(--muted); font-size: 0.92rem; }
.toc { display: flex; flex-wrap: wrap; gap: 0.4em 1.4em; margin: 0.8rem 0 0; padding: 0; list-style: none;
  font-size: 0.95rem; }
h2 { font-size: 1.4rem; line-height: 1.3; margin: 2.6rem 0 0.8rem; padding-bottom: 0.3rem;
  border-bottom: 1px solid var(--line); }
h2 .sub { font-weight: 400; color: var(--muted); font-size: 1rem; margin-left: 0.4em; }
pre.doc { font-size: 14px; line-height: 1.5; background: var(--soft); border: 1px solid var(--line);
  border-radius: 6px; padding: 16px 22px; overflow-x: auto; width: max-content; max-width: 100%; margin: 0; }
.stats .plus { color: #1a7f37; font-weight: 600; }
.stats .minus { color: #cf222e; font-weight: 600; }
details.hunks { margin: 0.6rem 0 1rem; font-size: 0.92rem; }
details.hunks summary { cursor: pointer; color: var(--muted); }
details.hunks ol { columns: 2 30em; margin: 0.4rem 0; padding-left: 2.4em; font-family: var(--mono);
  font-size: 12.5px; }
aside.path { border: 1px solid #b6e3ff; background: #f3f9ff; border-radius: 6px; padding: 8px 18px;
  margin: 0.8rem 0 0.4rem; max-width: 60rem; font-size: 0.95rem; }
aside.path ol { margin: 0.2rem 0 0.2rem; padding-left: 1.6em; }
ol.subs { padding-left: 2.4em; font-size: 0.95rem; max-width: 80rem; }
ol.subs li { margin: 0.15rem 0; }
ol.subs li.hardening, ol.subs li.extra { color: var(--muted); }
ol.subs .about, details.sub .about { display: block; color: var(--muted); font-size: 0.9em;
  font-weight: 400; }
.tier { font: 600 11px var(--mono); border-radius: 10px; padding: 1px 8px; margin-left: 0.4em;
  white-space: nowrap; vertical-align: 1px; }
.tier.core { background: #dafbe1; color: #116329; }
.tier.hardening { background: #fff1c2; color: #7d4e00; }
.tier.extra { background: #eef1f4; color: #424a53; }
.n { color: var(--faint); font-size: 0.88em; margin-left: 0.4em; }
section.sub h3, details.sub summary { font-size: 1.05rem; margin: 1.6rem 0 0.5rem; }
details.sub { margin: 0.5rem 0; border: 1px solid var(--line); border-radius: 6px; padding: 4px 12px;
  background: #fcfcfd; }
details.sub[open] { padding-bottom: 10px; }
details.sub summary { cursor: pointer; margin: 0.2rem 0; font-weight: 600; }
details.sub summary .h { font-weight: 600; }
details.sub .test { display: block; color: var(--faint); font: 400 12px var(--mono); }
.exercises h2 { font-size: 1.25rem; }
.hooks { margin: 0.6rem 0 1rem; font-size: 0.95rem; }
.hooks ul { margin: 0.3rem 0; padding-left: 1.2em; }
.hooks li { font: 12.5px/1.6 var(--mono); overflow-wrap: anywhere; }
.hooks li a { margin-right: 0.6em; }
.swatch { display: inline-block; width: 0.8em; height: 0.8em; border-radius: 2px; vertical-align: -0.05em; }
.diff { border: 1px solid var(--line); border-radius: 6px; font: 12.5px/1.6 var(--mono); background: #fff; }
.diff .file-head { display: flex; border-bottom: 1px solid var(--line); background: var(--soft);
  font-weight: 600; border-radius: 6px 6px 0 0; }
.diff .file-head div { width: 50%; padding: 6px 12px; }
.diff .file-head div + div { border-left: 1px solid var(--line); }
.diff table { width: 100%; border-collapse: collapse; table-layout: fixed; }
.diff col.c-num { width: 4.6em; }
.diff td { padding: 0 10px; vertical-align: top; }
.diff td.num { text-align: right; color: var(--faint); user-select: none; font-size: 12px; }
.diff td.code { tab-size: 4; white-space: pre-wrap; overflow-wrap: anywhere; padding-left: calc(10px + 4ch);
  text-indent: -4ch; }   /* a wrapped line goes on indented under its start */
.diff td.code.left { border-right: 1px solid var(--line); }
.diff td.add { background: var(--add); }
.diff td.num.add { background: var(--add-num); color: #1a7f37; }
.diff td.del { background: var(--del); }
.diff td.num.del { background: var(--del-num); color: #b3261e; }
.diff td.empty { background: #f3f4f6; }
.diff td.add .mark { background: var(--add-mark); border-radius: 2px; }
.diff td.del .mark { background: var(--del-mark); border-radius: 2px; }
.diff tr.wide-note td { background: var(--soft); color: var(--muted); font: 12px var(--sans);
  padding: 3px 12px; border-top: 1px solid var(--line); border-bottom: 1px solid var(--line); }
.diff tr.hook td.code.right, .diff tr.hook td.code.wide { box-shadow: inset 3px 0 var(--hook); }
.diff tr:target td { outline: 2px solid #54aeff; outline-offset: -2px; }
.hunk-head { position: sticky; top: 0; z-index: 2; background: var(--hunk); color: #3b4b5c;
  border-top: 1px solid #b6e3ff; border-bottom: 1px solid #b6e3ff; padding: 3px 12px; font-size: 12px; }
.hunk-head .where { color: #0b4a8b; font-weight: 600; margin-left: 0.6em; }
.fold { background: var(--soft); color: var(--muted); text-align: center; padding: 4px 12px;
  font: italic 12.5px var(--sans); }
details.doc-hunk > summary { cursor: pointer; background: var(--hunk); color: #3b4b5c; padding: 4px 12px;
  font: 12px var(--mono); border-bottom: 1px solid #b6e3ff; }
details.doc-hunk[open] > summary { border-bottom: 0; }
.fold .range { color: var(--faint); font-style: normal; margin-left: 0.4em; }
.diff > .fold:last-child { border-radius: 0 0 6px 6px; }
.listing td.code { border: 0; }
.run { margin: 0.2rem 0 0.7rem; }
.note { color: var(--muted); font-size: 0.92rem; max-width: 60rem; }
pre.term { background: #fbfcfd; border: 1px solid var(--line); border-radius: 6px; padding: 14px 20px;
  font: 13px/1.55 var(--mono); white-space: pre-wrap; overflow-wrap: anywhere; max-width: 128ch;
  margin: 0.6rem 0; tab-size: 4; }
.t-head { font-weight: 700; }
.t-label { font-weight: 700; color: var(--muted); }
.t-cmd { color: #0550ae; font-weight: 600; }
.t-tool { color: #8250df; }
.t-meta { color: var(--faint); }
.t-ok { color: #1a7f37; font-weight: 700; }
.t-fail, .t-err { color: #cf222e; font-weight: 600; }
.t-ask { color: #9a6700; font-weight: 600; }
.failed { border-left: 4px solid #cf222e; background: #fff5f5; padding: 6px 12px; }
table.chapters { border-collapse: collapse; width: 100%; margin: 1rem 0; font-size: 0.95rem; }
table.chapters th { text-align: left; font-size: 0.85rem; color: var(--muted); font-weight: 600;
  border-bottom: 2px solid var(--line); padding: 6px 10px; }
table.chapters td { border-bottom: 1px solid var(--line); padding: 8px 10px; vertical-align: top; }
table.chapters td.name { white-space: nowrap; font-weight: 600; }
table.chapters td.name .file { display: block; font: 400 12px var(--mono); color: var(--muted); }
table.chapters td.n { text-align: right; font-variant-numeric: tabular-nums; white-space: nowrap; }
table.chapters tr.front td { border-top: 2px solid var(--line); }
.bar { width: 240px; height: 14px; background: #eef1f4; border-radius: 3px; margin-top: 0.35em; }
.bar span { display: block; height: 100%; background: #2da44e; border-radius: 3px; }
footer { border-top: 1px solid var(--line); color: var(--muted); font-size: 0.88rem; }
footer .in { padding-top: 14px; padding-bottom: 24px; }
.k, .kn, .kd, .kr, .ow, .kp { color: #cf222e; }
.kc, .kt, .nb, .bp, .m, .mi, .mf, .mh, .mo, .mb, .il, .se, .no { color: #0550ae; }
.s, .s1, .s2, .sa, .sb, .sc, .sh, .sx, .sr, .ss, .dl, .sd { color: #0a3069; }
.si { color: #0550ae; }
.c, .c1, .ch, .cm, .cp, .cs, .cpf { color: #6e7781; }
.nf, .fm, .nd { color: #8250df; }
.nc, .ne { color: #953800; }
.nn { color: #1f2328; }
.err { color: inherit; }
.reference { max-width: 64rem; }
.reference h3 { font-size: 1.15rem; margin: 1.8rem 0 0.6rem; }
.reference table { border-collapse: collapse; margin: 0.8rem 0; font-size: 0.92rem; display: block;
  overflow-x: auto; }
.reference th, .reference td { border: 1px solid var(--line); padding: 5px 10px; vertical-align: top;
  text-align: left; }
.reference th { background: var(--soft); }
.reference pre { background: var(--soft); border: 1px solid var(--line); border-radius: 6px;
  padding: 12px 16px; overflow-x: auto; font-size: 13px; line-height: 1.5; }
.reference pre code { background: none; border: 0; padding: 0; font-size: inherit; }
a.ref { font-size: 0.85rem; margin-left: 0.4em; white-space: nowrap; }
"""


def href(target, out):
    """A relative link from a page in `out` to `target`."""
    return urllib.parse.quote(Path(os.path.relpath(target, out)).as_posix())


def page(title, body, nav="", home="index.html", lang="en"):
    return (f'<!DOCTYPE html>\n<html lang="{lang}">\n<head>\n<meta charset="utf-8">\n'
            f'<meta name="viewport" content="width=device-width, initial-scale=1">\n'
            f'<title>{html.escape(title)}</title>\n<style>{CSS}</style>\n</head>\n<body>\n'
            f'<header class="top"><div class="in">'
            f'<a class="book" href="{home}">{TITLE}: the chapter book</a>'
            f'{nav}</div></header>\n<main>\n{body}\n</main>\n'
            f'<footer><div class="in">Generated from the chapter files by <code>python tests/book.py</code>; '
            f'rebuild it after any change. It opens from disk: no server, no script, no network.'
            f'</div></footer>\n</body>\n</html>\n')


def pager(files, k, built):
    """Previous / contents / next links, for the header of a chapter page."""
    def link(n, arrow):
        if not 0 <= n < len(files):
            return f'<span class="off">{arrow}</span>'
        name = files[n][0]
        text = f"← {name}" if arrow == "←" else f"{name} →"
        if name not in built:
            return f'<span class="off" title="not built this time">{text}</span>'
        return f'<a href="{name}.html">{text}</a>'
    return f'<nav class="pn">{link(k - 1, "←")}<a href="index.html">contents</a>{link(k + 1, "→")}</nav>'


def linkify(escaped):
    """Web addresses a docstring contains, as links (text the author wrote, never a resource)."""
    return re.sub(r"https?://[^\s<>&\"']*[^\s<>&\"'.,;:!?)]", lambda m: f'<a href="{m[0]}">{m[0]}</a>',
                  escaped)


def diff_section(name, k, files):
    path = files[k][1]
    if k == 0:
        lines = len(source_lines(path.read_text(encoding="utf-8")))
        return (f'<h2 id="diff">The code <span class="sub">{path.name}, all {lines:,} lines: '
                f'the first chapter, nothing before it to diff</span></h2>\n{listing_html(path)}')
    d = diff_html(name, files[k - 1][1], path)
    hunks_list = "".join(f'<li><a href="#h{n}">{head}</a> {html.escape(label)}</li>'
                         for n, head, label in d["heads"])
    hooks = ""
    if d["hooks"]:
        items = "".join(f'<li><a href="#n{j + 1}">line {j + 1}</a>{html.escape(text)}</li>'
                        for j, text in d["hooks"])
        tag = "full" if name == "agent_full" else name
        hooks = (f'<div class="hooks" id="hooks"><span class="swatch" style="background:var(--hook)"></span> '
                 f'<b>Hook lines</b>: carried code this chapter changed, each tagged '
                 f'<code># {tag}:</code>. They show where the new mechanism plugs in: '
                 f'read them first.<ul>{items}</ul></div>')
    n = len(d["heads"])
    return (f'<h2 id="diff">The diff <span class="sub">{d["old"]} → {d["new"]}</span></h2>\n'
            f'<p class="stats meta"><span class="plus">+{d["added"]:,}</span> '
            f'<span class="minus">−{d["removed"]:,}</span> lines in {n} hunk{"s" * (n != 1)}; '
            f'{CONTEXT} unchanged lines of context around each change, the rest folded. '
            f'Reproduce it: <code>diff {d["old"]} {d["new"]}</code></p>\n'
            f'{hooks}<details class="hunks"><summary>All {n} hunks, by where they are</summary>'
            f'<ol>{hunks_list}</ol></details>\n'
            f'<div class="diff"><div class="file-head"><div>{d["old"]}</div><div>{d["new"]}</div></div>'
            f'{d["html"]}</div>')


def demo_section(name, demo):
    cmd = demo_command(name)
    scenario = f"tests/scenarios/{demo_name(name)}.py"
    if demo is None and not (ROOT / scenario).exists():
        extra = (' <code>python tests/demo.py s12</code> runs the chapter it extends, and its tests '
                 '(<code>tests/test_full_*.py</code>) drive it against the same scripted model.'
                 if name == "agent_full" else "")
        return (f'<h2 id="demo">Offline demo</h2>\n<p class="note">No scripted demo yet '
                f'(<code>{scenario}</code>).{extra}</p>')
    if demo is None:
        return (f'<h2 id="demo">Offline demo</h2>\n<p class="note">Not recorded in this build '
                f'(built with <code>--no-demos</code>, or the chapter has no scenario). '
                f'Run it: <code>{cmd}</code></p>')
    code, text = demo
    status = "" if code == 0 else (
        f'<p class="failed">This demo did not succeed when the book was built '
        f'({"it timed out" if code is None else f"exit status {code}"}): the transcript shows why.</p>')
    return (f'<h2 id="demo">Offline demo <span class="sub">recorded by running it</span></h2>\n'
            f'<p class="run">Reproduce it: <code>{cmd}</code> '
            f'(add <code>--show-requests</code> to see what the model received). No key, no network.</p>\n'
            f'<p class="note">stdout and stderr together, as a terminal shows them (the demo passes '
            f'the chapter\'s stdout on as it streams, so on a busy machine a stderr line can land '
            f'inside a line of the answer, in a terminal as here). The temporary folder is written '
            f'<code>$TMPDIR</code>, its random part <code>XXXXXXXX</code>, the scripted server\'s '
            f'port <code>PORT</code> and the run time <code>N.N s</code>.</p>\n'
            f'{status}<pre class="term">\n{transcript_html(text)}</pre>')


def exercise_names(name, titles=False):
    """The exercises of a chapter's page (`## s07.1 ...` headings), in order; with
    titles, (name, the heading's words after it) pairs."""
    path = ROOT / "exercises" / f"{name}.md"
    text = path.read_text(encoding="utf-8") if path.exists() else ""
    found = re.findall(rf"^## ({re.escape(name)}\.\d+) (.*)$", text, re.M)
    return found if titles else [n for n, _ in found]


def exercises_section(name, out):
    path = ROOT / "exercises" / f"{name}.md"
    if not path.exists():
        return '<h2 id="exercises">Exercises</h2>\n<p class="note">No exercises yet.</p>'
    return (f'<h2 id="exercises">Exercises</h2>\n<p>Extend the mechanism you just read: '
            f'<a href="{name}-exercises.html">the {name} exercises</a> (the goal, the sub-sections '
            f'to read, the functions to touch, a hint, and the command that checks your copy, such as '
            f'<code>python tests/exercise.py {name}.1 my_copy.py</code>).</p>')


def reference_section(path, out):
    """The link from a chapter page to its reference page (and the Chinese twin)."""
    rel = reference_of(path)
    if rel is None:
        return '<h2 id="reference">Reference</h2>\n<p class="note">No reference page yet.</p>'
    twin = Path(DOCS) / "zh-CN" / rel.name
    zh = (f' (中文: <a href="{href(reference_out(twin, out), out)}">{twin.as_posix()}</a>)'
          if (ROOT / twin).exists() else "")
    return (f'<h2 id="reference">Reference</h2>\n<p>What a user of this chapter needs: its '
            f'configuration keys, commands, formats, and what it does not support: '
            f'<a href="{href(reference_out(rel, out), out)}">{rel.as_posix()}</a>{zh}.</p>')


def reading_path(name, k, files, built):
    """The box at the top of a chapter's pages: what to read, in order, each a link."""
    path = files[k][1]
    lines = analysed(path)[1]
    section = own_section(name, lines)
    here = f"{name}.html"
    items = [f'<a href="{here}#doc">The docstring</a>: what is new, a diagram, how to run it']
    if k == 0:
        items.append(f'<a href="{here}#diff">The code</a>: all of it, the first chapter')
    else:
        items.append(f'<a href="{here}#hooks">The hook lines</a> in the diff: where the mechanism plugs '
                     f'into the code before it')
    if section:
        core = [sub for sub in section["subs"] if sub["tier"] == "core"]
        span = core[0]["id"] if len(core) == 1 else f'{core[0]["id"]} to {core[-1]["id"]}'
        items.append(f'<a href="{name}-section.html#core">The core of the new section</a>, {span}: '
                     f'{tier_lines(section)["core"]:,} lines; the hardening and extras can wait')
    items.append(f'<a href="{here}#demo">The offline demo</a>: <code>{demo_command(name)}</code>')
    exercises = exercise_names(name, titles=True)
    if exercises:  # its title beside it: s07.1 also names a sub-section, the gate before every call
        items.append(f'<a href="{name}-exercises.html#{exercises[0][0]}">One exercise</a>, '
                     f'such as {exercises[0][0]}, {inline_md(exercises[0][1])}')
    return ('<aside class="path"><b>Reading path</b><ol>' + "".join(f"<li>{i}</li>" for i in items)
            + '</ol></aside>')


def listing_rows(toks, first, last):
    """Table rows for lines first..last-1 (0-based) of a file, numbered from 1."""
    return "".join(f'<tr id="L{n + 1}"><td class="num">{n + 1}</td><td class="code">{line_html(toks[n])}'
                   f'</td></tr>' for n in range(first, last))


def listing(toks, first, last):
    return (f'<div class="diff listing"><table><colgroup><col class="c-num"><col></colgroup>'
            f'<tbody>{listing_rows(toks, first, last)}</tbody></table></div>')


TIER_WORDS = {"core": "core", "hardening": "hardening: skip on first read", "extra": "extra"}


def sub_line(sub):
    """What a contents row or a folded summary says beside the title."""
    if sub["tier"] == "hardening" and sub["stops"]:
        return f'Stops: {html.escape(sub["stops"])}'
    return html.escape(sub["about"])


def section_page(k, files, built, out):
    """The chapter's new section: its contents by tier, the core open, the rest folded."""
    name, path = files[k]
    text, lines, toks = analysed(path)
    section = own_section(name, lines)
    counts = tier_lines(section)
    contents = "".join(
        f'<li class="{sub["tier"]}"><a href="#{sub["id"]}">{sub["id"]} {html.escape(sub["title"])}</a> '
        f'<span class="tier {sub["tier"]}">{TIER_WORDS[sub["tier"]]}</span> '
        f'<span class="n">{sub["end"] - sub["start"]:,} lines</span>'
        f'<span class="about">{sub_line(sub)}</span></li>' for sub in section["subs"])
    parts = []
    for sub in section["subs"]:
        head = (f'{sub["id"]} {html.escape(sub["title"])} <span class="tier {sub["tier"]}">'
                f'{TIER_WORDS[sub["tier"]]}</span> <span class="n">{sub["end"] - sub["start"]:,} lines, '
                f'<a href="{name}-source.html#L{sub["start"] + 1}">{sub["start"] + 1}-{sub["end"]}</a> '
                f'in {path.name}</span>')
        code = listing(toks, sub["start"], sub["end"])
        if sub["tier"] == "core":
            parts.append(f'<section class="sub core" id="{sub["id"]}"><h3>{head}</h3>{code}</section>')
        else:
            test = f'<span class="test">proved by {html.escape(sub["test"])}</span>' if sub["test"] else ""
            parts.append(f'<details class="sub {sub["tier"]}" id="{sub["id"]}"><summary><span class="h">'
                         f'{head}</span><span class="about">{sub_line(sub)}</span>{test}</summary>'
                         f'{code}</details>')
    first_other = next((i for i, sub in enumerate(section["subs"]) if sub["tier"] != "core"),
                       len(section["subs"]))
    parts.insert(first_other, '<h2 id="later">Hardening and extras <span class="sub">folded: open one '
                              'when an exercise or a question leads there</span></h2>')
    a, b = section["intro"]
    body = (f'<h1>{name}: the new section<span class="file">{path.name}</span></h1>\n'
            f'{reading_path(name, k, files, built)}\n'
            f'<p class="meta">Lines {section["start"] + 1}-{section["end"]} of '
            f'<a href="{name}-source.html#L{section["start"] + 1}">{path.name}</a>: '
            f'core {counts["core"]:,}, hardening {counts["hardening"]:,}, extra {counts["extra"]:,} '
            f'lines in {len(section["subs"])} sub-sections. Core is the mechanism as a learner would '
            f'first write it, in the order it runs; hardening is what a hostile review or a crash test '
            f'added, each with what it stops and the test that proves it; extras go beyond the '
            f'mechanism.</p>\n'
            f'<h2 id="contents">Contents</h2>\n<ol class="subs">{contents}</ol>\n'
            f'<h2 id="core">The core <span class="sub">read it in one sitting, top to bottom</span></h2>\n'
            f'{listing(toks, a, b)}\n{"".join(parts)}\n'
            f'<p class="meta" style="margin-top:2rem">{pager(files, k, built)}</p>')
    return page(f"{name}: the new section · {path.name} · {TITLE}", body, pager(files, k, built))


def source_page(k, files, built, out):
    """The whole chapter file, each line with an anchor (#L123) the other pages link to."""
    name, path = files[k]
    toks = analysed(path)[2]
    body = (f'<h1>{name}: the whole file<span class="file">{path.name}</span></h1>\n'
            f'<p class="meta">{len(toks):,} lines. Reproduce it: <code>cat {path.name}</code>. '
            f'Its sections, each a ruler <code># --- ... ---</code>, are in the same order in every '
            f'chapter.</p>\n{listing(toks, 0, len(toks))}')
    return page(f"{path.name} · {TITLE}", body, pager(files, k, built))


def inline_md(text):
    """`code` and **bold** of one paragraph of an exercise page, the rest escaped."""
    out = []
    for n, part in enumerate(re.split(r"(`[^`]*`)", text)):
        if n % 2:
            out.append(f"<code>{html.escape(part[1:-1], quote=False)}</code>")
        else:
            out.append(re.sub(r"\*\*(.+?)\*\*", r"<b>\1</b>", html.escape(part, quote=False)))
    return "".join(out)


def exercise_html(text, subs=()):
    """An exercise page as HTML: # headings (## ones get their exercise name as id),
    paragraphs, lists, and blocks indented four spaces as code. subs: the chapter's
    sub-sections; a paragraph's "s07.5 (the config files and the start)" links to it
    on the section page, and "s07.1 to s07.7 (" to its core. An exercise's name
    (s07.1, the same digits) stays text: no title follows it."""
    out, link = [], sub_section_links(subs)
    for block in re.split(r"\n\s*\n", text.strip("\n")):
        lines = block.split("\n")
        if all(line.startswith("    ") for line in lines):
            out.append(f'<pre class="term">{html.escape(chr(10).join(line[4:] for line in lines), quote=False)}</pre>')
        elif block.startswith("## "):
            heading = " ".join(lines)[3:]
            hid = heading.split()[0]
            out.append(f'<h2 id="{html.escape(hid)}">{inline_md(heading)}</h2>')
        elif block.startswith("# "):
            out.append(f'<h1>{inline_md(" ".join(lines)[2:])}</h1>')
        elif all(re.match(r"[-*] ", line) or line.startswith("  ") for line in lines):
            items = re.split(r"\n(?=[-*] )", block)
            out.append("<ul>" + "".join(f"<li>{inline_md(' '.join(i[2:].split()))}</li>" for i in items) + "</ul>")
        else:
            out.append(f"<p>{link(inline_md(' '.join(block.split())))}</p>")
    return "\n".join(out)


def sub_section_links(subs):
    """A function that links, in a paragraph's HTML (code spans left alone), each
    sub-section named with its title, and a span of the core sub-sections."""
    if not subs:
        return lambda text: text
    page = f'{subs[0]["id"].split(".")[0]}-section.html'
    named = {f'{sub["id"]} ({html.escape(sub["title"], quote=False)}': sub["id"] for sub in subs}
    rx = re.compile("|".join(sorted(map(re.escape, named), key=len, reverse=True))
                    + r"|\b(s\d\d\.\d+ to s\d\d\.\d+) \(")

    def one(m):
        if m[1]:
            return f'<a href="{page}#core">{m[1]}</a> ('
        ref = named[m[0]]
        return f'<a href="{page}#{ref}">{ref}</a>{m[0][len(ref):]}'
    return lambda text: "".join(part if n % 2 else rx.sub(one, part)
                                for n, part in enumerate(re.split(r"(<code>.*?</code>)", text)))


def exercises_page(k, files, built, out):
    name, path = files[k]
    text = (ROOT / "exercises" / f"{name}.md").read_text(encoding="utf-8")
    section = own_section(name, analysed(path)[1])
    subs = section["subs"] if section and name in built else ()  # links to its page only when built
    body = (f'{reading_path(name, k, files, built)}\n<div class="prose exercises">{exercise_html(text, subs)}</div>\n'
            f'<p class="meta">The page is <code>exercises/{name}.md</code>; the checkers are in '
            f'<code>tests/exercise_checks/{name}.py</code>, the reference solutions in '
            f'<code>exercises/solutions/</code> (reading them gives the exercise away).</p>')
    return page(f"{name} exercises · {TITLE}", body, pager(files, k, built))


def chapter_page(k, files, rows, built, out, diff, demo):
    name, path = files[k]
    row = rows[k]
    doc = docstring(path.read_text(encoding="utf-8"))
    prev = f", +{row['added']:,} on {files[k - 1][1].name}" if k else ""
    section = f'<li><a href="{name}-section.html">The new section, by tier</a></li>' if k else ""
    body = (f'<h1>{name}<span class="file">{path.name}</span></h1>\n'
            f'<p class="lead prose">{html.escape(row["what"])}</p>\n'
            f'<p class="meta">{row["lines"]:,} lines{prev} · source: '
            f'<a href="{name}-source.html">{path.name}</a></p>\n'
            f'{reading_path(name, k, files, built)}\n'
            f'<ul class="toc"><li><a href="#doc">The docstring</a></li><li><a href="#diff">'
            f'{"The code" if k == 0 else "The diff"}</a></li>{section}<li><a href="#demo">Offline demo</a>'
            f'</li><li><a href="#exercises">Exercises</a></li><li><a href="#reference">Reference</a>'
            f'</li></ul>\n'
            f'<h2 id="doc">The docstring <span class="sub">what is new, a diagram, how to run it, '
            f'what to try</span></h2>\n<pre class="doc">\n{linkify(html.escape(doc, quote=False))}</pre>\n'
            f'{diff}\n{demo_section(name, demo)}\n'
            f'{exercises_section(name, out)}\n{reference_section(path, out)}\n'
            f'<p class="meta" style="margin-top:2rem">{pager(files, k, built)}</p>')
    return page(f"{name} · {path.name} · {TITLE}", body, pager(files, k, built))


def index_page(files, rows, built):
    top = max((r["added"] for r in rows), default=1) or 1
    trs = []
    for r in rows:
        name = (f'<a href="{r["name"]}.html">{r["name"]}</a>' if r["name"] in built
                else f'<span title="not built this time">{r["name"]}</span>')
        width = max(0.5, 100 * r["added"] / top)
        front = ' class="front"' if r["name"] == "agent_full" else ""
        rel = reference_of(ROOT / r["file"])
        ref = f' <a class="ref" href="{rel.with_suffix(".html").as_posix()}">reference</a>' if rel else ""
        tiers = r.get("tiers")
        tier_text = " / ".join(f"{n:,}" for n in tiers.values()) if tiers else "—"
        trs.append(f'<tr{front}><td class="name">{name}<span class="file">{r["file"]}</span></td>'
                   f'<td>{html.escape(r["what"])}{ref}</td><td class="n">{tier_text}</td>'
                   f'<td class="n">{r["lines"]:,}</td>'
                   f'<td class="n">+{r["added"]:,}<div class="bar" title="{r["added"]:,} lines added">'
                   f'<span style="width:{width:.1f}%"></span></div></td></tr>')
    start = rows[0]["name"] if rows else "s01"
    first = f'<a href="{start}.html">{start}</a>' if start in built else start
    body = (f'<h1>{TITLE}</h1>\n<div class="prose"><p class="lead">The chapter book: every chapter '
            f'file as a page, generated from the code.</p>\n<p>Each chapter file is the previous one '
            f'plus one mechanism. A page holds what to read for it, in order: the chapter\'s '
            f'<b>docstring</b> (what is new, a diagram, how to run it), the <b>diff</b> from the '
            f'previous chapter side by side (added lines green, removed red, hook lines marked), the '
            f'transcript of its <b>offline demo</b> against the scripted model, recorded when the book '
            f'was built, its <b>exercises</b>, and its <b>reference</b> page. Start with {first}.</p>\n'
            f'<p class="meta">Lines are each file\'s line count; added is the count minus the '
            f'previous file\'s, as in the README\'s chapter table. Core / hardening / extra are the '
            f'lines of a chapter\'s own section by reading tier: read its core first, on its page '
            f'<i>the new section</i>.</p></div>\n'
            f'<table class="chapters"><thead><tr><th>chapter</th><th>mechanism</th>'
            f'<th style="text-align:right">core / hardening / extra</th>'
            f'<th style="text-align:right">lines</th><th>added</th></tr></thead>\n'
            f'<tbody>{"".join(trs)}</tbody></table>')
    return page(TITLE + ": the chapter book", body)


# --------------------------------------------------------------------------
# The reference pages: docs/ rendered into the book.
# --------------------------------------------------------------------------

COMMENT_LINE = re.compile(r"^[ \t]*<!--.*?-->[ \t]*\n?", re.M)   # marker comments: not shown


def reference_pages():
    """The Markdown pages under docs/, repository-relative, sorted."""
    folder = ROOT / DOCS
    return sorted(p.relative_to(ROOT) for p in folder.rglob("*.md")) if folder.is_dir() else []


def reference_out(rel, out):
    """Where the book writes a reference page: docs/x.md -> <out>/docs/x.html."""
    return Path(out) / rel.with_suffix(".html")


def reference_of(path):
    """A chapter file's reference page, docs/<its name>.md, or None."""
    rel = Path(DOCS) / f"{Path(path).stem}.md"
    return rel if (ROOT / rel).exists() else None


def anchor_slug(text):
    """GitHub's anchor for a heading, so the pages' own links (#the-boundary-by-rule) work here."""
    return re.sub(r"[^\w\- ]", "", text.lower()).replace(" ", "-")


def book_link(target, source, page_out, out, built):
    """Where a link of the reference page `source` points in the book: another reference
    page -> its page here; a chapter file -> its chapter page when built; the README ->
    the index (its chapter table), as does a chapter file whose page this build left out;
    a chapter's exercises -> their page (the index when left out); any other file ->
    that file on disk."""
    if re.match(r"[a-z][a-z0-9+.-]*:|#", target, re.I):
        return target
    path, hash_, anchor = target.partition("#")
    dest = Path(os.path.normpath((ROOT / source).parent / urllib.parse.unquote(path)))
    if not dest.is_relative_to(ROOT):
        return target
    rel, here = dest.relative_to(ROOT), page_out.parent
    if rel.suffix == ".md" and rel.parts[0] == DOCS:
        return href(reference_out(rel, out), here) + hash_ + anchor
    if len(rel.parts) == 1 and rel.name in ("README.md", "README.zh-CN.md"):
        return href(Path(out) / "index.html", here)
    chapter = next((n for n, p in chapters() if p.name == rel.name and len(rel.parts) == 1), None)
    if chapter in built:
        return href(Path(out) / f"{chapter}.html", here)
    if chapter:  # a chapter this build left out: its row in the index, never the raw file
        return href(Path(out) / "index.html", here)
    if rel.parent.as_posix() == "exercises" and (rel.stem in built or rel.stem in dict(chapters())):
        page = f"{rel.stem}-exercises.html" if rel.stem in built else "index.html"
        return href(Path(out) / page, here) + (hash_ + anchor if rel.stem in built else "")
    return href(dest, here) + hash_ + anchor


def markdown_html(text, link):
    """A page's Markdown as HTML: tables on, raw HTML off (shown as text), marker
    comments dropped, each heading with GitHub's anchor as its id, links through `link`."""
    md = MarkdownIt("commonmark", {"html": False}).enable("table")
    tokens, seen = md.parse(COMMENT_LINE.sub("", text)), {}
    for k, tok in enumerate(tokens):
        if tok.type == "heading_open":
            base = anchor_slug(tokens[k + 1].content)
            tok.attrSet("id", f"{base}-{seen[base]}" if seen.get(base) else base)
            seen[base] = seen.get(base, 0) + 1
        for child in tok.children or []:
            if child.type == "link_open":
                child.attrSet("href", link(child.attrGet("href")))
    return md.renderer.render(tokens, md.options, {})


def reference_page(rel, out, built):
    """One reference page of docs/, as a page of the book."""
    text = (ROOT / rel).read_text(encoding="utf-8")
    page_out = reference_out(rel, out)
    here = page_out.parent
    body = markdown_html(text, lambda target: book_link(target, rel, page_out, out, built))
    title = next((m[1] for m in re.finditer(r"^# (.+)$", text, re.M)), rel.stem)
    home = href(Path(out) / "index.html", here)
    chapter = next((n for n, p in chapters() if p.stem == rel.stem), None)
    links = [f'<a href="{home}">contents</a>']
    if chapter in built:
        links.insert(0, f'<a href="{href(Path(out) / f"{chapter}.html", here)}">{chapter}: the chapter '
                        f'page</a>')
    source = (f'<p class="meta" style="margin-top:2rem">Rendered from <code>{rel.as_posix()}</code>; '
              f'links to other pages of docs/ open them in the book.</p>')
    return page(f"{title} · {TITLE}", f'<div class="reference">{body}</div>\n{source}',
                f'<nav class="pn">{"".join(links)}</nav>', home, "zh-CN" if "zh-CN" in rel.parts else "en")


# --------------------------------------------------------------------------
# Building.
# --------------------------------------------------------------------------

def select(files, wanted):
    """The chapter names asked for ('s01', 'agent_full' or 'full'), checked."""
    if not wanted:
        return [n for n, _ in files]
    known = [n for n, _ in files]
    picked = ["agent_full" if w.startswith(("full", "agent_full")) else w.split("_")[0] for w in wanted]
    if bad := [w for w, p in zip(wanted, picked) if p not in known]:
        raise SystemExit(f"book: no chapter named {', '.join(bad)}; try: {', '.join(known)}")
    return [n for n in known if n in picked]


def build(out, chapters_wanted=None, demos=True, jobs=JOBS):
    """Write the index and the chosen chapter pages into `out`; returns the demos
    that did not succeed, one line each."""
    out = Path(out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    files = chapters()
    built = select(files, chapters_wanted)
    rows = table(files)
    with concurrent.futures.ThreadPoolExecutor(1) as runner:   # the demos run while the diffs are made
        pending = runner.submit(record_demos, built if demos else [], jobs)
        diffs = {name: diff_section(name, k, files) for k, (name, _) in enumerate(files) if name in built}
        recorded = pending.result()
    for k, (name, path) in enumerate(files):
        if name in built:
            html_text = chapter_page(k, files, rows, built, out, diffs[name], recorded.get(name))
            (out / f"{name}.html").write_text(html_text, encoding="utf-8")
            (out / f"{name}-source.html").write_text(source_page(k, files, built, out), encoding="utf-8")
            if own_section(name, analysed(path)[1]):
                (out / f"{name}-section.html").write_text(section_page(k, files, built, out), encoding="utf-8")
            if (ROOT / "exercises" / f"{name}.md").exists():
                (out / f"{name}-exercises.html").write_text(exercises_page(k, files, built, out),
                                                           encoding="utf-8")
    (out / "index.html").write_text(index_page(files, rows, built), encoding="utf-8")
    for rel in reference_pages():   # all of them: they link to each other
        target = reference_out(rel, out)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(reference_page(rel, out, built), encoding="utf-8")
    return [f"demo {n}: {'timed out' if c is None else f'exit status {c}'}"
            for n, (c, _) in sorted(recorded.items()) if c != 0]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(ROOT / "book"), help="the folder to write (default: book/)")
    ap.add_argument("--chapters", nargs="+", metavar="sNN", help="only these chapter pages")
    ap.add_argument("--no-demos", action="store_true", help="do not run the demos (no transcripts)")
    ap.add_argument("--jobs", type=int, default=JOBS, help=f"demos run at once (default {JOBS})")
    args = ap.parse_args(argv)
    started = time.monotonic()
    failed = build(args.out, args.chapters, demos=not args.no_demos, jobs=args.jobs)
    for line in failed:
        print(f"book: {line} (its page shows the transcript)", file=sys.stderr)
    index = Path(args.out).resolve() / "index.html"
    print(f"book: wrote {index} ({time.monotonic() - started:.1f} s)")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
