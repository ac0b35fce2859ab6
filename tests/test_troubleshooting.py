"""The troubleshooting page quotes what the code prints.

Every line of a ``text`` block on the page is a quoted message: a user who searches the page for
the error in front of them must find it. Each one must match a message template of hxmpi's source
(``hxmpi/`` and ``csrc/``): every string literal there (f-strings, ``%`` and ``.format``
templates, implicit concatenations joined) becomes a regex whose placeholders match anything, one
per line of the message, and the quoted line must contain a match of one of them. The few lines
that MPI, mpi4py or Python print are listed in ``FOREIGN`` by where they come from, and must match
no template of hxmpi's (so the list cannot hide a message hxmpi prints). The few that hxmpi builds
from several literals (a setting's range from the schema, a checkpoint's path and the OS error)
are listed in ``COMPOSED`` with the source code of each piece, which must be in the source.
"""
import re
from functools import lru_cache
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PAGE = ROOT / "docs" / "reference" / "troubleshooting.md"
SOURCES = [*sorted((ROOT / "hxmpi").rglob("*.py")), *sorted((ROOT / "csrc").glob("*.pyx")),
           *sorted((ROOT / "csrc").glob("*.pxi"))]

#: Quoted lines that are not hxmpi's, and who prints them.
FOREIGN = {
    "Error: OSC UCX component priority set inside component query failed": "Open MPI",
    "MPI_ABORT was invoked on rank 1 in communicator MPI_COMM_WORLD": "Open MPI",
    "There are not enough slots available in the system to satisfy the 8": "Open MPI",
    "slots that were requested by the application:": "Open MPI",
    "prterun has detected an attempt to run as root.": "Open MPI (PRRTE)",
    "The PMIx server's listener thread failed to start": "Open MPI (PRRTE)",
    "TypeError: Cannot convert StepRequest to mpi4py.MPI.Request": "mpi4py",
    "TypeError: Cannot convert HitRequest to mpi4py.MPI.Request": "mpi4py",
    "Traceback (most recent call last):": "Python",
    "python -m hxmpi.train: error: unrecognized arguments: --nope": "argparse, on hxmpi's error line",
}

#: Quoted lines hxmpi builds from several literals, each with the source code of its pieces.
COMPOSED = {
    "python -m hxmpi.train: error: --momentum must lie in [0, 1), got 2.0":
        ['print(f"{PROG}: error: {text}"', 'f"{flag(exc.setting)} {exc.detail}"', '"momentum", float, 0.9',
         'rule="in [0, 1)"', "f\"{'lie' if rule.startswith('in ') else 'be'} {rule}\"",
         'f"must {_rule_text(s.rule)}"', 'f"{detail}, got {value}"'],
    "hxmpi.errors.SettingError: momentum must lie in [0, 1), got 2.0":
        ['super().__init__(f"{setting} {detail}")', '"momentum", float, 0.9', 'rule="in [0, 1)"',
         "f\"{'lie' if rule.startswith('in ') else 'be'} {rule}\"", 'f"must {_rule_text(s.rule)}"',
         'f"{detail}, got {value}"'],
    "python -m hxmpi.data: error: /home/user/mystore/index.json: missing 'splits'":
        ['f"{where}: missing {key!r}"', '"splits"'],
    "python -m hxmpi.train: error: rank 0: cannot write checkpoints to notes.txt/ckpt: NotADirectoryError: "
    "[Errno 20] Not a directory: 'notes.txt/ckpt'":
        ['f"cannot {what}: {type(exc).__name__}: {exc}"', 'f"write checkpoints to {directory}"'],
}

HOLE = "\x00"  # a placeholder in a template
#: A template must hold at least this many words of literal text to count: "{}: {}",
#: "rank {}: {}" or "cache directory" would match too much.
MIN_WORDS = 3

# A string literal: optional prefix, then its quotes (triple first).
_LITERAL = re.compile(r"(?P<prefix>[rRbBuUfF]{0,3})(?P<quote>'''|\"\"\"|'|\")")
_ESCAPES = {"n": "\n", "t": "\t", "\\": "\\", "'": "'", '"': '"', "\n": ""}


def _literals(source: str):
    """Yield (prefix, body) of every string literal in Python or Cython source, comments skipped,
    adjacent literals (implicit concatenation) joined into one with the prefix of each kept."""
    i, n, run, last_end = 0, len(source), [], -1
    while i < n:
        c = source[i]
        if c == "#":
            i = source.find("\n", i)
            i = n if i < 0 else i
            continue
        m = _LITERAL.match(source, i) if (c in "\"'" or c.isalpha()) else None
        if m and (i == 0 or not (source[i - 1].isalnum() or source[i - 1] == "_")):
            quote, j = m.group("quote"), m.end()
            while j < n and not source.startswith(quote, j):
                j += 2 if source[j] == "\\" else 1
            body = source[m.end():j]
            between = source[last_end:i] if last_end >= 0 else None
            if run and between is not None and re.fullmatch(r"(?:\s|\\\n|#[^\n]*)*", between):
                run.append((m.group("prefix").lower(), body))
            else:
                if run:
                    yield run
                run = [(m.group("prefix").lower(), body)]
            i = last_end = j + len(quote)
            continue
        if c.isalnum() or c == "_":
            while i < n and (source[i].isalnum() or source[i] == "_"):
                i += 1
            continue
        i += 1
    if run:
        yield run


def _unescape(text: str) -> str:
    return re.sub(r"\\(.)", lambda m: _ESCAPES.get(m.group(1), m.group(0)), text, flags=re.S)


def _fstring(body: str) -> str:
    """An f-string's text with each replacement field made a HOLE (nested braces and quotes in it)."""
    out, i, depth = [], 0, 0
    while i < len(body):
        c = body[i]
        if depth == 0 and body.startswith("{{", i) or depth == 0 and body.startswith("}}", i):
            out.append(c)
            i += 2
            continue
        if c == "{":
            depth += 1
            if depth == 1:
                out.append(HOLE)
        elif c == "}" and depth:
            depth -= 1
        elif depth == 0:
            out.append(c)
        i += 1
    return "".join(out)


def _plain(body: str) -> str:
    """A plain string's text with ``%`` and ``.format`` fields made HOLEs."""
    body = re.sub(r"%(?:\([^)]*\))?[-+ #0]*(?:\d+|\*)?(?:\.\d+)?[diouxXeEfFgGcrsa]", HOLE, body)
    return re.sub(r"\{[^{}]*\}", HOLE, body)


def template_text(parts) -> str:
    """One joined literal as text with HOLEs for its placeholders."""
    text = ""
    for prefix, body in parts:
        piece = _fstring(body) if "f" in prefix else _plain(body)
        text += piece if "r" in prefix else _unescape(piece)
    return text


#: What a program puts before any message of its own: not the message.
_PROGRAM = re.compile(r"python -m hxmpi[\w.]*|\berror\b")


def _words(text: str) -> int:
    return len(re.findall(r"[A-Za-z_]{3,}", _PROGRAM.sub(" ", text.replace(HOLE, " "))))


def compile_template(text: str) -> list:
    """A template's lines as regexes (placeholders match anything); none when too little of the
    template is literal text to tell one message from another (a program's name and "error:" do not
    count). A line of a message of several lines counts when the whole message does, if it has
    words and a placeholder of its own."""
    if _words(text) < MIN_WORDS:
        return []
    return [re.compile(".*?".join(re.escape(piece) for piece in line.strip().split(HOLE)))
            for line in text.split("\n") if _words(line) >= MIN_WORDS or HOLE in line and _words(line)]


@lru_cache(maxsize=None)
def templates() -> tuple:
    """Every message template line of hxmpi's source, as a regex."""
    found = {}
    for path in SOURCES:
        for parts in _literals(path.read_text()):
            for regex in compile_template(template_text(parts)):
                found[regex.pattern] = regex
    return tuple(found.values())


def matches_source(message: str) -> bool:
    return any(t.search(message) for t in templates())


def quoted_messages(page: str) -> list:
    """Every line of the page's ``text`` blocks."""
    return [line.strip() for block in re.findall(r"```text\n(.*?)```", page, re.S)
            for line in block.splitlines() if line.strip()]


def test_every_quoted_message_is_one_the_code_prints():
    quoted = quoted_messages(PAGE.read_text())
    assert len(quoted) >= 30
    unknown = [q for q in quoted if q not in FOREIGN and q not in COMPOSED and not matches_source(q)]
    assert unknown == [], "quoted on the troubleshooting page, printed by no code:\n" + "\n".join(unknown)


def test_composed_messages_are_built_from_pieces_in_the_source():
    """Each composed line is quoted on the page, matches no single template (else it belongs in
    neither list), and every piece it is built from is in the source as written."""
    quoted = quoted_messages(PAGE.read_text())
    source = "".join(path.read_text() for path in SOURCES)
    assert [q for q in COMPOSED if q not in quoted] == []
    assert [q for q in COMPOSED if matches_source(q)] == []
    assert [piece for pieces in COMPOSED.values() for piece in pieces if piece not in source] == []


def test_foreign_messages_are_quoted_and_not_hxmpis():
    """Each exempt line is on the page, and hxmpi prints none of them."""
    quoted = quoted_messages(PAGE.read_text())
    assert [f for f in FOREIGN if f not in quoted] == []
    assert [f for f in FOREIGN if matches_source(f)] == []


def test_the_checker_catches_a_made_up_message():
    """Real messages pass (an f-string, a %-free constant, a joined literal, a line of a
    two-line message); invented or misquoted ones fail."""
    assert len(templates()) > 200
    real = ["hxmpi.errors.TopologyError: rank 2: node_of has shape (3,), expected (4,): one node id per rank",
            "hxmpi.errors.PlanStateError: Wait() without Start(); call Start() first",
            "hxmpi: rank 3: 2 nonblocking all-to-all(s) were still in flight at exit; completed them before "
            "MPI_Finalize (Wait() for every request)",
            "  in HierComm.Alltoall, on this rank alone: the other ranks cannot learn of it and would wait forever, "
            "so the job is aborted (MPI_Abort)"]
    assert [m for m in real if not matches_source(m)] == []
    made_up = ["hxmpi.errors.TopologyError: node_of has 3 entries for 4 ranks",  # the page's old paraphrase
               "hxmpi.errors.ExchangeError: rank 2: the frobnicator overflowed on the node window",
               "hxmpi.errors.PlanStateError: Start() called twice; call Wait()",
               "python -m hxmpi.train: error: rank 0: checkpoint directory ckpt is locked by another run"]
    assert [m for m in made_up if matches_source(m)] == []


def test_the_literal_reader_reads_each_kind_of_template():
    source = ('x = f"a {b!r} c {d:.2f}" \\\n    "e {f}"  # a comment with a \'quote\n'
              'y = "rank %d of %(n)s" % (1,)\nz = "{} and {name}".format(1, name=2)\n'
              "w = rf'raw \\n {v}' 'plain\\n'\nv = f\"{'nested'} {x['k']} {{literal}}\"\n")
    texts = [template_text(parts) for parts in _literals(source)]
    assert texts == [f"a {HOLE} c {HOLE}e {HOLE}", f"rank {HOLE} of {HOLE}", f"{HOLE} and {HOLE}",
                     f"raw \\n {HOLE}plain\n", f"{HOLE} {HOLE} {{literal}}"]
