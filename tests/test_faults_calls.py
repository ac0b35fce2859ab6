"""Fault matrix, client calls: an error that one rank alone meets inside a blocking or nonblocking
all-to-all ends the whole job with a message naming the rank and the cause, instead of leaving the
other ranks waiting forever; requests still in flight at exit are completed and reported before
MPI_Finalize. Each case is a real job at 2 and 4 ranks, run under plain ``python`` (no
``-m mpi4py``: hxmpi itself must end the job)."""
import sys
import time

import pytest
from mpilaunch import mpirun_command, run_job

MPIRUN = mpirun_command()
needs_mpirun = pytest.mark.skipif(not MPIRUN, reason="no mpirun on this machine")

# The job: every rank makes a few good calls, then the last rank meets ``FAULT`` inside the call
# ``CALL`` (a fault injected into hxmpi's own code on that rank alone); the others are then inside
# the same call, waiting for it.
JOB = """
import sys
import numpy as np
import hxmpi
from mpi4py import MPI
from hxmpi.comm import exchange, nonblocking, runs

comm = MPI.COMM_WORLD
call, progress = sys.argv[1], sys.argv[2]
hc = hxmpi.HierComm(comm, ranks_per_node=2, progress=progress)
counts = np.arange(comm.size) % 3 + 1
send = np.arange(counts.sum(), dtype=np.float64)
recv = np.empty(comm.size * (comm.rank % 3 + 1))
rcounts = np.full(comm.size, comm.rank % 3 + 1)

def boom(*args, **kwargs):
    raise RuntimeError("injected fault: scratch page lost")

if call == "persistent":
    preq = hc.Alltoallv_init([send, counts], [recv, rcounts], algorithm="hier")
for k in range(3):
    if k == 2 and comm.rank == comm.size - 1:
        if call == "blocking":
            hc._engine.calls = type("Broken", (), {"call": boom})()  # the call path: the others wait in the agreement
        elif call == "request":
            # while the data moves (start, Test, Wait), and where a repeated call runs as one
            # compiled program (the others then wait in its agreement)
            runs.Run.begin = runs.Run.test = runs.Run.finish = nonblocking.Requests._begin_compiled = boom
        elif call == "persistent":
            preq._run.program().free()                  # its compiled run lost, in Start
        else:
            exchange.HierComm.Alltoallv = boom          # on the progress thread
    if call == "blocking":
        hc.Alltoallv([send, counts], [recv, rcounts], algorithm="hier")
    elif call == "persistent":
        preq.Start()
        preq.Wait()
    else:
        req = hc.Ialltoallv([send, counts], [recv, rcounts], algorithm="hier")
        while not req.Test():
            pass
print(f"rank {comm.rank} finished", flush=True)
"""


@needs_mpirun
@pytest.mark.watchdog(240)
@pytest.mark.parametrize("n", [2, 4])
@pytest.mark.parametrize("call, progress", [("blocking", "request"), ("request", "request"), ("thread", "thread"),
                                            ("persistent", "request")])
def test_an_error_on_one_rank_ends_the_job_naming_it(tmp_path, n, call, progress):
    script = tmp_path / "job.py"
    script.write_text(JOB)
    t0 = time.monotonic()
    proc = run_job(MPIRUN + ["-n", str(n), sys.executable, str(script), call, progress], timeout=120)
    assert proc.returncode != 0, proc.stdout + proc.stderr
    fault = ("RuntimeError: this compiled run was freed\n  in ExchangeRequest.Start" if call == "persistent"
             else "RuntimeError: injected fault: scratch page lost")
    assert f"hxmpi: rank {n - 1}: {fault}" in proc.stderr, proc.stderr
    assert "the job is aborted (MPI_Abort)" in proc.stderr
    assert "finished" not in proc.stdout  # no rank got past the call
    assert time.monotonic() - t0 < 100


EXIT_IN_FLIGHT = """
import sys
import numpy as np
import hxmpi
from mpi4py import MPI

comm = MPI.COMM_WORLD
hc = hxmpi.HierComm(comm, ranks_per_node=2, progress=sys.argv[1])
# 8 MiB blocks: too large to finish inside the call (the transfer needs both ranks' progress), so
# a request is still in flight at exit; 8 KB blocks sometimes finished at the call on every rank.
send = np.arange(comm.size * (1 << 20), dtype=np.float64) + comm.rank
recv = np.empty_like(send)
requests = [hc.Ialltoall(send, recv)]
print(f"rank {comm.rank} leaves", flush=True)
# no Wait: the interpreter exits with the request in flight
"""


@needs_mpirun
@pytest.mark.watchdog(240)
@pytest.mark.parametrize("n", [2, 4])
@pytest.mark.parametrize("progress", ["request", "thread"])
def test_requests_in_flight_at_exit_are_completed_and_reported(tmp_path, n, progress):
    script = tmp_path / "job.py"
    script.write_text(EXIT_IN_FLIGHT)
    proc = run_job(MPIRUN + ["-n", str(n), sys.executable, str(script), progress], timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.count("leaves") == n
    if progress == "request":  # a thread completes its queue on its own: nothing is left to report
        reported = proc.stderr.count("nonblocking all-to-all(s) were still in flight at exit; completed them")
        assert reported >= 1, proc.stderr  # a rank whose request completed at its call has none left


SINGLE = """
import mpi4py
mpi4py.rc.thread_level = "single"
import numpy as np
import hxmpi
from mpi4py import MPI

comm = MPI.COMM_WORLD
assert MPI.Query_thread() == MPI.THREAD_SINGLE
hc = hxmpi.HierComm(comm, ranks_per_node=2)
send = np.arange(comm.size * 5, dtype=np.int64) + 100 * comm.rank
recv, ref = np.empty_like(send), np.empty_like(send)
comm.Alltoall(send, ref)
hc.Ialltoall(send, recv).Wait()
assert recv.tobytes() == ref.tobytes()
threaded = hxmpi.HierComm(comm, ranks_per_node=2, progress="thread")
try:
    threaded.Ialltoall(send, recv)
except hxmpi.HxmpiError as exc:
    print(f"rank {comm.rank} refused: {exc}", flush=True)
print(f"rank {comm.rank} ok", flush=True)
"""


@needs_mpirun
@pytest.mark.watchdog(240)
@pytest.mark.parametrize("n", [2, 3])
def test_request_mode_needs_no_thread_level(tmp_path, n):
    """At MPI_THREAD_SINGLE a request-driven Ialltoall is exact; progress='thread' is refused on
    every rank with a message naming the level and the way out."""
    script = tmp_path / "job.py"
    script.write_text(SINGLE)
    proc = run_job(MPIRUN + ["-n", str(n), sys.executable, str(script)], timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.count(" ok") == n
    assert proc.stdout.count("needs MPI_THREAD_MULTIPLE") == n
    assert "use progress='request'" in proc.stdout


CREATE_GROUP = """
import numpy as np
import hxmpi
from mpi4py import MPI

comm = MPI.COMM_WORLD
hc = hxmpi.HierComm(comm, ranks_per_node=2)
whole = comm.Get_group()
# The last rank alone passes a bad tag: the others would wait for it in MPI_Comm_create_group.
sub = hc.Create_group(whole, tag=-1 if comm.rank == comm.size - 1 else 5)
print(f"rank {comm.rank} finished", flush=True)
"""


@needs_mpirun
@pytest.mark.watchdog(240)
@pytest.mark.parametrize("n", [2, 4])
def test_a_bad_create_group_on_one_rank_ends_the_job(tmp_path, n):
    """Create_group is collective over its group alone, so one rank's bad argument cannot be agreed:
    under mpi4py's default error handling it ends the job, naming the rank, instead of a hang."""
    script = tmp_path / "job.py"
    script.write_text(CREATE_GROUP)
    proc = run_job(MPIRUN + ["-n", str(n), sys.executable, str(script)], timeout=120)
    assert proc.returncode != 0, proc.stdout + proc.stderr
    assert f"hxmpi: rank {n - 1}: TopologyError: tag must be an integer from 0 to MPI.TAG_UB" in proc.stderr, \
        proc.stderr
    assert "in HierComm.Create_group, on this rank alone" in proc.stderr
    assert "finished" not in proc.stdout
