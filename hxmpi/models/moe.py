"""Mixture-of-experts classifier with expert parallelism over a HierComm (see docs/method.md).

Layers: dense ReLU (D -> H), then an MoE layer with top-1 gating, a capacity factor and a residual
connection (H -> H; expert e is a ReLU layer), then a softmax output (H -> C). Experts are sharded
over the ranks: rank r owns experts [r*E/P, (r+1)*E/P).

Tokens travel to their expert's rank and back in fixed-capacity slots (as GShard and Tutel do): every
rank sends every rank ``slots`` rows per local expert, padded with zeros, so the count pattern never
changes and the four exchanges of a step (tokens out and back, their gradients out and back) are two
persistent ``HierComm`` requests, agreed and planned once per slot count. Padding never changes a
result: padded rows are zero on the way out, ignored on the way back, and carry zero gradient.
"""
from __future__ import annotations

import numpy as np
from mpi4py import MPI

from ..comm.exchange import HierComm
from ..errors import SettingError
from ..schema import check
from .base import FlatParams, glorot, softmax_xent

__all__ = ["MoE"]


class _Dispatch:
    """Fixed-slot token exchange of width ``width``: ``slots`` rows per local expert to every rank.

    ``out`` -> ``at_owner`` carries rows to the experts' ranks, ``result`` -> ``back`` carries them
    back; both are persistent requests (collective to create and to free).
    """

    def __init__(self, hc: HierComm, slots: int, local: int, width: int, dtype):
        rows = hc.comm.size * local * slots
        self.out, self.at_owner, self.result, self.back = (np.zeros((rows, width), dtype) for _ in range(4))
        counts = np.full(hc.comm.size, local * slots * width, dtype=np.int64)
        self.to_owner = hc.Alltoallv_init([self.out, counts], [self.at_owner, counts])
        self.to_source = hc.Alltoallv_init([self.result, counts], [self.back, counts])

    @staticmethod
    def run(request) -> None:
        request.Start()
        request.Wait()

    def free(self) -> None:
        self.to_owner.Free()
        self.to_source.Free()


class MoE:
    """Top-1 MoE classifier; dense parameters are averaged across ranks, expert ones stay local."""

    collective_steps = True  # every step exchanges tokens: all ranks must step together

    def __init__(self, n_features: int, n_classes: int, hidden: int, num_experts: int,
                 capacity_factor: float, hc: HierComm, seed: int, dtype=np.float64):
        size, rank = hc.comm.size, hc.comm.rank
        if num_experts < 1 or num_experts % size:
            raise SettingError("experts", f"{num_experts} must be a positive multiple of the {size} ranks")
        check("capacity_factor", capacity_factor)
        self.hc, self.E, self.H = hc, num_experts, hidden
        self.local = num_experts // size
        self.first = rank * self.local
        self.capacity_factor = capacity_factor
        self.flat = FlatParams(
            {"W_in": (n_features, hidden), "b_in": (hidden,), "W_gate": (hidden, num_experts),
             "W_out": (hidden, n_classes), "b_out": (n_classes,)},
            {"W_exp": (self.local, hidden, hidden), "b_exp": (self.local, hidden)}, dtype=dtype)
        rng = np.random.default_rng(seed)
        p = self.flat.p
        p["W_in"][:] = glorot(rng, n_features, hidden)
        p["W_gate"][:] = glorot(rng, hidden, num_experts)
        p["W_out"][:] = glorot(rng, hidden, n_classes)
        # Every rank draws all experts and keeps its own, so any rank count gives the same model.
        experts = np.stack([glorot(rng, hidden, hidden) for _ in range(num_experts)])
        p["W_exp"][:] = experts[self.first:self.first + self.local]
        self._dispatch: dict[int, _Dispatch] = {}  # by slot count: training batches, evaluation
        self._n_max = np.zeros(1, dtype=np.int64)

    def _dispatcher(self, n: int) -> _Dispatch:
        """The persistent exchange for the largest batch on any rank (one small Allreduce per call)."""
        self._n_max[0] = n
        self.hc.comm.Allreduce(MPI.IN_PLACE, self._n_max, op=MPI.MAX)
        n_max = int(self._n_max[0])
        # Room for the largest capacity any rank can use, never more than its batch (no drops then).
        slots = max(1, min(n_max, int(np.ceil(self.capacity_factor * n_max / self.E))))
        d = self._dispatch.get(slots)
        if d is None:
            if len(self._dispatch) >= 2:  # the slot counts are agreed, so every rank evicts alike
                self._dispatch.pop(next(iter(self._dispatch))).free()
            d = self._dispatch[slots] = _Dispatch(self.hc, slots, self.local, self.H, self.flat.p["W_in"].dtype)
        return d

    # -------------------------------------------------------------- routing
    def _route(self, h: np.ndarray):
        probs = h @ self.flat.p["W_gate"]
        probs = np.exp(probs - probs.max(axis=1, keepdims=True))
        probs /= probs.sum(axis=1, keepdims=True)
        expert = probs.argmax(axis=1)
        n = h.shape[0]
        # Capacity per expert for this rank's tokens; later tokens over it skip the layer (residual).
        capacity = max(1, int(np.ceil(self.capacity_factor * n / self.E)))
        order = np.argsort(expert, kind="stable")
        slot = np.empty(n, dtype=np.int64)
        counts_e = np.bincount(expert, minlength=self.E)
        starts = np.concatenate([[0], np.cumsum(counts_e)[:-1]])
        slot[order] = np.arange(n) - np.repeat(starts, counts_e)
        kept = np.flatnonzero(slot < capacity)
        return probs, expert, kept, slot[kept]

    def _experts(self, rows: np.ndarray, slots: int) -> np.ndarray:
        """Rows at an owner, (source, local expert, slot), as (local expert, source * slot, H) views."""
        size = self.hc.comm.size
        return rows.reshape(size, self.local, slots, self.H).transpose(1, 0, 2, 3).reshape(
            self.local, size * slots, self.H)

    def _forward(self, X: np.ndarray):
        p = self.flat.p
        z1 = X @ p["W_in"] + p["b_in"]
        h = np.maximum(z1, 0.0)
        probs, expert, kept, slot = self._route(h)
        d = self._dispatcher(X.shape[0])
        slots = d.out.shape[0] // (self.hc.comm.size * self.local)
        where = expert[kept] * slots + slot  # row of each kept token: (owner, local expert, slot)
        d.out.fill(0)
        d.out[where] = h[kept]
        d.run(d.to_owner)
        hx = self._experts(d.at_owner, slots).copy()  # the buffer serves the backward pass too
        pre = np.matmul(hx, p["W_exp"]) + p["b_exp"][:, None, :]
        d.result.reshape(self.hc.comm.size, self.local, slots, self.H)[:] = np.maximum(pre, 0.0).reshape(
            self.local, self.hc.comm.size, slots, self.H).transpose(1, 0, 2, 3)
        d.run(d.to_source)
        back = d.back[where]
        gate = probs[kept, expert[kept]]
        y = h.copy()
        y[kept] += gate[:, None] * back
        return dict(z1=z1, h=h, probs=probs, expert=expert, kept=kept, where=where, slots=slots,
                    hx=hx, pre=pre, back=back, gate=gate, y=y)

    # -------------------------------------------------------------- public
    def logits(self, X: np.ndarray) -> np.ndarray:
        """Forward pass (collective: every rank must call it, with any number of rows)."""
        f = self._forward(X)
        return f["y"] @ self.flat.p["W_out"] + self.flat.p["b_out"]

    def grad_segments(self) -> list[tuple[int, int]]:
        """One dense gradient range, complete only at the end of the backward pass (its token
        exchanges are collectives of their own: the dense reduction is not overlapped with them)."""
        return [(0, self.flat.dense_size)]

    def loss_and_grad(self, X: np.ndarray, y: np.ndarray, scale: float, segment_done=None) -> tuple[float, int]:
        """Add scale * d(sum of losses) to the gradients (collective); return (summed loss, correct);
        ``segment_done(0)`` once the dense gradient is complete (see ``MLP.loss_and_grad``)."""
        p, g = self.flat.p, self.flat.g
        f = self._forward(X)
        loss, correct, dlogits = softmax_xent(f["y"] @ p["W_out"] + p["b_out"], y, scale)
        g["W_out"] += f["y"].T @ dlogits
        g["b_out"] += dlogits.sum(axis=0)
        dy = dlogits @ p["W_out"].T
        dh = dy.copy()  # residual path
        kept, gate, back = f["kept"], f["gate"], f["back"]
        dgate = (dy[kept] * back).sum(axis=1)
        # Expert backward on the owner ranks: the gradient of each expert output travels there.
        slots, where, size = f["slots"], f["where"], self.hc.comm.size
        d = self._dispatch[slots]  # the forward pass's exchange: no second slot agreement
        d.out.fill(0)
        d.out[where] = gate[:, None] * dy[kept]
        d.run(d.to_owner)
        dpre = self._experts(d.at_owner, slots) * (f["pre"] > 0)
        g["W_exp"] += np.matmul(f["hx"].transpose(0, 2, 1), dpre)
        g["b_exp"] += dpre.sum(axis=1)
        d_hx = np.matmul(dpre, p["W_exp"].transpose(0, 2, 1))
        d.result.reshape(size, self.local, slots, self.H)[:] = d_hx.reshape(
            self.local, size, slots, self.H).transpose(1, 0, 2, 3)
        d.run(d.to_source)
        d_tok = d.back[where]
        dh[kept] += d_tok
        # Gate: d gate_value / d logits_j = p_e * (1[j == e] - p_j).
        dz = np.zeros_like(f["probs"])
        pe = f["probs"][kept]
        dz[kept] = -dgate[:, None] * gate[:, None] * pe
        dz[kept, f["expert"][kept]] += dgate * gate
        g["W_gate"] += f["h"].T @ dz
        dh += dz @ p["W_gate"].T
        dz1 = dh * (f["z1"] > 0)
        g["W_in"] += X.T @ dz1
        g["b_in"] += dz1.sum(axis=0)
        if segment_done is not None:
            segment_done(0)
        return loss, correct
