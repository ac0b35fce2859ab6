"""hxmpi.provenance: the record every result file carries, and what makes a tree dirty."""
import re
import subprocess
from pathlib import Path

from hxmpi import __version__
from hxmpi.provenance import PROVENANCE_KEYS, RESULTS_DIR, mpi_library, provenance, source_commit


def test_the_record_has_every_key_in_order():
    rec = provenance("python benchmarks/x.py --json out.json", mpi="SimGrid version 3.32")
    assert list(rec) == list(PROVENANCE_KEYS)
    assert rec["command"] == "python benchmarks/x.py --json out.json" and rec["mpi"] == "SimGrid version 3.32"
    assert rec["version"] == __version__ and rec["cores"] >= 1
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", rec["date"])
    assert rec["commit"] == "unknown" or re.fullmatch(r"[0-9a-f]{40}", rec["commit"])


def git(root: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True, check=True).stdout


def test_a_tree_is_dirty_by_its_code_not_by_its_results(tmp_path):
    """A rerun rewrites its own committed result file: that leaves the tree clean; a change to
    code does not. Outside a git tree the commit is unknown."""
    assert source_commit(tmp_path) == ("unknown", False)
    git(tmp_path, "init", "-q")
    (tmp_path / "code.py").write_text("x = 1\n")
    (tmp_path / RESULTS_DIR).mkdir(parents=True)
    (tmp_path / RESULTS_DIR / "r.json").write_text("{}\n")
    git(tmp_path, "add", ".")
    git(tmp_path, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "one")
    head = git(tmp_path, "rev-parse", "HEAD").strip()
    assert source_commit(tmp_path) == (head, False)
    (tmp_path / RESULTS_DIR / "r.json").write_text('{"rerun": true}\n')
    assert source_commit(tmp_path) == (head, False)
    (tmp_path / "code.py").write_text("x = 2\n")
    assert source_commit(tmp_path) == (head, True)


def test_mpi_is_what_the_caller_names():
    """A simulator names SimGrid; without a name, the running library's first line (or "none"
    where this process has not started MPI)."""
    assert provenance("c", mpi="MPICH Version: 5.0.2")["mpi"] == "MPICH Version: 5.0.2"
    assert provenance("c")["mpi"] == mpi_library()


def test_a_wrapped_launch_is_recorded_as_typed(monkeypatch):
    """A job the emulated cluster's ``run`` started records that command, not the mpirun under it."""
    from hxmpi.cli import command_line
    from hxmpi.launcher import LAUNCH_ENV
    monkeypatch.setattr("sys.argv", ["x.py", "--json", "out.json"])
    monkeypatch.delenv(LAUNCH_ENV, raising=False)
    assert command_line("benchmarks/x.py", 5) == "mpirun -np 5 python benchmarks/x.py --json out.json"
    monkeypatch.setenv(LAUNCH_ENV, "python -m hxmpi.sim.cluster run -n 5 --")
    assert command_line("benchmarks/x.py", 5) == "python -m hxmpi.sim.cluster run -n 5 -- python benchmarks/x.py --json out.json"
    assert command_line("benchmarks/x.py") == "python benchmarks/x.py --json out.json"  # not an MPI job
