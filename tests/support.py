"""Helpers shared by the test files: test files import from here, never from each other.

- ``layouts``: the one catalogue of node layouts (``Topology`` / ``HierComm`` keyword arguments by
  name) that every MPI test draws from; ``node_of`` gives a layout's node id per rank.
- Exchange cases with their flat reference (``exchange_case``), message-spec objects (``DLPackOnly``),
  the catalogue of MPI datatypes the Alltoallw tests move (``datatype_catalogue``).
- A real HTTP store with injected faults (``FaultServer``, ``serve_store``, ``serve_shards``,
  ``injected``, ``rewrite_shard``), scratch cache directories (``fresh_dir``).
- Whether SimGrid can replay here (``simgrid_missing``).
- Jobs: processes of an mpirun session (``session``, ``kill_session``), run logs (``epochs_logged``),
  the emulated cluster (``cluster_unavailable``, ``cluster_up``).
"""
from __future__ import annotations

import fcntl
import importlib.util
import json
import os
import shutil
import signal
import tempfile
import threading
import time
from contextlib import contextmanager
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import numpy as np

from hxmpi.data.store import make_synthetic, split_train_test, write_store

_SCRATCH = []  # cache directories made by fresh_dir, removed with the store that serve_store made


def layouts(size: int) -> dict:
    """Every node layout the MPI tests use, by name, for a world of ``size`` ranks."""
    return {
        "real": {},  # the nodes Topology finds by itself (one on one host; real hosts on a cluster)
        "regular": {"ranks_per_node": 2},
        "irregular": {"ranks_per_node": 3},  # the last node may be smaller
        "round_robin": {"node_of": [r % 2 for r in range(size)]},
        "irregular_3_3_1": {"node_of": [min(r // 3, 2) for r in range(size)]},
        "round_robin_3": {"node_of": [(r * 7) % 3 for r in range(size)]},
        "one_per_node": {"node_of": list(range(size))},
        "one_node": {"node_of": [7] * size},
        "sparse_ids": {"node_of": [100 * (r % 3) for r in range(size)]},
        "shuffled": {"node_of": [(2, 0, 0, 1, 0, 2, 0)[r % 7] for r in range(size)]},  # 4+1+2 at 7 ranks
    }


LAYOUT_NAMES = tuple(layouts(1))
VIRTUAL_LAYOUTS = tuple(name for name in LAYOUT_NAMES if name != "real")  # node ids known without MPI


def hier_comms(names=LAYOUT_NAMES, **options):
    """Yield a HierComm over COMM_WORLD per layout in ``names`` (``options`` passed to each), then
    free them: the body of a module fixture."""
    from mpi4py import MPI

    from hxmpi import HierComm
    world = MPI.COMM_WORLD
    made = {name: HierComm(world, **layouts(world.size)[name], **options) for name in names}
    yield made
    for hc in made.values():
        hc.free()


def node_of(layout: dict, size: int) -> list:
    """The node id of every rank under a virtual ``layout`` (not "real")."""
    if "node_of" in layout:
        return list(layout["node_of"])
    return [r // layout["ranks_per_node"] for r in range(size)]


class FaultServer:
    """A real HTTP server for a store directory; ``faults[name]`` lists what the next requests get:
    "500", "slow", "truncate", "corrupt", "die" (a chunked body cut off mid-chunk: the client sees
    http.client.IncompleteRead), or "as:OTHER" (OTHER's bytes)."""

    def __init__(self, directory: Path):
        self.faults: dict[str, list] = {}
        self.requests: dict[str, int] = {}
        server = self

        class Handler(SimpleHTTPRequestHandler):
            def __init__(self, *a, **kw):
                super().__init__(*a, directory=str(directory), **kw)

            def log_message(self, *args):
                pass

            def do_GET(self):
                name = self.path.lstrip("/")
                server.requests[name] = server.requests.get(name, 0) + 1
                plan = server.faults.get(name)
                fault = plan.pop(0) if plan else "ok"
                if fault == "500":
                    self.send_error(500, "injected")
                    return
                if fault.startswith("as:"):  # serve another file under this name (a store that changes)
                    name, fault = fault[3:], "ok"
                body = (directory / name).read_bytes() if (directory / name).exists() else None
                if body is None:
                    self.send_error(404)
                    return
                if fault == "slow":
                    time.sleep(1.5)
                if fault == "die":  # the server dies mid-body: half of a chunk, then the connection goes
                    self.protocol_version = "HTTP/1.1"
                    self.send_response(200)
                    self.send_header("Transfer-Encoding", "chunked")
                    self.end_headers()
                    self.wfile.write(f"{len(body):x}\r\n".encode() + body[: len(body) // 2])
                    self.close_connection = True
                    return
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                if fault == "truncate":
                    self.wfile.write(body[: len(body) // 2])
                    self.close_connection = True
                elif fault == "corrupt":
                    self.wfile.write(bytes([body[0] ^ 0xFF]) + body[1:])
                else:
                    self.wfile.write(body)

        # Loopback by default; the emulated-cluster tier passes host 0's address so other hosts reach it.
        host = os.environ.get("HXMPI_TEST_HTTP_HOST", "127.0.0.1")
        self.httpd = ThreadingHTTPServer((host, 0), Handler)
        self.url = f"http://{host}:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


class DLPackOnly:
    """Exposes a numpy array through DLPack only (no buffer protocol), as a tensor library would."""

    def __init__(self, arr, v0=False):
        self.arr, self.v0 = arr, v0

    def __dlpack_device__(self):
        return self.arr.__dlpack_device__()

    def __dlpack__(self, **kwargs):
        if self.v0 and kwargs:
            raise TypeError("DLPack 0.x: no keywords")
        return self.arr.__dlpack__(**kwargs)


def random_data(dtype, n, rng):
    """``n`` elements of ``dtype`` with random bytes."""
    raw = rng.integers(0, 256, n * np.dtype(dtype).itemsize, dtype=np.uint8)
    return raw.view(dtype)


def exchange_case(comm, rng, dtype, row=1, zero_frac=0.3, max_count=6):
    """Random counts (zeros included), rank-dependent data, and the flat reference result."""
    size = comm.size
    sc = rng.integers(0, max_count, size).astype(np.int64) * row
    sc[rng.random(size) < zero_frac] = 0
    rc = np.empty(size, np.int64)
    comm.Alltoall(sc, rc)
    sbuf = random_data(dtype, int(sc.sum()), rng)
    ref = np.zeros(int(rc.sum()), dtype)
    comm.Alltoallv([sbuf, sc, mpi_type(dtype)], [ref, rc, mpi_type(dtype)])
    return sc, rc, sbuf, ref


def auto_expected(comm, hc, send_bytes, uniform=False, mode="oneshot") -> tuple:
    """(algorithm, radix) ``hc``'s "auto" should run for this call: ``costmodel.auto_pick`` on the
    pattern of the whole send-bytes matrix (every rank's row gathered), computed here with numpy."""
    from hxmpi.comm.costmodel import Pattern, auto_pick
    matrix = np.array(comm.allgather(np.asarray(send_bytes, np.int64)))
    pattern = Pattern.from_counts(matrix, whole_kib=True)
    pattern = Pattern(pattern.size, pattern.total_bytes, pattern.messages, pattern.sumsq_recv_kib, uniform,
                      pattern.pairwise_bytes)
    t = hc.topology
    return auto_pick(hc.cost_model, mode, t.num_nodes, t.max_node_size, pattern, hc.node_phase,
                     hc.layout.hier_possible, hc.cpu_times, hc.layout.node_sizes)


def ran(hc) -> tuple:
    """(algorithm, radix) of ``hc``'s last call (radix 2 where the algorithm has none, as ``auto_pick``;
    multi-leader's leaders per node, or the pipelined node phase's chunks, where ``auto_pick`` gives
    its radix)."""
    stats = hc.last_stats
    return stats["algorithm"], stats.get("radix", stats.get("leaders", stats.get("chunks", 2)))


def assert_exchange_works(comm, hc, algorithm="hier"):
    """A random Alltoallv through ``hc`` equals the flat one on ``comm``: after a refused call,
    nothing was left half-done (a stray message or collective would mix into this one or hang)."""
    rng = np.random.default_rng(4242 + comm.rank)
    sc, rc, sbuf, ref = exchange_case(comm, rng, np.float64)
    out = np.full_like(ref, np.nan)
    hc.Alltoallv([sbuf, sc], [out, rc], algorithm=algorithm)
    assert out.tobytes() == ref.tobytes()


def mpi_type(dtype):
    """The MPI datatype of numpy ``dtype`` (a committed byte block for structured dtypes)."""
    from mpi4py import MPI
    return MPI.BYTE.Create_contiguous(np.dtype(dtype).itemsize).Commit() \
        if np.dtype(dtype).kind == "V" else MPI.Datatype.fromcode(np.dtype(dtype).char)


def datatype_catalogue() -> dict:
    """Committed MPI datatypes by name, every kind an Alltoallw client passes: basic, pair types,
    each constructor, resized (negative lower bound, padded extent), type maps out of memory order,
    nested, empty, and a DARRAY; a few items of each never overlap (they may be received). The
    caller frees them (``free_types``)."""
    from mpi4py import MPI
    D, I = MPI.DOUBLE, MPI.INT
    inner = D.Create_vector(2, 1, 3)
    made = {
        "double": D, "int8": MPI.INT8_T, "double_int": MPI.DOUBLE_INT, "short_int": MPI.SHORT_INT,
        "contiguous": D.Create_contiguous(3),
        "vector": D.Create_vector(3, 2, 5),
        "hvector": I.Create_hvector(4, 1, 12),
        "indexed_out_of_order": D.Create_indexed([2, 1, 3], [7, 0, 3]),
        "hindexed": I.Create_hindexed([1, 2], [20, 4]),
        "indexed_block": I.Create_indexed_block(2, [5, 1, 9]),
        "hindexed_block": D.Create_hindexed_block(1, [16, 0, 40]),
        "struct_with_gaps": MPI.Datatype.Create_struct([1, 2, 1], [0, 8, 28], [MPI.CHAR, I, D]),
        "subarray_c": D.Create_subarray([4, 6, 5], [2, 3, 4], [1, 2, 1]),
        "subarray_f": D.Create_subarray([4, 6, 5], [2, 3, 4], [1, 2, 1], order=MPI.ORDER_FORTRAN),
        "subarray_complex_rows": MPI.C_DOUBLE_COMPLEX.Create_subarray([3, 8], [3, 2], [0, 5]),
        "resized_negative_lb": D.Create_contiguous(2).Create_resized(-8, 32),
        "resized_tight": D.Create_vector(2, 1, 4).Create_resized(0, 8),
        "nested_vector_of_subarrays": D.Create_subarray([3, 4], [2, 2], [1, 1]).Create_resized(8, 88)
        .Create_hvector(2, 1, 200),
        # resized: Open MPI keeps the subarray's explicit bounds sticky inside the struct, MPICH does not
        "nested_struct": MPI.Datatype.Create_struct([2, 1], [0, 64], [inner, D.Create_subarray([4], [2], [1])])
        .Create_resized(0, 96),
        "dup": D.Create_vector(2, 2, 3).Dup(),
        "empty": D.Create_contiguous(0),
        "darray": D.Create_darray(4, 1, [8, 6], [MPI.DISTRIBUTE_BLOCK, MPI.DISTRIBUTE_CYCLIC],
                                  [MPI.DISTRIBUTE_DFLT_DARG, 2], [2, 2]),
    }
    return {name: t if t.is_predefined else t.Commit() for name, t in made.items()}


def free_types(types: dict) -> None:
    """Free the derived datatypes of a ``datatype_catalogue``."""
    for t in types.values():
        if not t.is_predefined:
            t.Free()


def rewrite_shard(root, index, shard, X, y):
    """Replace a shard's files by (X, y), keeping the index's sample count but fixing sizes and
    checksums, so only the content check can notice (a store writer with a bug)."""
    from hxmpi.data.store import sha256_file
    for part, arr in (("x", X), ("y", y)):
        f = shard["files"][part]
        with open(root / f["name"], "wb") as fh:
            np.save(fh, arr, allow_pickle=False)
        f["bytes"], f["sha256"] = (root / f["name"]).stat().st_size, sha256_file(root / f["name"])
    shard["bytes"] = shard["files"]["x"]["bytes"] + shard["files"]["y"]["bytes"]


def serve_store(seed, separation, prepare=None):
    """Rank 0 writes a store (3000 samples of 12 features, 4 classes, ~20 KB shards), lets
    ``prepare(root, index)`` change it, and serves it over HTTP; yields (server, url, root)."""
    from mpi4py import MPI
    comm = MPI.COMM_WORLD
    server, root = None, None
    if comm.rank == 0:
        root = Path(tempfile.mkdtemp(prefix="hxmpi-store-"))
        X, y = make_synthetic(3000, 12, 4, seed=seed, separation=separation)
        index = write_store(str(root), split_train_test(X, y, 0.2, seed), 4, shard_mb=0.02)
        if prepare:
            prepare(root, index)
        server = FaultServer(root)
    url, root = comm.bcast((server.url if server else None, str(root) if root else None), root=0)
    yield server, url, Path(root)
    comm.Barrier()
    if server:
        server.close()
        for path in [root, *_SCRATCH]:
            shutil.rmtree(path, ignore_errors=True)


@contextmanager
def injected(comm, server, name, plan):
    """The store serves ``name`` by ``plan`` (FaultServer faults) inside the block, on every rank."""
    if server:
        server.faults[name] = list(plan)
    comm.Barrier()
    try:
        yield
    finally:
        comm.Barrier()
        if server:
            server.faults[name] = []


def fresh_dir(comm):
    """An empty cache directory for one job of a test (removed with the module's store)."""
    path = comm.bcast(tempfile.mkdtemp(prefix="hxmpi-cache-") if comm.rank == 0 else None)
    _SCRATCH.append(path)
    return path


def session(sid):
    """Pids of every process of the job whose launcher is ``sid``, started in a session of its own:
    that session, and every descendant of the launcher (Hydra starts its proxy and each rank in a
    session of their own; Open MPI keeps them in the launcher's)."""
    parent, in_session = {}, []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                stat = (d / "stat").read_text()
            except OSError:
                continue
            fields = stat[stat.rindex(")") + 2:].split()
            parent[int(d.name)] = int(fields[1])
            if int(fields[3]) == sid:
                in_session.append(int(d.name))
    pids, grew = set(in_session) | ({sid} & parent.keys()), True
    while grew:
        more = {pid for pid, ppid in parent.items() if ppid in pids} - pids
        pids |= more
        grew = bool(more)
    return sorted(pids)


def kill_session(sid):
    """SIGKILL every process of session ``sid``, and remove what the killed launcher left behind."""
    from mpilaunch import forget_session
    pids = session(sid)
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    for pid in pids:
        forget_session(pid)


def epochs_logged(log):
    """The epoch records of a JSONL run log (none if the file does not exist)."""
    if not log.exists():
        return []
    return [json.loads(line) for line in log.read_text().splitlines() if '"event": "epoch"' in line]


def cluster_unavailable():
    """Why the emulated cluster cannot run here (no root, no namespaces), or None; probed once."""
    global _CLUSTER_SKIP
    if _CLUSTER_SKIP is _UNPROBED:
        from hxmpi.sim import cluster
        try:
            cluster.check_privileges()
            _CLUSTER_SKIP = None
        except cluster.ClusterError as exc:
            _CLUSTER_SKIP = str(exc)
    return _CLUSTER_SKIP


_UNPROBED = object()
_CLUSTER_SKIP = _UNPROBED


# The tests' clusters keep their state in one fixed place, so that a run that crashed is found
# again by the next one: recorded objects by 'down', objects whose state is gone by 'down --stale'.
TEST_STATE_BASE = Path("/run/hxmpi-cluster-tests")
#: The tests' cluster names, namespaces and subnets are fixed, so two suites on one machine (two
#: checkouts, or a rerun beside a run) would share them: the second's ``cluster_up`` takes the
#: first's hosts down mid-test. Modules marked ``emulated_cluster`` hold this lock while they run.
CLUSTER_LOCK = TEST_STATE_BASE / "lock"


def lock_clusters():
    """Wait for and take the machine's cluster-test lock; returns the open lock file (close it to
    release), or None where the lock cannot be made (no root: the cluster tests skip there)."""
    try:
        TEST_STATE_BASE.mkdir(parents=True, exist_ok=True)
        fh = open(CLUSTER_LOCK, "a")
    except OSError:
        return None
    fcntl.flock(fh, fcntl.LOCK_EX)
    return fh


def cluster_up(name, subnet, slots):
    """Yield the state of emulated hosts ``slots``, then take them down; first removes what an
    earlier run of the same cluster left behind (and only that)."""
    from hxmpi.sim import cluster
    old = cluster.STATE_BASE
    cluster.STATE_BASE = TEST_STATE_BASE
    try:
        cluster.down(name)
        cluster.down(name, stale=True)
        yield cluster.up(len(slots), slots, subnet, name=name)
    finally:
        cluster.down(name)
        cluster.STATE_BASE = old


def serve_shards(tmp_path_factory):
    """A store of 8 train shards (~20 KB each) behind a real HTTP server; yields (root, shards, server)."""
    root = tmp_path_factory.mktemp("store")
    X, y = make_synthetic(2000, 16, 4, seed=5)
    index = write_store(str(root), split_train_test(X, y, 0.2, 5), 4, shard_mb=0.02)
    server = FaultServer(root)
    yield root, index["splits"]["train"]["shards"], server
    server.close()


def simgrid_missing():
    """Why the simulator's replays cannot run here (no usable SimGrid), or None: the reason a
    replay test skips with."""
    from hxmpi.sim.errors import SimulateError
    from hxmpi.sim.replay import simgrid
    try:
        simgrid()
    except SimulateError as exc:
        return str(exc)
    return None


# ------------------------------------------------------------------------------- the API's docstrings
#: Where the docstrings of the public API are, by group: ``tests/test_api_examples.py`` runs each
#: group's examples as one script; ``tests/test_docs.py`` checks that they are the docstrings of
#: every public name. Each entry is (source file, name in it, public owner): a class brings its
#: own docstring (not where the name ends in ``.*``) and those of the public methods and
#: properties it defines, in source order, named after the public owner (``Deriving.*`` of
#: derived.py brings ``HierComm.Dup`` ...); ``*`` brings every class of the file; a function
#: brings its own.
API_SOURCES = {
    "HierComm": [("hxmpi/comm/exchange.py", "HierComm", "HierComm"),
                 ("hxmpi/comm/derived.py", "Deriving.*", "HierComm"),
                 ("hxmpi/comm/persistent.py", "Persisting.*", "HierComm"),
                 ("hxmpi/comm/rows.py", "Rows.*", "HierComm")],
    "CartHierComm": [("hxmpi/comm/exchange.py", "CartHierComm", "CartHierComm"),
                     ("hxmpi/comm/derived.py", "CartDeriving.*", "CartHierComm")],
    "Topology": [("hxmpi/comm/topology.py", "Topology", "Topology")],
    "HierRequest": [("hxmpi/comm/nonblocking.py", "HierRequest", "HierRequest"),
                    ("hxmpi/comm/nonblocking.py", "waitall", None)],
    "ExchangeRequest": [("hxmpi/comm/persistent.py", "ExchangeRequest", "ExchangeRequest")],
    "errors": [("hxmpi/errors.py", "*", None)],
}


def api_docstrings(root: Path = Path(__file__).resolve().parent.parent) -> dict:
    """``{group: {public name: docstring}}`` of ``API_SOURCES``, read from the source files (nothing
    is imported, so no MPI starts): names such as ``HierComm``, ``HierComm.Alltoallv``, ``waitall``,
    ``PlanStateError``; docstrings as ``inspect.cleandoc`` leaves them."""
    import ast
    import inspect

    def public(node) -> bool:
        return isinstance(node, (ast.FunctionDef, ast.ClassDef)) and not node.name.startswith("_")

    groups = {}
    for group, entries in API_SOURCES.items():
        docs = groups[group] = {}
        for path, name, owner in entries:
            tree = ast.parse((root / path).read_text())
            top = {n.name: n for n in tree.body if public(n)}
            if name == "*":
                chosen = [(n.name, n, False) for n in top.values() if isinstance(n, ast.ClassDef)]
            else:
                chosen = [(owner or name.removesuffix(".*"), top[name.removesuffix(".*")], name.endswith(".*"))]
            for public_name, node, members_only in chosen:
                if not members_only:
                    docs[public_name] = inspect.cleandoc(ast.get_docstring(node, clean=False) or "")
                if isinstance(node, ast.ClassDef):
                    for member in node.body:
                        if public(member):
                            docs[f"{public_name}.{member.name}"] = inspect.cleandoc(
                                ast.get_docstring(member, clean=False) or "")
    return groups


def load_script(relpath: str, name: str):
    """A script of the repository that is not in a package (``benchmarks/report.py``,
    ``docs/_ext/hxmpi_docs.py``), loaded by its path as module ``name``."""
    spec = importlib.util.spec_from_file_location(name, Path(__file__).resolve().parent.parent / relpath)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
