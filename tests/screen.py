"""A fixed-width terminal screen, in the standard library: what a terminal of that
size would show after a program's output, as plain text.

    screen = Screen(100, 40)
    answer = screen.feed(raw_text)   # bytes the terminal would send back (a cursor report)
    print(screen.text())             # every line the program left, scrolled-off ones too

The offline demo runs agent_full's interactive UI in a pseudo-terminal and keeps
this rendering of it: rich and prompt_toolkit draw with cursor moves and erases,
which a transcript of the raw bytes would show as noise, and a live region (the
spinner, the answer as it streams) leaves only its last frame, as on a screen.

Handled: printable text with wrapping at the right margin (wide characters take
two columns), CR, LF, BS, TAB; CSI cursor moves (A B C D E F G H f d), erases
(J K X), insert and delete (@ P L M), save and restore (s u, ESC 7 and 8), and the
cursor position report (6n), answered as a terminal answers it. Colours, modes,
titles and every other sequence are read and ignored. Rows that scroll off the
top stay in text(), as a terminal's scrollback keeps them.
"""
import re
import unicodedata

SEQUENCE = re.compile(r"\x1b\[([0-?]*)([ -/]*)([@-~])"      # CSI: parameters, intermediates, final
                      r"|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)?"  # OSC (a title): up to BEL or ST
                      r"|\x1b[P^_][^\x1b]*(?:\x1b\\)?"        # DCS, PM, APC strings
                      r"|\x1b[()*+][0-~]"                     # a character set
                      r"|\x1b[ -/]*[0-~]?")                   # any other escape (ESC 7, ESC =, ...)


class Screen:
    """Rows of characters; the visible part is the last `rows` rows of them."""

    def __init__(self, cols=100, rows=40):
        self.cols, self.rows = cols, rows
        self.lines = [[]]
        self.x = self.y = 0      # the cursor: column, and row counted from the first line ever
        self.top = 0             # the first visible row
        self.saved = (0, 0)
        self.pending = False     # a character was written in the last column: the next one wraps

    # -- the cursor's rows ------------------------------------------------------------

    def row(self, y):
        while len(self.lines) <= y:
            self.lines.append([])
        return self.lines[y]

    def down(self):
        """LF: the next row; at the bottom of the screen the screen scrolls up one."""
        self.y += 1
        self.row(self.y)
        if self.y >= self.top + self.rows:
            self.top = self.y - self.rows + 1

    def move(self, y=None, x=None):
        if y is not None:
            self.y = min(max(y, self.top), self.top + self.rows - 1)
            self.row(self.y)
        if x is not None:
            self.x = min(max(x, 0), self.cols - 1)
        self.pending = False

    # -- writing ----------------------------------------------------------------------

    def put(self, ch):
        width = 2 if unicodedata.east_asian_width(ch) in "WF" else 0 if unicodedata.combining(ch) else 1
        if width == 0:
            return
        if self.pending or self.x + width > self.cols:
            self.x, self.pending = 0, False
            self.down()
        line = self.row(self.y)
        line.extend(" " * (self.x + width - len(line)))
        line[self.x] = ch
        if width == 2:
            line[self.x + 1] = ""   # the right half of a wide character
        self.x += width
        if self.x >= self.cols:
            self.x, self.pending = self.cols - 1, True

    def erase_line(self, how):
        line = self.row(self.y)
        if how == 0:
            del line[self.x:]
        elif how == 1:
            line[:self.x + 1] = [" "] * min(self.x + 1, len(line))
        else:
            line.clear()

    def erase_screen(self, how):
        if how == 0:
            self.erase_line(0)
            del self.lines[self.y + 1:]
        elif how == 1:
            for y in range(self.top, self.y):
                self.lines[y].clear()
            self.erase_line(1)
        else:  # the visible rows; the scrollback stays
            for y in range(self.top, len(self.lines)):
                self.lines[y].clear()

    def csi(self, params, final):
        nums = [int(p) if p.isdigit() else 0 for p in params.lstrip("?>=").split(";")] if params else []
        n = max(nums[0], 1) if nums else 1
        private = params[:1] in ("?", ">", "=")
        if private:
            return ""
        if final == "A":
            self.move(y=self.y - n)
        elif final in "Be":
            self.move(y=self.y + n)
        elif final in "Ca":
            self.move(x=self.x + n)
        elif final == "D":
            self.move(x=self.x - n)
        elif final == "E":
            self.move(y=self.y + n, x=0)
        elif final == "F":
            self.move(y=self.y - n, x=0)
        elif final in "G`":
            self.move(x=n - 1)
        elif final in "Hf":
            col = nums[1] if len(nums) > 1 and nums[1] else 1
            self.move(y=self.top + n - 1, x=col - 1)
        elif final == "d":
            self.move(y=self.top + n - 1)
        elif final == "K":
            self.erase_line(nums[0] if nums else 0)
        elif final == "J":
            self.erase_screen(nums[0] if nums else 0)
        elif final == "X":
            line = self.row(self.y)
            for i in range(self.x, min(self.x + n, len(line))):
                line[i] = " "
        elif final == "P":
            del self.row(self.y)[self.x:self.x + n]
        elif final == "@":
            line = self.row(self.y)
            if len(line) > self.x:
                line[self.x:self.x] = [" "] * n
                del line[self.cols:]
        elif final in "LM":
            for _ in range(n):
                if final == "L":
                    self.lines.insert(self.y, [])
                else:
                    del self.lines[self.y]
            self.row(self.y)
        elif final == "s":
            self.saved = (self.x, self.y - self.top)
        elif final == "u":
            self.move(y=self.top + self.saved[1], x=self.saved[0])
        elif final == "n" and nums[:1] == [6]:  # where is the cursor? rows and columns from 1
            return f"\x1b[{self.y - self.top + 1};{self.x + 1}R"
        return ""

    def feed(self, text):
        """Take the program's output; returns what a terminal would answer ("" mostly)."""
        answer, at = [], 0
        for m in SEQUENCE.finditer(text):
            self.plain(text[at:m.start()])
            at = m.end()
            seq = m[0]
            if m[3] is not None:
                answer.append(self.csi(m[1], m[3]) if not m[2] else "")
            elif seq == "\x1b7":
                self.saved = (self.x, self.y - self.top)
            elif seq == "\x1b8":
                self.move(y=self.top + self.saved[1], x=self.saved[0])
        self.plain(text[at:])
        return "".join(answer)

    def plain(self, text):
        for ch in text:
            if ch == "\r":
                self.x, self.pending = 0, False
            elif ch == "\n":
                self.pending = False
                self.down()
            elif ch == "\b":
                self.move(x=self.x - 1)
            elif ch == "\t":
                self.move(x=(self.x // 8 + 1) * 8)
            elif ch >= " " and ch != "\x7f":
                self.put(ch)

    def text(self):
        """Every row, scrolled off or visible, without trailing spaces or trailing empty rows."""
        rows = ["".join(line).rstrip() for line in self.lines]
        while rows and not rows[-1]:
            rows.pop()
        return "\n".join(rows) + "\n" if rows else ""

    def visible(self):
        return "\n".join("".join(line).rstrip() for line in self.lines[self.top:self.top + self.rows])
