"""Mixture-of-experts classifier with expert parallelism over a HierComm (see docs/method.md).

Layers: dense ReLU (D -> H), then an MoE layer with top-1 gating, a capacity factor and a residual
connection (H -> H; expert e is a ReLU layer), then a softmax output (H -> C). Experts are sharded
over the ranks: rank r owns experts [r*E/P, (r+1)*E/P). Tokens travel to their expert's rank and
back with ``HierComm.alltoallv``, in the forward and the backward pass.
"""
from __future__ import annotations

import numpy as np

from ..errors import SettingError
from ..exchange import HierComm
from .base import FlatParams, glorot, softmax_xent


class MoE:
    """Top-1 MoE classifier; dense parameters are averaged across ranks, expert ones stay local."""

    collective_steps = True  # every step exchanges tokens: all ranks must step together

    def __init__(self, n_features: int, n_classes: int, hidden: int, num_experts: int,
                 capacity_factor: float, hc: HierComm, seed: int, dtype=np.float64):
        size, rank = hc.comm.size, hc.comm.rank
        if num_experts < 1 or num_experts % size:
            raise SettingError("experts", f"{num_experts} must be a positive multiple of the {size} ranks")
        if capacity_factor <= 0:
            raise SettingError("capacity_factor", f"must be > 0, got {capacity_factor}")
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
        kept = kept[np.argsort(expert[kept], kind="stable")]  # grouped by expert, so by owner rank
        owner_counts = np.bincount(expert[kept] // self.local, minlength=self.hc.comm.size)
        return probs, expert, kept, owner_counts

    def _experts_forward(self, rows: np.ndarray):
        hx, local_id = rows[:, :self.H], rows[:, self.H].astype(np.int64)
        pre = np.empty_like(hx)
        for j in range(self.local):
            m = local_id == j
            pre[m] = hx[m] @ self.flat.p["W_exp"][j] + self.flat.p["b_exp"][j]
        return hx, local_id, pre

    def _forward(self, X: np.ndarray):
        p = self.flat.p
        z1 = X @ p["W_in"] + p["b_in"]
        h = np.maximum(z1, 0.0)
        probs, expert, kept, owner_counts = self._route(h)
        rows = np.concatenate([h[kept], (expert[kept] - (expert[kept] // self.local) * self.local)
                               [:, None].astype(h.dtype)], axis=1)
        recv, recv_counts = self.hc.alltoallv(rows, owner_counts)
        hx, local_id, pre = self._experts_forward(recv)
        back, _ = self.hc.alltoallv(np.maximum(pre, 0.0), recv_counts)
        gate = probs[kept, expert[kept]]
        y = h.copy()
        y[kept] += gate[:, None] * back
        return dict(z1=z1, h=h, probs=probs, expert=expert, kept=kept, owner_counts=owner_counts,
                    recv_counts=recv_counts, hx=hx, local_id=local_id, pre=pre, back=back, gate=gate, y=y)

    # -------------------------------------------------------------- public
    def logits(self, X: np.ndarray) -> np.ndarray:
        """Forward pass (collective: every rank must call it, with any number of rows)."""
        f = self._forward(X)
        return f["y"] @ self.flat.p["W_out"] + self.flat.p["b_out"]

    def loss_and_grad(self, X: np.ndarray, y: np.ndarray, scale: float) -> tuple[float, int]:
        """Add scale * d(sum of losses) to the gradients (collective); return (summed loss, correct)."""
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
        d_out, _ = self.hc.alltoallv(gate[:, None] * dy[kept], f["owner_counts"])
        dpre = d_out * (f["pre"] > 0)
        d_hx = np.empty_like(dpre)
        for j in range(self.local):
            m = f["local_id"] == j
            g["W_exp"][j] += f["hx"][m].T @ dpre[m]
            g["b_exp"][j] += dpre[m].sum(axis=0)
            d_hx[m] = dpre[m] @ p["W_exp"][j].T
        d_tok, _ = self.hc.alltoallv(d_hx, f["recv_counts"])
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
        return loss, correct
