"""The API reference's examples run, and give what they show.

The API page renders the public docstrings (``docs/reference/api.md``), each with an ``Examples``
section of doctest lines (``>>>``), which need MPI, so Sphinx cannot run them. Here every
``Examples`` section of the public docstrings (``support.API_SOURCES``, read from the source
files, so this process starts no MPI) is assembled, per class, into one script:

1. the shared prelude: the API page's "The examples' set-up" block, as the page shows it to the
   reader (a ``HierComm`` over ``COMM_WORLD`` on virtual nodes of 2 ranks, ``size`` and ``rank``,
   and Alltoallv buffers ``sbuf``/``scounts``, ``rbuf``/``rcounts`` with their ``expected``
   result; ``np``, ``hxmpi``, ``MPI`` and ``PlanStateError`` imported);
2. then each docstring's examples in source order, run by ``doctest`` on every rank, each
   docstring in a fresh copy of the prelude's namespace: an example uses what the prelude and
   its own lines define, never what another example defined (it must read alone on the page),
   and leaves the prelude's buffers as it found them.

The script runs under mpirun at 2 and 3 ranks; it exits 0 only when every example gave its shown
output on every rank, and prints how many examples it ran, which must be all of them.
"""
import ast
import doctest
import re
import sys
from pathlib import Path

import pytest
from mpilaunch import mpirun_command, run_job
from support import API_SOURCES, api_docstrings

ROOT = Path(__file__).resolve().parent.parent
API_PAGE = ROOT / "docs" / "reference" / "api.md"
SIZES = (2, 3)
#: What the prelude defines for the examples (this file's docstring says what each is).
PRELUDE_NAMES = ("np", "hxmpi", "MPI", "PlanStateError", "hc", "size", "rank", "scounts", "sbuf", "rcounts", "rbuf",
                 "expected")

#: What runs the examples of one class after the prelude (``EXAMPLES``: (name, examples) pairs).
HARNESS = '''
import doctest as _doctest
import sys as _sys

_rank = MPI.COMM_WORLD.Get_rank()
_runner = _doctest.DocTestRunner(optionflags=_doctest.NORMALIZE_WHITESPACE)
_parser = _doctest.DocTestParser()
_prelude = dict(globals())
_write = _sys.stdout.write  # doctest replaces sys.stdout while an example runs
for _name, _text in EXAMPLES:
    # DocTest copies the namespace it is given: every docstring starts from the prelude's
    _runner.run(_parser.get_doctest(_text, _prelude, _name, _name, 0),
                out=lambda report: _write(f"rank {_rank}: {report}"), clear_globs=False)
_failed = MPI.COMM_WORLD.allreduce(_runner.failures)
if _rank == 0:
    print(f"{_runner.tries} examples, {_failed} failed", flush=True)
hc.free()
_sys.exit(1 if _failed else 0)
'''


def prelude() -> str:
    """The set-up block of the API page: the first python block of its "The examples' set-up"."""
    page = API_PAGE.read_text()
    section = page[page.index("## The examples' set-up"):]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


def examples_section(doc: str) -> str:
    """A numpy docstring's ``Examples`` section (its text up to the next section), or ''."""
    m = re.search(r"^Examples\n-{8}\n(.*?)(?=^\w[\w ]*\n-{3,}\n|\Z)", doc, re.S | re.M)
    return m.group(1) if m else ""


def script(group: str) -> tuple[str, int]:
    """(the script of ``group``'s examples, how many examples it holds)."""
    examples = [(name, examples_section(doc)) for name, doc in api_docstrings()[group].items()]
    count = sum(len(doctest.DocTestParser().get_examples(text)) for _, text in examples)
    return f"{prelude()}\nEXAMPLES = {examples!r}\n{HARNESS}", count


def test_every_public_docstring_has_examples():
    """Every docstring of every group has an Examples section of at least one doctest line, so the
    runs below leave none out; the prelude is on the page and defines what the examples use."""
    groups = api_docstrings()
    assert set(groups) == set(API_SOURCES) and sum(len(g) for g in groups.values()) >= 50
    empty = [name for g in groups.values() for name, doc in g.items()
             if not doctest.DocTestParser().get_examples(examples_section(doc))]
    assert empty == []
    tree = ast.parse(prelude())
    defined = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
    defined |= {(a.asname or a.name) for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom))
                for a in n.names}
    assert set(PRELUDE_NAMES) <= defined, set(PRELUDE_NAMES) - defined


def test_the_section_reader_takes_the_examples_alone():
    doc = "Summary.\n\nExamples\n--------\n>>> 1 + 1\n2\n\nNotes\n-----\n>>> not an example\n"
    assert examples_section(doc) == ">>> 1 + 1\n2\n\n"
    assert examples_section("Summary.\n\nRaises\n------\nValueError\n") == ""


@pytest.mark.skipif(not mpirun_command(), reason="no mpirun")
@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("group", sorted(API_SOURCES))
def test_the_examples_of_each_class_run(group, n, tmp_path):
    text, count = script(group)
    path = tmp_path / f"examples_{group}.py"
    path.write_text(text)
    proc = run_job(mpirun_command() + ["-n", str(n), sys.executable, "-m", "mpi4py", str(path)], timeout=300, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"{count} examples, 0 failed" in proc.stdout.splitlines(), proc.stdout
    assert proc.stderr == "", proc.stderr  # no warning, and no request left in flight at exit
