"""The walk: a call's step programs priced, unit by unit, as coefficients of the parameters.

``price_program`` cuts each rank's program (``hxmpi.comm.plan``: what the runners execute and the
simulator replays) into units every rank takes at once (a run of copies, a node barrier, a
message phase: exchanges posted together, one pairwise exchange, one Bruck round) and prices each
with alpha-beta-LogP terms; a call costs, per unit, its costliest rank, summed over units
(``ProgramPrice``). Messages left in flight (a pipelined node phase) make one unit with the copies
and barriers that run beside them up to their wait: it costs the larger of the two.
``layout_price`` prices an even call of an algorithm on a layout from a few representative ranks (``representative_ranks``), and ``shape_price`` caches that per node shape,
so any block and pattern is then arithmetic.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Mapping, Optional, Sequence

import numpy as np

from ..plan import (HEADER_BYTES, Algorithm, BarrierStep, CopyStep, Layout, StepProgram, WaitStep, bruck_rounds,
                    check_radix, exclusive_cumsum, program_steps)
from .collectives import alltoallv_algorithm, dissemination_distances
from .params import INDEX, NAMES, Parameters

__all__ = ["ProgramPrice", "price_program", "representative_ranks", "layout_price", "shape_price",
           "IRREGULAR_WALK_MAX", "call_shape"]

_O = INDEX["msg_overhead"]


@dataclass(frozen=True)
class ProgramPrice:
    """A call's step programs as priced rows, at a block of 1 byte, so any block size is priced by
    arithmetic: what ``price_program`` returns and ``predict_call`` caches per layout.

    The programs are cut into **units**, each a step every rank takes at once (a copy, a node
    barrier, a message phase: exchanges posted together, one pairwise exchange, one Bruck round).
    Each row is one rank's cost of one unit in one regime (a Bruck round: latency-bound or
    CPU-bound; the NIC: bound by the node's messages and bytes), as coefficients of ``vector()``:
    ``const`` (independent of the block) plus ``per_byte`` times the block. A unit costs its
    costliest row, and a call the sum of its units. ``world``: rows of a message phase on the
    world (flat), whose message count a sparse pattern scales; ``pairwise``: rows of pairwise
    rounds, which wait for the larger block of each pair (``Pattern.pairwise_bytes``)."""
    unit: np.ndarray
    const: np.ndarray
    per_byte: np.ndarray
    world: np.ndarray
    pairwise: np.ndarray
    units: int

    def price(self, model: Parameters, block: float, pairwise_block: Optional[float] = None,
              messages: float = 1.0) -> float:
        """Seconds at ``block`` bytes per destination; ``pairwise_block``: the block pairwise rounds
        wait for (default ``block``); ``messages``: the fraction of a flat phase's messages sent."""
        theta = model.vector()
        t = self.const @ theta
        if messages != 1.0:
            t = t - (1.0 - messages) * self.world * self.const[:, _O] * theta[_O]
        b = np.where(self.pairwise, block if pairwise_block is None else pairwise_block, block)
        t = t + b * (self.per_byte @ theta)
        if not self.units:
            return 0.0
        starts = np.flatnonzero(np.r_[True, self.unit[1:] != self.unit[:-1]])  # rows come in unit order
        return float(np.maximum.reduceat(t, starts).sum())

    def linear(self, block: float) -> np.ndarray:
        """Coefficients of ``vector()`` at ``block`` where each unit has one costliest row whatever
        the parameters (no Bruck rounds, no NIC; ranks that differ in what they copy or send):
        the sum of each unit's costliest row, found at the default parameters."""
        rows = self.const + block * self.per_byte
        t = rows @ Parameters().vector()
        pick = [int(np.flatnonzero(self.unit == u)[np.argmax(t[self.unit == u])]) for u in range(self.units)]
        return rows[pick].sum(axis=0)


class _Rows:
    """Builder of a ``ProgramPrice``: blocks of rows (one per rank of a unit), each a (const,
    per_byte) pair of (ranks, parameters) arrays."""

    def __init__(self):
        self.blocks: list = []

    def add(self, unit: int, const: np.ndarray, per_byte: np.ndarray, world: bool, pairwise: bool) -> None:
        self.blocks.append((unit, const, per_byte, world, pairwise))

    def done(self, units: int) -> ProgramPrice:
        if not self.blocks:
            z = np.zeros((0, len(NAMES)))
            return ProgramPrice(np.zeros(0, dtype=np.int64), z, z, np.zeros(0), np.zeros(0, dtype=bool), 0)
        rows = np.concatenate([np.column_stack([np.full(len(c), u), c, b, np.full(len(c), w), np.full(len(c), pw)])
                               for u, c, b, w, pw in self.blocks])
        # Ranks alike price alike: one row of each (rows compared as bytes), in unit order.
        rows = np.ascontiguousarray(rows)
        _, keep = np.unique(rows.view(np.dtype((np.void, rows.dtype.itemsize * rows.shape[1]))).ravel(),
                            return_index=True)
        rows = rows[np.sort(keep)]
        rows = rows[np.argsort(rows[:, 0], kind="stable")]
        k = len(NAMES)
        return ProgramPrice(rows[:, 0].astype(np.int64), rows[:, 1:1 + k], rows[:, 1 + k:1 + 2 * k],
                            rows[:, 1 + 2 * k], rows[:, 2 + 2 * k].astype(bool), units)


def _cols(n: int, **coef) -> np.ndarray:
    """(n, parameters) coefficients: each named parameter's column set to its value (a number or
    an array of n)."""
    out = np.zeros((n, len(NAMES)))
    for name, v in coef.items():
        out[:, INDEX[name]] += v
    return out


def _units(layout: Layout, rank: int, prog: StepProgram, learned: bool, rule: str) -> list:
    """One rank's program cut into units (see ``ProgramPrice``), each a dict of what the rank
    does in it: its kind, copied bytes, and the world ranks it sends to (``to``) with the bytes of
    each, per block byte (``nu``) and constant (``nc``: Bruck's length headers)."""
    node_of = layout.node_of
    me = int(node_of[rank])
    out: list = []
    group: list = []
    beside: Optional[dict] = None  # the message unit left in flight: what the rank does meanwhile

    def messages(kind: str, peers_: np.ndarray, nu: np.ndarray, nc: np.ndarray, copy_u: float = 0.0,
                 copy_c: float = 0.0, **extra) -> dict:
        """A message unit: to world ranks ``peers_``, bytes per block byte ``nu`` and constant ``nc``."""
        return {"kind": kind, "copy_u": copy_u, "copy_c": copy_c, "to": peers_, "nu": nu, "nc": nc, **extra}

    def copied(nbytes: float) -> None:
        """Consecutive copies are one unit (one rank packs where another does not); beside
        messages in flight, part of their unit."""
        if beside is not None:
            beside["side_u"] += nbytes
        elif out and out[-1]["kind"] == "copy":
            out[-1]["copy_u"] += nbytes
        else:
            out.append({"kind": "copy", "copy_u": nbytes, "copy_c": 0.0})

    for st in program_steps(prog):
        if isinstance(st, CopyStep):
            copied(float(st.nbytes))
            continue
        if isinstance(st, BarrierStep):
            if beside is not None:
                beside["side_rounds"] += len(dissemination_distances(layout.node_sizes[me]))
            else:
                out.append({"kind": "barrier", "size": layout.node_sizes[me]})
            continue
        if isinstance(st, WaitStep):
            beside = None
            continue
        peers = layout.comm_members(rank, st.comm)
        n = len(peers)
        pos = int(np.flatnonzero(peers == rank)[0])
        sc = st.send_counts
        if st.rounds == "bruck":
            radix = check_radix(st.radix, n)
            for rnd in bruck_rounds(n, radix):
                dist = np.array([d for d, _ in rnd], dtype=np.int64)
                sizes = np.array([slots.size for _, slots in rnd], dtype=np.int64)
                to = peers[(pos + dist) % n]
                nu = np.add.reduceat(sc[(pos + np.concatenate([slots for _, slots in rnd])) % n],
                                     exclusive_cumsum(sizes)).astype(float)
                nc = np.zeros(sizes.size) if learned else (HEADER_BYTES * sizes).astype(float)
                keep = nu > 0 if learned else np.ones(nu.size, dtype=bool)
                out.append(messages("round", to[keep], nu[keep], nc[keep], float(nu[keep].sum()),
                                    float(nc[keep].sum())))
            copied(float(st.recv_counts.sum()))
            continue
        sent = np.flatnonzero(sc)
        sent = sent[sent != pos]
        group.append((peers[sent], sc[sent].astype(float), float(sc[pos])))
        if st.with_next and st.rounds != "pairwise":
            continue  # linear exchanges posted together are one unit; pairwise ones run in turn
        if st.rounds == "pairwise":
            how = "pairwise"
        elif st.blocking and len(group) == 1:
            how = rule or alltoallv_algorithm(n)  # a blocking call: Open MPI's rule picks
        else:
            how = "linear"  # nonblocking: libnbc posts every message at once
        to = np.concatenate([g[0] for g in group])
        nu = np.concatenate([g[1] for g in group])
        out.append(messages(how, to, nu, np.zeros(nu.size), sum(g[2] for g in group), world=st.comm == "world"))
        group = []
        if st.in_flight:  # what runs up to the wait runs beside these messages, in their unit
            beside = out[-1]
            beside["side_u"], beside["side_rounds"] = 0.0, 0
    return out


def _sided(units: list, layout: Layout, rank: int, shift: int = 0) -> list:
    """``units`` of ``rank`` with each message unit's messages and bytes split by whether they
    leave the node (``m_inter``, ``inter_u``, ``inter_c``) or not (``m_intra``, ...); ``shift``:
    read them as rank + shift's, every peer shifted alike (a flat program on even counts)."""
    p = layout.size
    me = layout.node_of[(rank + shift) % p]
    out = []
    for u in units:
        if "to" not in u:
            out.append(u)
            continue
        to = u["to"] + shift if shift else u["to"]
        inter = (layout.node_of[to % p if shift else to] != me).astype(float)
        v = {k: x for k, x in u.items() if k not in ("to", "nu", "nc")}
        v["m_inter"] = int(inter.sum())
        v["m_intra"] = int(inter.size) - v["m_inter"]
        for key, x in (("u", u["nu"]), ("c", u["nc"])):
            v[f"inter_{key}"] = float(x @ inter)
            v[f"intra_{key}"] = float(x.sum()) - v[f"inter_{key}"]
        out.append(v)
    return out


def _aligned(per_rank: dict) -> dict:
    """Each rank's units lined up with the longest program's, by kind in order: a rank that skips
    a unit (a multi-leader rank that leads nothing has no exchange) idles there."""
    template = max(per_rank.values(), key=len, default=[])
    out = {}
    for r, us in per_rank.items():
        if len(us) == len(template):
            out[r] = us
            continue
        lined, i = [], 0
        for t in template:
            if i < len(us) and us[i]["kind"] == t["kind"]:
                lined.append(us[i])
                i += 1
            else:
                lined.append({"kind": "idle"})
        if i < len(us):
            raise ValueError(f"rank {r}'s program does not line up with the longest one")
        out[r] = lined
    return out


def price_program(layout: Layout, programs: Mapping[int, StepProgram], learned: bool = True,
                  rule: str = "", shifts: Sequence[int] = ()) -> ProgramPrice:
    """Price step programs of some ranks of ``layout`` (``programs``: rank -> its program), made
    with 1-byte blocks: the call's time is the sum over units of the costliest rank's unit.

    Copies cost their bytes at ``beta_copy``; a node barrier ceil(log2 G) dissemination rounds; a
    message phase, with m peers, o the CPU cost of posting or completing one message and a the
    latency (inter-node if any peer is on another node), and its bytes::

      linear (all posted at once):    a + 2 m o
      pairwise rounds (one by one):   sum over rounds of (a + 2 o)
      a Bruck round of k messages:    max(a + (k + 1) o, 2 k o)   (LogP: posting vs arrival)

    plus the larger of the node's bytes to other nodes at ``beta_inter +
    beta_backbone`` (a node's ranks share its link: the sum over the node's ranks in ``programs``,
    scaled to the whole node where only some are given) and the rank's own to its node at
    ``beta_intra`` (link and loopback run in parallel); with a NIC, a phase costs at least a
    plus the node's inter-node messages at ``1 / nic_msg_rate`` and bytes at ``1 / nic_bandwidth``.
    A blocking exchange runs as Open MPI's rule says (``alltoallv_algorithm``; ``rule`` forces
    one), a nonblocking one linear. ``learned``: Bruck lengths known (no headers, no empty
    messages). ``shifts``: ``programs`` is one rank's flat program on even counts, which is also
    that of rank + shift for each shift (peers shifted alike): price those ranks from it."""
    if shifts:  # one flat program on even counts stands for rank + shift's, for each shift
        (r0, prog), = programs.items()
        units = _units(layout, r0, prog, learned, rule)
        per_rank = {(r0 + s) % layout.size: _sided(units, layout, r0, s) for s in shifts}
    else:
        per_rank = {r: _sided(_units(layout, r, prog, learned, rule), layout, r) for r, prog in programs.items()}
    per_rank = _aligned(per_rank)
    units = max((len(u) for u in per_rank.values()), default=0)
    # The node's share of each unit: its given ranks' inter-node bytes and messages, scaled up.
    given: dict = {}
    for r in per_rank:
        given.setdefault(int(layout.node_of[r]), []).append(r)
    load: dict = {}
    for node, ranks in given.items():
        scale = layout.node_sizes[node] / len(ranks)
        for i in range(units):
            us = [per_rank[r][i] for r in ranks if i < len(per_rank[r]) and "m_inter" in per_rank[r][i]]
            load[node, i] = tuple(scale * sum(u[k] for u in us) for k in ("inter_u", "inter_c", "m_inter"))
    rows = _Rows()
    for i in range(units):
        at = [(r, us[i]) for r, us in per_rank.items() if i < len(us)]
        for kind in {u["kind"] for _, u in at} - {"idle"}:
            group = [(r, u) for r, u in at if u["kind"] == kind]
            _unit_rows(rows, i, kind, group, layout, load)
    return rows.done(units)


def _unit_rows(rows: _Rows, i: int, kind: str, group: list, layout: Layout, load: dict) -> None:
    """Rows of unit ``i`` for its ranks of one ``kind`` (see ``price_program``), all ranks at once."""
    n = len(group)
    col = lambda key: np.array([u[key] for _, u in group], dtype=float)  # noqa: E731
    if kind == "barrier":
        rounds = np.array([len(dissemination_distances(int(g))) for g in col("size")], dtype=float)
        rows.add(i, _cols(n, alpha_intra=rounds, msg_overhead=2 * rounds), _cols(n), False, False)
        return
    copy_c, copy_u = _cols(n, beta_copy=col("copy_c")), _cols(n, beta_copy=col("copy_u"))
    if kind == "copy":
        rows.add(i, copy_c, copy_u, False, False)
        return
    world = bool(group[0][1].get("world", False))
    pw = world and kind == "pairwise"
    nodes = [int(layout.node_of[r]) for r, _ in group]
    node_u, node_c, node_m = (np.array([load[m, i][k] for m in nodes]) for k in range(3))
    m_inter, m_intra = col("m_inter"), col("m_intra")
    msgs = m_inter + m_intra
    lat = _cols(n, alpha_inter=(m_inter > 0) * 1.0, alpha_intra=(m_inter == 0) * (msgs > 0) * 1.0)
    ovh = lambda per_msg, extra=0.0: _cols(n, msg_overhead=np.where(msgs > 0, per_msg * msgs + extra, 0.0))  # noqa: E731
    # The node's link and the rank's own intra-node bytes (its loopback) run in parallel.
    has = (msgs > 0) * 1.0  # a rank that sends nothing here waits for nobody's bytes
    wires = [(_cols(n, beta_inter=has * node_c, beta_backbone=has * node_c),
              _cols(n, beta_inter=has * node_u, beta_backbone=has * node_u)),
             (_cols(n, beta_intra=col("intra_c")), _cols(n, beta_intra=col("intra_u")))]
    alone = []  # regimes without the bytes' time
    if kind == "linear":
        regimes = [lat + ovh(2)]
    elif kind == "pairwise":
        regimes = [_cols(n, alpha_inter=m_inter, alpha_intra=m_intra) + ovh(2)]
    else:  # a Bruck round: the wire carries the first messages while the rank posts the rest
        alone = [lat + ovh(1, 1.0), ovh(2)]
        regimes = [lat + _cols(n, msg_overhead=np.where(msgs > 0, 2.0, 0.0))]
    for reg in alone:
        rows.add(i, reg + copy_c, copy_u, world, pw)
    for reg in regimes:
        for c, b in wires:
            rows.add(i, reg + copy_c + c, copy_u + b, world, pw)
    if (m_inter > 0).any():  # the NIC: the node's inter-node messages and bytes, one after another
        on = (m_inter > 0) * 1.0
        rows.add(i, lat + copy_c + _cols(n, nic_msg_rate=on * node_m, nic_bandwidth=on * node_c),
                 copy_u + _cols(n, nic_bandwidth=on * node_u), world, pw)
    if "side_u" in group[0][1]:  # messages in flight: the copies and barriers beside them
        rounds = col("side_rounds")
        rows.add(i, _cols(n, alpha_intra=rounds, msg_overhead=2 * rounds), _cols(n, beta_copy=col("side_u")), world,
                 pw)


def representative_ranks(layout: Layout, algorithm: Algorithm) -> tuple:
    """The ranks whose programs price an even call on ``layout`` (nodes of one size; irregular
    layouts: every rank). A flat program is the same on every node (a shift by one node maps the
    programs onto each other): node 0's ranks, and rank 0 alone where every exchange is direct (one
    message to each peer), as only rounds at distance d cross a node boundary from some of a
    node's ranks and not others. The lanes treat a node's ranks alike, but the nodes differ in
    their copies (an inner node packs its send blocks around its own): the first rank of the
    first, second and last nodes. Multi-leader: every rank of those nodes (a node's leaders send, its
    other ranks do not), and so for lanes that can pipeline (``chunked``): the lanes take their
    chunks' groups of ranks in turn, and where the chunks do not divide a node's ranks some local
    ranks carry more in a chunk than others."""
    if not layout.is_regular:
        return tuple(range(layout.size))
    if algorithm.led or algorithm.chunked:  # a node's ranks differ: whole nodes
        return tuple(int(r) for m in sorted({0, 1 % layout.num_nodes, layout.num_nodes - 1})
                     for r in layout.members[m])
    if algorithm.hierarchical:
        return tuple(sorted({int(layout.members[m][0]) for m in (0, 1 % layout.num_nodes, layout.num_nodes - 1)}))
    if not algorithm.radixed:
        return (0,)
    return tuple(int(r) for r in layout.members[0])


def layout_price(layout: Layout, algorithm, radix: Optional[int] = None, node_phase: str = "shm", learned: bool = True,
                 rule: str = "", ranks: Optional[Sequence[int]] = None, uniform: bool = False) -> ProgramPrice:
    """The ``ProgramPrice`` of an even call of ``algorithm`` on ``layout`` (it runs as ``runs_as``
    says): the programs the planners make for ``ranks`` (default ``representative_ranks``; every
    rank for the full walk) with 1-byte blocks (a pipelined node phase's chunks carry whole blocks,
    so they are all priced there too). ``uniform``: an Alltoall's flat program."""
    algo = layout.runs(algorithm)
    p = layout.size
    if algo.led and node_phase != "shm":
        raise ValueError(f"{algo.name} runs with the 'shm' node phase only, not {node_phase!r}")
    # A read-only view, no p x p array: the planners read a rank's row and column and its node's.
    even = np.broadcast_to(np.array(1, dtype=np.int64), (p, p))

    def made(r: int) -> StepProgram:
        return layout.rank_program(r, algo, even, node_phase, radix, uniform).detach()
    if ranks is None and not algo.hierarchical:  # every rank's flat program is rank 0's, shifted
        price = price_program(layout, {0: made(0)}, learned, rule, shifts=representative_ranks(layout, algo))
    else:
        ranks = representative_ranks(layout, algo) if ranks is None else ranks
        price = price_program(layout, {r: made(r) for r in ranks}, learned, rule)
    return price


@lru_cache(maxsize=512)
def shape_price(shape: tuple, algorithm: str, radix: int, node_phase: str, learned: bool, rule: str) -> ProgramPrice:
    """``layout_price`` of consecutive nodes of ``shape``'s sizes, cached: a layout's prices are
    made once, then any block and pattern is arithmetic."""
    return layout_price(_layout(shape), algorithm, radix, node_phase, learned, rule, uniform=rule != "")


@lru_cache(maxsize=16)
def _layout(shape: tuple) -> Layout:
    return Layout(np.repeat(np.arange(len(shape)), shape))


#: Irregular layouts up to this many ranks are priced by the walk of every rank's program; larger
#: ones as nodes of the largest size (the walk of every rank would cost seconds there).
IRREGULAR_WALK_MAX = 256


def call_shape(nodes: int, per_node: int, sizes: Optional[Sequence[int]] = None) -> tuple:
    """Node sizes of a call: ``sizes`` where given (irregular ones above ``IRREGULAR_WALK_MAX``
    ranks as nodes of the largest), else ``nodes`` nodes of ``per_node``."""
    if sizes is None or (len(set(sizes)) > 1 and sum(sizes) > IRREGULAR_WALK_MAX):
        return (int(per_node if sizes is None else max(sizes)),) * int(nodes if sizes is None else len(sizes))
    return tuple(int(g) for g in sizes)
