"""``TrainConfig``: every setting of a training run, in one place, independent of the command line.

The CLI (``hxmpi.train``) builds it from its flags; library code takes it (or the parts it needs:
``staging_config()``, ``update_config()``) and reports a bad value as a ``SettingError`` that names
the setting, never a flag. The CLI turns the setting name into its flag (``batch_size`` ->
``--batch-size``) when it prints the error.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, fields
from typing import Optional

from .data.staging import StagingConfig
from .errors import SettingError
from .updates import Straggle, UpdateConfig

__all__ = ["SettingError", "TrainConfig"]


# The range of every numeric setting (None is allowed where the field's default is None). NaN and
# infinities are outside every range.
RANGES = {
    "experts": ">= 1", "capacity_factor": "> 0", "capacity_threshold": ">= 0", "cache_limit": ">= 0",
    "prefetch_shards": ">= 0", "pretrain_time": "> 0", "retries": ">= 0", "timeout": "> 0",
    "fetch_workers": ">= 1", "epochs": ">= 1", "batch_size": ">= 1", "lr": "> 0", "momentum": "in [0, 1)",
    "weight_decay": ">= 0", "warmup_epochs": ">= 0", "step_epochs": "> 0", "gamma": "in (0, 1]",
    "clip_norm": ">= 0", "ranks_per_node": ">= 1", "stop_after": ">= 1", "keep_checkpoints": ">= 1",
    "b1": "in [0, 1]", "b2": "in [0, 1]", "threads": ">= 1",
    "straggler_threshold": "> 0", "policy_window": ">= 1", "max_staleness": ">= 1",
    "target_accuracy": "in [0, 1]", "stall_timeout": ">= 0",
    # --- issue 21 (branch train) settings ---
    "bucket_cap_mb": "> 0",
}


def _within(value, rule: str) -> bool:
    """Whether ``value`` satisfies ``rule`` (">= 0", "> 0", "in [0, 1)", ...); False for NaN/inf."""
    if not math.isfinite(value):
        return False
    if rule.startswith("in "):
        lo_closed, hi_closed = rule[3] == "[", rule[-1] == "]"
        lo, hi = (float(v) for v in rule[4:-1].split(","))
        return (value >= lo if lo_closed else value > lo) and (value <= hi if hi_closed else value < hi)
    op, bound = rule.split()
    return value >= float(bound) if op == ">=" else value > float(bound)


@dataclass
class TrainConfig:
    """One training run's settings (seconds for times, bytes for sizes, samples for batches).

    Field names are the CLI's flag names with ``_`` for ``-``; ``python -m hxmpi.train --help``
    and the README describe each of them.
    """
    # model
    model: str = "mlp"
    hidden: list = field(default_factory=lambda: [64])
    experts: Optional[int] = None
    capacity_factor: float = 1.25
    # data and staging
    dataset: str = "digits"
    staging: str = "auto"
    capacity_threshold: Optional[int] = None
    cache_dir: Optional[str] = None
    cache_limit: Optional[int] = None
    prefetch_shards: int = 2
    pretrain_time: Optional[float] = None
    retries: int = 3
    timeout: float = 30.0
    fetch_workers: int = 8
    # optimisation
    epochs: int = 20
    batch_size: int = 64
    lr: float = 0.1
    momentum: float = 0.9
    weight_decay: float = 1e-4
    schedule: str = "cosine"
    warmup_epochs: float = 1.0
    step_epochs: float = 10.0
    gamma: float = 0.1
    clip_norm: float = 0.0
    seed: int = 0
    shuffle: str = "hier"
    ranks_per_node: Optional[int] = None
    # run control
    log: Optional[str] = None
    checkpoint: Optional[str] = None
    resume: bool = False
    stop_after: Optional[int] = None
    keep_checkpoints: int = 2
    # update policy
    update: str = "auto"
    b1: float = 0.3
    b2: float = 0.7
    straggler_threshold: Optional[float] = None  # None: auto
    policy_window: int = 20
    max_staleness: int = 4
    target_accuracy: Optional[float] = None
    straggle: Straggle = field(default_factory=Straggle)
    stall_timeout: float = 0.0
    stall_abort: bool = False
    fail_at: Optional[tuple] = None  # (rank, global step)
    quiet: bool = False
    # performance
    threads: Optional[int] = None  # BLAS/OpenMP threads per rank; None: the host's cores / its ranks
    dtype: str = "float32"  # parameters, gradients and data: float32 or float64
    balance: str = "off"  # sync: split batches by rank speed: on | off | auto (when the rule finds stragglers)
    # --- issue 21 (branch train) settings ---
    bucket_cap_mb: float = 25.0  # MiB of dense gradient per Iallreduce bucket, posted during the backward pass

    @classmethod
    def from_namespace(cls, ns) -> "TrainConfig":
        """From an ``argparse.Namespace`` (or any object) with one attribute per field."""
        return cls(**{f.name: getattr(ns, f.name) for f in fields(cls)})

    def check(self) -> None:
        """Raise SettingError on a bad value or combination that needs no communicator."""
        for name, rule in RANGES.items():
            value = getattr(self, name)
            if value is not None and not _within(value, rule):
                raise SettingError(name, f"must {'lie' if rule.startswith('in ') else 'be'} {rule}, got {value}")
        if self.b1 > self.b2:
            raise SettingError("b1", f"{self.b1} is above b2 ({self.b2}): the async band must lie below the "
                                     f"scaling one")
        if self.target_accuracy is not None and not 0.0 <= self.target_accuracy <= 1.0:
            raise SettingError("target_accuracy", f"must lie in [0, 1], got {self.target_accuracy}")
        if self.pretrain_time is not None:
            if self.target_accuracy is None or self.pretrain_time <= 0:
                raise SettingError("pretrain_time", "needs a positive number of seconds and a target accuracy")
            if self.resume:
                raise SettingError("pretrain_time", "cannot be combined with resume")
        if self.resume and not self.checkpoint:
            raise SettingError("resume", "needs a checkpoint directory")

    def staging_config(self, **changes) -> StagingConfig:
        """The staging settings (``changes`` override fields of the result)."""
        cfg = StagingConfig(self.staging, self.capacity_threshold, self.cache_dir, self.cache_limit,
                            self.prefetch_shards, self.retries, self.timeout, self.fetch_workers,
                            progress=not self.quiet)
        return StagingConfig(**{**cfg.__dict__, **changes})

    def update_config(self) -> UpdateConfig:
        """The update-policy settings."""
        return UpdateConfig(self.update, self.b1, self.b2, self.straggler_threshold, self.policy_window,
                            self.max_staleness, self.straggle, self.balance, self.batch_size,
                            self.bucket_cap_mb)
