"""Importing the MPI-free modules does not initialise MPI (the simulator and the planner run without it)."""
import subprocess
import sys

import pytest


@pytest.mark.parametrize("module", ["hxmpi", "hxmpi.comm.plan", "hxmpi.comm.costmodel", "hxmpi.sim.simulate",
                                    "hxmpi.comm.plancache", "hxmpi.sim.schedule", "hxmpi.comm", "hxmpi.sim"])
def test_import_leaves_mpi_alone(module):
    code = f"import sys, {module}; print('mpi4py.MPI' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"


def test_package_names_load_on_use():
    code = "import sys, hxmpi; hxmpi.HierComm; print('mpi4py.MPI' in sys.modules, sorted(dir(hxmpi))[:2])"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split()[0] == "True"
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        import hxmpi
        hxmpi.nope
