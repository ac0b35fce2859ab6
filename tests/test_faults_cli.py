"""Fault matrix, programs (issue 13 item 10): an uncaught exception on one rank of any hxmpi program
ends the whole MPI job with that rank's message, instead of leaving the others blocked."""
import ast
import sys
import time
from pathlib import Path

import pytest

from mpilaunch import mpirun_command, run_job

MPIRUN = mpirun_command()
needs_mpirun = pytest.mark.skipif(not MPIRUN, reason="no mpirun on this machine")
ROOT = Path(__file__).resolve().parent.parent

ONE_RANK_FAILS = """
from mpi4py import MPI
def main():
    comm = MPI.COMM_WORLD
    if comm.rank == comm.size - 1:
        raise RuntimeError("disk on fire")
    comm.Barrier()  # the others wait here for the failed rank
    return 0
if __name__ == "__main__":
    from hxmpi.cli import run_main
    run_main(main, "demo")
"""


@needs_mpirun
@pytest.mark.watchdog(120)
@pytest.mark.parametrize("n", [2, 3])
def test_uncaught_exception_on_one_rank_aborts_the_job(tmp_path, n):
    script = tmp_path / "demo.py"
    script.write_text(ONE_RANK_FAILS)
    t0 = time.monotonic()
    proc = run_job(MPIRUN + ["-n", str(n), sys.executable, str(script)], timeout=90)
    assert proc.returncode != 0
    assert f"demo: rank {n - 1} failed: RuntimeError: disk on fire" in proc.stderr, proc.stderr
    assert time.monotonic() - t0 < 60


def _main_blocks():
    """(file, source of its ``if __name__ == "__main__":`` block) for every program hxmpi ships."""
    files = [ROOT / "hxmpi" / "__main__.py", ROOT / "hxmpi" / "data" / "__main__.py", ROOT / "hxmpi" / "cluster.py",
             ROOT / "hxmpi" / "train.py",
             # plot.py runs without MPI: importing hxmpi there would initialise MPI for nothing
             *sorted(f for f in (ROOT / "benchmarks").glob("*.py") if f.name != "plot.py")]
    for f in files:
        tree = ast.parse(f.read_text())
        for node in tree.body:
            if isinstance(node, ast.If) and "__main__" in ast.unparse(node.test):
                yield f, ast.unparse(node)


@pytest.mark.parametrize("path,block", list(_main_blocks()), ids=[f.name for f, _ in _main_blocks()])
def test_every_program_ends_through_run_main(path, block):
    assert "run_main(" in block, f"{path}: its __main__ block must call hxmpi.cli.run_main"


SETUP_FAILS_ON_ONE_RANK = """
import sys
from mpi4py import MPI
from hxmpi.cli import abort_job, report, settle_failure
comm = MPI.COMM_WORLD
errcomm = comm.Dup()
try:
    if comm.rank == comm.size - 1 or sys.argv[1] == "all":
        raise OSError("set-up failed here")
    comm.Barrier()  # the healthy ranks go on into the next collective
except OSError as exc:
    if settle_failure(errcomm):
        if comm.rank == 0:
            print("agreed:", exc, file=sys.stderr)
        sys.exit(2)
    report("demo", exc, with_traceback=False)
    abort_job(2)
"""


@needs_mpirun
@pytest.mark.watchdog(120)
@pytest.mark.parametrize("who", ["one", "all"])
def test_set_up_error_is_agreed_or_aborts(tmp_path, who):
    """The rule of hxmpi.cli: an error every rank meets exits cleanly (one line); one that only
    some rank meets aborts the job after settle_failure's timeout, never leaving the rest blocked."""
    script = tmp_path / "setup.py"
    script.write_text(SETUP_FAILS_ON_ONE_RANK)
    t0 = time.monotonic()
    proc = run_job(MPIRUN + ["-n", "3", sys.executable, str(script), who], timeout=90)
    assert proc.returncode == 2, proc.stderr
    if who == "all":
        assert proc.stderr.count("agreed: set-up failed here") == 1 and "MPI_ABORT" not in proc.stderr, proc.stderr
    else:
        assert "demo: rank 2 failed: OSError: set-up failed here" in proc.stderr and "MPI_ABORT" in proc.stderr, \
            proc.stderr
    assert time.monotonic() - t0 < 60
