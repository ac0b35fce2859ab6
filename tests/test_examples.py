"""The scripts of examples/ (the tutorial's and the how-to guides'), each run as a user runs it,
``mpirun -np N python -m mpi4py examples/NAME.py``, at 1 to 4 ranks, and checked by what it
prints: every script asserts its own result against the expected values and prints an ``ok``
line only when all its checks held on every rank it reports for."""
import sys
from pathlib import Path

import pytest
from mpilaunch import mpirun_command, run_job

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"
SIZES = (1, 2, 3, 4)

#: What each script prints (rank 0) when it worked; a list means any one of them (the mpi4py-fft
#: example skips, saying so, where mpi4py-fft is not installed).
EXPECTED = {
    "first_alltoallv": ["alltoallv ok"],
    "mpi4py_dropin": ["dropin ok"],
    "persistent_loop": ["persistent ok"],
    "nonblocking_overlap": ["nonblocking ok"],
    "pencil_transpose": ["pencil transpose ok"],
    "mpi4py_fft_pfft": ["pfft ok", "mpi4py-fft is not installed: skipped"],
    "moe_dispatch": ["moe dispatch ok"],
    "train_own_data": ["train own data ok"],
    "project_layout": ["projection ok"],
}


def test_every_example_is_tested_and_shown_in_the_docs():
    """Each script of examples/ has an expected line here and is included by a docs page."""
    scripts = {p.stem for p in EXAMPLES.glob("*.py")}
    assert scripts == set(EXPECTED) and len(scripts) >= 6
    pages = "".join(p.read_text() for p in (ROOT / "docs").rglob("*.md"))
    assert [s for s in sorted(scripts) if f"examples/{s}.py" not in pages] == []


@pytest.mark.skipif(not mpirun_command(), reason="no mpirun")
@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_example_runs_and_prints_its_result(name, n, tmp_path):
    args = [str(tmp_path)] if name == "train_own_data" else []
    proc = run_job(mpirun_command() + ["-n", str(n), sys.executable, "-m", "mpi4py", str(EXAMPLES / f"{name}.py"),
                                       *args], timeout=300, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    assert any(line in lines for line in EXPECTED[name]), proc.stdout
    assert proc.stderr == "", proc.stderr  # a normal run prints no warnings or errors


@pytest.mark.skipif(not mpirun_command(), reason="no mpirun")
def test_first_example_reports_its_path_and_the_cache():
    """The tutorial's reading of ``last_stats``: on 2 virtual nodes of 2 ranks (the argument 2) the
    first call is a plan-cache miss that crosses nodes, the second a hit; without the argument the
    script uses the real nodes: one, on this host."""
    proc = run_job(mpirun_command() + ["-n", "4", sys.executable, "-m", "mpi4py",
                                       str(EXAMPLES / "first_alltoallv.py"), "2"], timeout=300)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert "nodes (2, 2)" in lines and "second call plan_cache hit" in lines, proc.stdout
    assert any(line.startswith("algorithm ") and "plan_cache miss" in line for line in lines), proc.stdout
    proc = run_job(mpirun_command() + ["-n", "4", sys.executable, "-m", "mpi4py",
                                       str(EXAMPLES / "first_alltoallv.py")], timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "nodes (4,)" in proc.stdout.splitlines() and "alltoallv ok" in proc.stdout, proc.stdout
