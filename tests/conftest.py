"""Test harness: MPI tests keep every rank in step, and a hang ends the run with tracebacks.

- After each MPI test, the ranks agree on the outcome: a test that failed on one rank fails on all,
  naming the rank, so its traceback (printed by that rank) is never hidden behind a pass.
- A per-test watchdog (faulthandler) dumps every thread's stack and exits when a test hangs, which
  makes mpirun end the job instead of waiting for CI's time limit.
- Ranks other than 0 print only failures, so the output stays readable.
"""
from __future__ import annotations

import faulthandler
import os

import pytest

DEFAULT_WATCHDOG_S = float(os.environ.get("HXMPI_TEST_WATCHDOG", "240"))


def _world():
    from mpi4py import MPI
    return MPI.COMM_WORLD


def _under_mpi(config) -> bool:
    return bool(config.getoption("--with-mpi", default=False))


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config):
    if _under_mpi(config) and _world().rank != 0:
        config.option.verbose = -2
        xml = getattr(config.option, "xmlpath", None)
        if xml:  # one report per rank, so rank 0's is the one a runner reads
            config.option.xmlpath = f"{xml}.rank{_world().rank}"


_cluster_lock = None  # the machine's cluster-test lock while a module marked emulated_cluster runs


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    global _cluster_lock
    if item.get_closest_marker("emulated_cluster") and _cluster_lock is None:
        # Before the watchdog is armed: waiting for another suite's cluster tests is not a hang.
        from support import lock_clusters
        _cluster_lock = lock_clusters()
    marker = item.get_closest_marker("watchdog")
    seconds = float(marker.args[0]) if marker else DEFAULT_WATCHDOG_S
    faulthandler.dump_traceback_later(seconds, exit=True)
    try:
        yield
    finally:
        faulthandler.cancel_dump_traceback_later()
        # Released after the module's last test, whose teardown took its hosts down.
        if _cluster_lock is not None and (nextitem is None or nextitem.module is not item.module):
            _cluster_lock.close()
            _cluster_lock = None


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if call.when != "call" or not _under_mpi(item.config) or item.get_closest_marker("mpi") is None:
        return
    comm = _world()
    if comm.size == 1:
        return
    failed_ranks = [r for r, f in enumerate(comm.allgather(report.failed)) if f]
    if failed_ranks and not report.failed:
        report.outcome = "failed"
        report.longrepr = f"failed on rank(s) {failed_ranks}; see their tracebacks above"


@pytest.fixture
def comm():
    """A duplicate of COMM_WORLD, freed after the test."""
    c = _world().Dup()
    yield c
    c.Free()


@pytest.fixture
def shared_tmp(comm):
    """A scratch directory made by rank 0, the same path on every rank, removed after the test."""
    import shutil
    import tempfile
    from pathlib import Path
    path = comm.bcast(tempfile.mkdtemp(prefix="hxmpi-test-") if comm.rank == 0 else None)
    yield Path(path)
    comm.Barrier()
    if comm.rank == 0:
        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def large_count_path(monkeypatch):
    """Lower the C-int limit and the chunk size, so that small buffers take the Alltoallw path."""
    import hxmpi.comm.transfer as transfer
    monkeypatch.setattr(transfer, "INT_LIMIT", 40)
    monkeypatch.setattr(transfer, "CHUNK_BYTES", 16)


@pytest.fixture(scope="module")
def shop(tmp_path_factory):
    """A store of 8 train shards (~20 KB each) behind a real HTTP server: (root, shards, server)."""
    from support import serve_shards
    yield from serve_shards(tmp_path_factory)
