"""mpi4py's own Alltoall/Alltoallv tests, run against hxmpi through a proxy communicator.

The proxy forwards every call to the real communicator except ``Alltoall`` and ``Alltoallv``, which
go to a ``HierComm`` over it. The tests come from the source distribution of the installed mpi4py,
fetched at test time (nothing of mpi4py is kept in this repository); without network access the test
skips, saying why. Selection: test_cco_buf testAlltoall, test_cco_vec testAlltoallv/2/3 (the
in-place class included), test_msgzero, and the vector classes of test_msgspec.

Two changes to what the tests see, both limits listed in docs/concepts.md (Buffer specs, Limits):
- arrayimpl's fake-GPU backends (buffers exposing only ``__cuda_array_interface__``) are taken out of
  its backend loop: hxmpi refuses accelerator memory, so every loop over backends would fail on them.
  ``test_cai_buffers_refused`` checks the refusal instead, and TestMessageVectorCAIBuf runs as is and
  is counted as an expected failure.

Each configuration (node layout x algorithm) is one pytest test; it passes when every test method
that failed is an expected one, and it prints the pass count. Rank counts: the collective tests are
costly (mpi4py loops over every backend, typecode, root and count: ~9000 calls per configuration
at -n 4), so they run at -n 1, 3 (nodes 2+1 with ranks_per_node 2 and round-robin; 3 single-rank
nodes; one node) and 4 (2+2, 3+1, 2+2 interleaved; single-rank nodes), and skip elsewhere. The
msgspec tests (COMM_SELF only) run at -n 1. A configuration whose every call is the same as an
earlier one's ("hier" on a layout with one node or one rank per node always runs flat; "auto" runs
the cost model's pick per call, which depends on the node count, the widest node and, where hier is
possible, the node map) is skipped, naming the one it repeats: 17 of the 24 run (2 at -n 1, 7 at
-n 3, 8 at -n 4).
"""
from __future__ import annotations

import hashlib
import importlib
import io
import json
import sys
import tarfile
import tempfile
import unittest
import urllib.request
from pathlib import Path

import numpy as np
import pytest
from mpi4py import MPI
from support import assert_exchange_works, layouts
from support import node_of as layout_node_of

from hxmpi import ExchangeTypeError, HierComm

pytestmark = pytest.mark.mpi

COLLECTIVE_RANK_COUNTS = (1, 3, 4)
MSGSPEC_RANK_COUNTS = (1,)
LAYOUTS = ("one_per_node", "regular", "irregular", "round_robin")  # names in support.layouts
ALGORITHMS = ("auto", "hier")
# Collective tests: they depend on the layout and the algorithm, so they run in every configuration.
COLLECTIVE = {
    "test_cco_buf": lambda cls, meth: meth == "testAlltoall",
    "test_cco_vec": lambda cls, meth: meth in ("testAlltoallv", "testAlltoallv2", "testAlltoallv3"),
    "test_msgzero": lambda cls, meth: True,
}
# Message-spec tests: on COMM_SELF only, the same in every configuration, so they run once.
MSGSPEC = {
    "test_msgspec": lambda cls, meth: cls.startswith("TestMessageVector") and not cls.startswith(
        "TestMessageVectorW"),
}
# Test methods that fail by design (see the limits in docs/concepts.md): accelerator-memory buffers are refused.
EXPECTED_FAILURES = {f"test_msgspec.TestMessageVectorCAIBuf.testArray{i}" for i in range(1, 7)}
INDEX = "https://pypi.org/simple/mpi4py/"


def _fetch_tests(dest: Path) -> Path:
    """Download the installed mpi4py's sdist from PyPI (sha256-checked) and unpack its test/ directory."""
    import mpi4py
    name = f"mpi4py-{mpi4py.__version__}.tar.gz"
    req = urllib.request.Request(INDEX, headers={"Accept": "application/vnd.pypi.simple.v1+json"})
    with urllib.request.urlopen(req, timeout=20) as resp:
        files = json.load(resp)["files"]
    entry = next((f for f in files if f["filename"] == name), None)
    if entry is None:
        raise RuntimeError(f"{name} is not on {INDEX}")
    with urllib.request.urlopen(entry["url"], timeout=60) as resp:
        data = resp.read()
    if hashlib.sha256(data).hexdigest() != entry["hashes"]["sha256"]:
        raise RuntimeError(f"{name}: sha256 mismatch")
    top = name[:-len(".tar.gz")]
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        members = [m for m in tar.getmembers() if m.name.startswith(f"{top}/test/")]
        tar.extractall(dest, members=members, filter="data")
    return dest / top / "test"


@pytest.fixture(scope="module")
def mpi4py_tests():
    """mpi4py's test directory, imported once per process; skips on every rank if it cannot be fetched."""
    world = MPI.COMM_WORLD
    if world.size not in set(COLLECTIVE_RANK_COUNTS + MSGSPEC_RANK_COUNTS):
        pytest.skip("mpi4py's tests run at -n " + ", ".join(map(str, COLLECTIVE_RANK_COUNTS)))
    where, reason = None, None
    if world.rank == 0:
        tmp = Path(tempfile.mkdtemp(prefix="hxmpi-mpi4py-"))
        try:
            where = str(_fetch_tests(tmp))
        except Exception as exc:  # offline, PyPI down, version not published: skip, saying why
            reason = f"cannot fetch mpi4py's sdist from PyPI: {exc}"
    where, reason = world.bcast((where, reason))
    if reason:
        pytest.skip(reason)
    sys.path.insert(0, where)
    try:
        modules = {name: importlib.import_module(name) for name in [*COLLECTIVE, *MSGSPEC]}
        arrayimpl = importlib.import_module("arrayimpl")
        yield modules, arrayimpl
    finally:
        sys.path.remove(where)
        world.Barrier()
        if world.rank == 0:
            import shutil
            shutil.rmtree(Path(where).parents[1], ignore_errors=True)


class ProxyComm:
    """A communicator that is the real one, except that Alltoall/Alltoallv go to a HierComm over it."""

    def __init__(self, real: MPI.Intracomm, make_hier):
        self._real, self._make_hier, self._hc = real, make_hier, None

    def __getattr__(self, name):
        return getattr(self._real, name)

    def _hier(self) -> HierComm:
        if self._hc is None:  # collective, and every rank reaches the first call alike
            self._hc = self._make_hier(self._real)
        return self._hc

    def Alltoall(self, sendbuf, recvbuf):
        self._hier().Alltoall(sendbuf, recvbuf)

    def Alltoallv(self, sendbuf, recvbuf):
        self._hier().Alltoallv(sendbuf, recvbuf)

    def Dup(self, *args):
        return ProxyComm(self._real.Dup(*args), self._make_hier)

    def Free(self):
        if self._hc is not None:
            self._hc.free()
        self._real.Free()


class ProxyMPI:
    """The MPI module as the tests see it: COMM_WORLD and COMM_SELF are proxies."""

    def __init__(self, make_hier):
        self.COMM_WORLD = ProxyComm(MPI.COMM_WORLD, make_hier)
        self.COMM_SELF = ProxyComm(MPI.COMM_SELF, make_hier)

    def __getattr__(self, name):
        return getattr(MPI, name)


def _hier_factory(layout: str, algorithm: str):
    return lambda comm: HierComm(comm, algorithm=algorithm, **layouts(comm.size)[layout])


def _behaviour(layout_name: str, algorithm: str, size: int):
    """What every exchange of a configuration runs on COMM_WORLD: ("flat",), ("hier", node_of) or
    ("auto", ...).

    "hier" on a layout with one node or one rank per node always runs flat. "auto" runs the cost
    model's pick per call (``costmodel.auto_pick``), which depends on the node count and the widest
    node, and on the node map where the hierarchical algorithms are possible.
    """
    node_of = layout_node_of(layouts(size)[layout_name], size)
    nodes, widest = max(node_of) + 1, max(node_of.count(n) for n in set(node_of))
    degenerate = nodes == 1 or widest == 1
    if algorithm == "auto":
        return ("auto", nodes, widest) + (() if degenerate else (tuple(node_of),))
    return ("flat",) if degenerate else ("hier", tuple(node_of))


def _first_with_same_behaviour(layout_name: str, algorithm: str, size: int):
    """The earlier configuration (in test order) whose calls are exactly this one's, if any."""
    mine = _behaviour(layout_name, algorithm, size)
    for other_layout in LAYOUTS:
        for other_algorithm in ALGORITHMS:
            if (other_layout, other_algorithm) == (layout_name, algorithm):
                return None
            if _behaviour(other_layout, other_algorithm, size) == mine:
                return f"{other_layout}-{other_algorithm}"
    return None


def _run_selected(modules, selection, proxy) -> dict[str, str]:
    """Run the selected test methods with the proxies in place; outcome per method on this rank."""
    loader, suite, saved = unittest.TestLoader(), unittest.TestSuite(), []
    for mod_name, wanted in selection.items():
        module = modules[mod_name]
        saved.append((module, "MPI", module.MPI))
        module.MPI = proxy
        for cls_name, cls in sorted(vars(module).items()):
            if not (isinstance(cls, type) and issubclass(cls, unittest.TestCase)):
                continue
            comm = cls.__dict__.get("COMM")
            if comm is MPI.COMM_WORLD or comm is MPI.COMM_SELF:
                saved.append((cls, "COMM", comm))
                cls.COMM = proxy.COMM_WORLD if comm is MPI.COMM_WORLD else proxy.COMM_SELF
            for meth in loader.getTestCaseNames(cls):
                if wanted(cls_name, meth):
                    suite.addTest(cls(meth))
    outcome = {test.id(): "passed" for test in suite}  # the suite forgets its tests as it runs
    result = unittest.TestResult()
    try:
        suite.run(result)
    finally:
        for owner, attr, value in reversed(saved):
            setattr(owner, attr, value)
    for test, _ in result.skipped:
        outcome[test.id()] = "skipped"
    for test, trace in result.failures + result.errors:
        outcome[test.id()] = "failed: " + trace.strip().splitlines()[-1]
    return outcome


@pytest.fixture
def without_cai_backends(mpi4py_tests):
    """arrayimpl's backend list without the buffers that expose only __cuda_array_interface__."""
    _, arrayimpl = mpi4py_tests
    backends = arrayimpl.ArrayBackends
    saved = list(backends)
    backends[:] = [b for b in saved if not issubclass(b, arrayimpl.BaseFakeGPUArray)]
    yield
    backends[:] = saved


def _check(selection, modules, layout, algorithm, rank_counts) -> None:
    """Run a selection in one configuration; every failure must be an expected one."""
    if MPI.COMM_WORLD.size not in rank_counts:
        pytest.skip(f"runs at -n {', '.join(map(str, rank_counts))} only (cost)")
    proxy = ProxyMPI(_hier_factory(layout, algorithm))
    local = _run_selected(modules, selection, proxy)
    world = MPI.COMM_WORLD
    every = world.allgather(local)
    # A method passes when it passed on every rank (a skip counts as neither).
    merged = {t: next((o[t] for o in every if o[t].startswith("failed")), every[0][t]) for t in local}
    passed = sum(o == "passed" for o in merged.values())
    ran = sum(o != "skipped" for o in merged.values())
    failed = {t: o for t, o in merged.items() if o.startswith("failed")}
    if world.rank == 0:
        print(f"\nmpi4py {'/'.join(selection)} via HierComm, {layout} {algorithm} -n {world.size}: "
              f"{passed}/{ran} passed, expected failures {sorted(failed)}")
    unexpected = {t: o for t, o in failed.items() if t not in EXPECTED_FAILURES}
    assert not unexpected, unexpected
    assert ran > 0


@pytest.mark.watchdog(600)
@pytest.mark.parametrize("algorithm", ALGORITHMS)
@pytest.mark.parametrize("layout", LAYOUTS)
def test_mpi4py_collective_tests(mpi4py_tests, without_cai_backends, layout, algorithm):
    same = _first_with_same_behaviour(layout, algorithm, MPI.COMM_WORLD.size)
    if same:  # identical calls, identical outcome: run each distinct behaviour once
        pytest.skip(f"makes the same calls as {same}: {_behaviour(layout, algorithm, MPI.COMM_WORLD.size)[0]}")
    _check(COLLECTIVE, mpi4py_tests[0], layout, algorithm, COLLECTIVE_RANK_COUNTS)


def test_mpi4py_msgspec_vector_tests(mpi4py_tests, without_cai_backends):
    _check(MSGSPEC, mpi4py_tests[0], "regular", "hier", MSGSPEC_RANK_COUNTS)


def test_cai_buffers_refused(mpi4py_tests):
    """The buffers taken out of the backend loop get the documented refusal, on every rank."""
    _, arrayimpl = mpi4py_tests
    fake = arrayimpl.FakeGPUArrayBasic(1, "i", MPI.COMM_WORLD.size)
    world = MPI.COMM_WORLD
    hc = HierComm(world, ranks_per_node=2)
    with pytest.raises(ExchangeTypeError, match="__cuda_array_interface__.*host memory only"):
        hc.Alltoall(fake, np.zeros(world.size, np.int32))
    assert_exchange_works(world, hc)  # refused before anything moved
    hc.free()
