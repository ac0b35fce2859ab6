"""The settings schema: every setting of a training run, defined once (name, type, range, default, help).

Everything else is generated from ``SETTINGS``: ``hxmpi.train.run_config.TrainConfig``'s fields, the flags of
``python -m hxmpi.train`` (``--batch-size`` for ``batch_size``), its ``--help`` and the docs'
flag table (``hxmpi.train.command.flags_markdown``, rendered into docs/reference/cli.md at build time). Sub-configs (``StagingConfig``, ``UpdateConfig``) name their
fields after the settings they hold and take their defaults from here.

``check`` is the one place a value's type, range or choice is checked: ``TrainConfig`` and every
sub-config call it when they are built, so a bad value raises ``SettingError`` naming the setting
(never a flag; the CLI prints the flag) whether it came from the command line or from code.

Adding a setting is one entry below (and a field in the sub-config that uses it, if any). This
module sits below every other (it imports only ``errors``): a setting's choices are listed here,
once, and the modules that act on them (``hxmpi.models.MODELS``, ``hxmpi.train.optim.SCHEDULES``, ...)
read them from ``SETTINGS``.
"""
from __future__ import annotations

import math
import numbers
import os
import re
from dataclasses import dataclass, fields
from typing import Any, Callable, Optional

from .errors import SettingError

__all__ = ["Setting", "SETTINGS", "Straggle", "check", "check_fields", "default", "flag", "parse_bytes"]


@dataclass(frozen=True)
class Setting:
    """One setting. ``kind`` is its Python type (int, float, str, bool, list, tuple or object);
    ``rule`` its range (">= 0", "> 0", "in [0, 1)"); ``choices`` its allowed values (a tuple: the one
    list of them, which the modules that act on the value read from here); ``parse`` turns a flag's text into a value (default: ``kind``);
    ``default_text`` describes a default that is worked out at run time (shown where it is None)."""
    name: str
    kind: type
    default: Any
    help: str
    rule: Optional[str] = None
    choices: Any = None
    parse: Optional[Callable[[str], Any]] = None
    metavar: Optional[str] = None
    default_text: Optional[str] = None
    factory: Optional[Callable[[], Any]] = None  # for defaults that are objects (made per config)

    @property
    def flag(self) -> str:
        """The command-line flag of this setting."""
        return flag(self.name)

    def shown_metavar(self) -> Optional[str]:
        """The flag's value as the help and the docs' flag table show it (None for an on/off flag)."""
        if self.kind is bool:
            return None
        allowed = self.allowed()
        if self.metavar or allowed:
            return self.metavar or "|".join(allowed)
        return {int: "N", float: "X"}.get(self.kind, "TEXT")

    def allowed(self) -> Optional[tuple]:
        """The allowed values (None: any value of the kind within the rule)."""
        return self.choices

    def make_default(self):
        """The default value (a fresh object for settings with a factory)."""
        if self.factory is not None:
            return self.factory()
        return list(self.default) if isinstance(self.default, list) else self.default

    def shown_default(self) -> str:
        """The default as the help and the docs' flag table show it."""
        if self.default_text is not None:
            return self.default_text
        if self.kind is bool:
            return "off"
        if isinstance(self.default, list):
            return ",".join(str(v) for v in self.default)
        return str(self.default)


def flag(setting: str) -> str:
    """The command-line flag of a setting (``batch_size`` -> ``--batch-size``)."""
    return "--" + setting.replace("_", "-")


def parse_bytes(text: str) -> int:
    """``"512M"``, ``"1.5GiB"``, ``"1000"`` -> bytes (binary suffixes K, M, G, T)."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(?:i?b)?\s*", str(text), re.IGNORECASE)
    if not m:
        raise ValueError(f"expected a size like 1000, 64M or 2G, got {text!r}")
    return int(float(m.group(1)) * 1024 ** " kmgt".index(m.group(2).lower() or " "))


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


def _rule_text(rule: str) -> str:
    return f"{'lie' if rule.startswith('in ') else 'be'} {rule}"


def check(name: str, value) -> None:
    """Raise SettingError unless ``value`` is of setting ``name``'s type, within its range and
    among its choices (None passes where the default is None)."""
    s = SETTINGS[name]
    if value is None and s.default is None:
        return
    if s.kind is int and not (isinstance(value, numbers.Integral) and not isinstance(value, bool)):
        raise SettingError(name, f"must be an integer, got {value!r}")
    if s.kind is float and not (isinstance(value, numbers.Real) and not isinstance(value, bool)):
        raise SettingError(name, f"must be a number, got {value!r}")
    if s.kind in (str, bool, list, tuple) and not isinstance(value, s.kind) \
            and not (s.kind is str and isinstance(value, os.PathLike)):
        raise SettingError(name, f"must be a {s.kind.__name__}, got {value!r}")
    allowed = s.allowed()
    if allowed is not None and value not in allowed:
        raise SettingError(name, f"must be one of {', '.join(map(str, allowed))}, got {value!r}")
    if s.rule is not None:
        items = value if s.kind in (list, tuple) else [value]
        if (s.kind is list and not items) or not all(_within(v, s.rule) for v in items):
            detail = f"must be non-empty, with every value {s.rule}" if s.kind in (list, tuple) \
                else f"must {_rule_text(s.rule)}"
            raise SettingError(name, f"{detail}, got {value}")


def check_fields(config) -> None:
    """``check`` every field of a dataclass that is named after a setting (call in __post_init__)."""
    for f in fields(config):
        if f.name in SETTINGS:
            check(f.name, getattr(config, f.name))


def default(name: str):
    """Setting ``name``'s default, for sub-config fields (objects: use ``dataclasses.field``
    with ``default_factory=SETTINGS[name].make_default``)."""
    return SETTINGS[name].default


# ----------------------------------------------------------------------------- flag text parsers
def _int_list(text: str) -> list:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise ValueError(f"expected comma-separated integers, got {text!r}") from None
    return values


def _threshold(text: str) -> Optional[float]:
    if text == "auto":
        return None
    try:
        return float(text)
    except ValueError:
        raise ValueError(f"expects seconds or 'auto', got {text!r}") from None


def _fail_at(text: str) -> tuple:
    try:
        rank, step = (int(v) for v in text.split(":"))
    except ValueError:
        raise ValueError(f"expects RANK:STEP, got {text!r}") from None
    return rank, step


@dataclass(frozen=True)
class Straggle:
    """Injected straggling (testing, benchmarks): ``ranks`` sleep ``delay_s`` seconds per step and
    stretch their compute time by ``factor`` (1: as measured), until the fraction ``until`` of the
    schedule's steps (1: the whole run)."""
    ranks: tuple = ()
    delay_s: float = 0.0
    factor: float = 1.0
    until: float = 1.0

    def slows(self, rank: int) -> bool:
        """Whether ``rank`` is slowed at all."""
        return rank in self.ranks and (self.delay_s > 0 or self.factor != 1.0)


def _straggle(text: str) -> Straggle:
    """``"1,3:0.02"``: ranks 1 and 3 sleep 0.02 s per step; ``"3:x3"``: rank 3 computes 3x slower;
    ``"3:x3:0.5"``: ... for the first half of the schedule's steps only."""
    usage = (f"expects RANKS:SECONDS (e.g. 3:0.02) or RANKS:xF (e.g. 3:x3), optionally :UNTIL "
             f"(e.g. 3:x3:0.5), got {text!r}")
    try:
        ranks, amount, *rest = text.split(":")
        parsed = tuple(int(r) for r in ranks.split(",") if r.strip())
        factor = amount.strip().lower().startswith("x")
        value = float(amount.strip()[1:] if factor else amount)
        until = float(rest[0]) if rest else 1.0
        if len(rest) > 1:
            raise ValueError
    except ValueError:
        raise ValueError(usage) from None
    if not parsed or min(parsed) < 0 or value < (1.0 if factor else 0.0):
        raise ValueError(f"needs ranks >= 0 and a delay >= 0 or a factor >= 1; {usage}")
    if not 0.0 < until <= 1.0:
        raise ValueError(f"UNTIL is a fraction of the schedule's steps in (0, 1]; {usage}")
    return Straggle(parsed, 0.0, value, until) if factor else Straggle(parsed, value, 1.0, until)


def _no_straggle() -> Straggle:
    return Straggle()


# ----------------------------------------------------------------------------------- the schema
_S = Setting
SETTINGS: dict[str, Setting] = {s.name: s for s in (
    # model
    _S("model", str, "mlp", "numpy model", choices=("softmax", "mlp", "moe")),
    _S("hidden", list, [64], "hidden layer sizes, comma-separated (MLP); MoE uses the first", rule=">= 1",
       parse=_int_list, metavar="64[,32...]"),
    _S("experts", int, None, "MoE experts in total, a multiple of the rank count", rule=">= 1",
       default_text="smallest multiple of the rank count >= 4"),
    _S("capacity_factor", float, 1.25, "MoE expert capacity, as a multiple of the even share of a rank's tokens",
       rule="> 0", metavar="F"),
    # data and staging
    _S("dataset", str, "digits", "bundled dataset (UCI digits, 80/20 split by seed), or a store directory / URL "
       "(docs/staging.md)", metavar="NAME|DIR|URL"),
    _S("staging", str, "auto", "store staging mode; auto picks memory below --capacity-threshold, else distributed",
       choices=("auto", "memory", "distributed")),
    _S("capacity_threshold", int, None, "train bytes (suffixes K, M, G) below which a store goes to memory "
       "(rank 0's value is used)", rule=">= 0", parse=parse_bytes, metavar="BYTES", default_text="1/4 of available memory"),
    _S("cache_dir", str, None, "node-local staging directory (one nodeK folder per node); one live run per "
       "directory: a second run is refused (docs/reference/failures.md)", metavar="DIR",
       default_text="$TMPDIR/hxmpi-cache-JOB"),
    _S("cache_limit", int, None, "distributed mode: local storage for train shards per node (suffixes K, M, G; the "
       "small test split's files are not counted); evicts the shard whose next use is furthest away; below the "
       "largest shard is an error", rule=">= 0", parse=parse_bytes, metavar="BYTES",
       default_text="the node's shards, at most 90% of the free disk"),
    _S("prefetch_shards", int, 2, "distributed mode: shards staged ahead of the one being trained on", rule=">= 0",
       metavar="K"),
    _S("pretrain_time", float, None, "memory mode: after this many seconds of training evaluate; below "
       "--target-accuracy switch to distributed staging (re-reading the index) and keep training, else stop",
       rule="> 0", metavar="SECONDS", default_text="none"),
    _S("retries", int, 3, "download retries per file (exponential backoff)", rule=">= 0"),
    _S("timeout", float, 30.0, "seconds per download request", rule="> 0", metavar="SECONDS"),
    _S("fetch_workers", int, 8, "parallel downloads per node", rule=">= 1"),
    # optimisation
    _S("epochs", int, 20, "training epochs", rule=">= 1"),
    _S("batch_size", int, 64, "global batch size, in samples", rule=">= 1"),
    _S("lr", float, 0.1, "base learning rate", rule="> 0", metavar="X"),
    _S("momentum", float, 0.9, "SGD momentum", rule="in [0, 1)", metavar="X"),
    _S("weight_decay", float, 1e-4, "L2 weight decay", rule=">= 0", metavar="X"),
    _S("schedule", str, "cosine", "learning-rate schedule", choices=("constant", "step", "cosine")),
    _S("warmup_epochs", float, 1.0, "linear warm-up, in epochs", rule=">= 0", metavar="X"),
    _S("step_epochs", float, 10.0, "'step' schedule: multiply the rate by --gamma every this many epochs",
       rule="> 0", metavar="X"),
    _S("gamma", float, 0.1, "'step' schedule decay factor", rule="in (0, 1]", metavar="X"),
    _S("clip_norm", float, 0.0, "clip the global gradient L2 norm (0: off)", rule=">= 0", metavar="X"),
    _S("seed", int, 0, "seed of the split, the model and every shuffle"),
    _S("shuffle", str, "hier", "per-epoch global shuffle exchange; none keeps each rank's shard",
       choices=("hier", "flat", "none")),
    _S("ranks_per_node", int, None, "virtual nodes of this many consecutive ranks (also env HXMPI_RANKS_PER_NODE)",
       rule=">= 1", metavar="K", default_text="real nodes"),
    # run control
    _S("log", str, None, "JSONL file: one record per epoch, then a summary (docs/training.md, Summary)",
       metavar="FILE", default_text="none"),
    _S("checkpoint", str, None, "checkpoint after every epoch into DIR/epoch-NNNNNN/ (a shard per rank, then "
       "meta.json), committed by renaming DIR/LATEST; DIR is checked writable before training; one live run per directory: a "
       "second run is refused at start, naming the holder's pid (docs/reference/failures.md)", metavar="DIR",
       default_text="none"),
    _S("resume", bool, False, "continue from the newest complete checkpoint in --checkpoint (logged: which, and "
       "why), at the world size it was written with or any other: dense parameters and momentum are replicated, "
       "MoE experts re-sharded (--experts must divide by the new rank count), epoch, schedule step and policy "
       "state (mode, gradient scale and coefficient; balance weights at the same size only) carried; the final "
       "parameters equal an uninterrupted run's (tested 4 -> 2 -> 3 ranks, float64, sync, to 1e-6)"),
    _S("keep_checkpoints", int, 2, "complete checkpoints kept in --checkpoint (older epoch directories are "
       "deleted)", rule=">= 1", metavar="K"),
    _S("stop_after", int, None, "stop after this many epochs of this run (time-limited jobs), continue later "
       "with --resume", rule=">= 1", default_text="none"),
    # update policy
    _S("update", str, "auto", "update mode; auto: every --policy-window rounds the straggler rule proposes a "
       "mode, confirmed by hysteresis and kept only when it measures better (docs/method.md: *The policy "
       "controller*)",
       choices=("auto", "sync", "async")),
    _S("b1", float, 0.3, "straggler fraction up to which auto goes async (b1 <= b2)", rule="in [0, 1]",
       metavar="X"),
    _S("b2", float, 0.7, "straggler fraction above which gradients are scaled by 1 - (B - b2)", rule="in [0, 1]",
       metavar="X"),
    _S("straggler_threshold", float, None, "step time in seconds above which a rank straggles, or auto: 2x the "
       "lower median", rule="> 0", parse=_threshold, metavar="SECONDS|auto", default_text="auto"),
    _S("policy_window", int, 20, "rounds (sync steps or async rounds) between policy decisions", rule=">= 1",
       metavar="W"),
    _S("policy_hysteresis", int, 2, "auto: a change of mode needs its condition in this many windows in a row, "
       "so one noisy window changes nothing (docs/method.md: *The policy controller*)", rule=">= 1", metavar="H"),
    _S("policy_gain", float, 0.1, "auto: a mode tried beside a straggler is kept only when its samples/s beat "
       "the mode before by more than this fraction; otherwise the mode before returns", rule=">= 0",
       metavar="X"),
    _S("policy_explore", str, "all", "auto, with stragglers: all tries async, balanced sync and damped sync "
       "for a window each and keeps the best; rule tries only the straggler rule's mode",
       choices=("all", "rule")),
    _S("local_steps_until", float, 0.5, "async rounds (local steps) only until this fraction of the schedule's "
       "steps, synchronous after (post-local SGD: the last part of training averages every step)",
       rule="in [0, 1]", metavar="F"),
    _S("max_staleness", int, 4, "async: local steps a rank may take in one round before it waits for the "
       "average", rule=">= 1"),
    _S("target_accuracy", float, None, "the summary reports time_to_target_s and epoch_at_target; after each "
       "epoch the step size is scaled by the gradient coefficient (docs/method.md); with --pretrain-time, the "
       "switch criterion", rule="in [0, 1]", metavar="A", default_text="none"),
    _S("eval_every", int, 0, "also evaluate the test split every this many schedule steps within an epoch (0: only "
       "after each epoch), logged as evaluation records: time to target is read from every evaluation. While "
       "async rounds hold the ranks apart the ranks' mean model is evaluated, their own parameters kept; "
       "evaluation time is never training time", rule=">= 0", metavar="N"),
    _S("straggle", object, None, "testing aid: these ranks (comma-separated) sleep SECONDS per step, or take F "
       "times as long for their compute (they sleep the extra time); :UNTIL ends it after that fraction of the "
       "schedule's steps. A sleep emulates a slower rank only while every rank has a core of its own: on a host "
       "with fewer cores than ranks the sleeping rank frees a core for the others (docs/method.md)",
       parse=_straggle, metavar="RANKS:SECONDS|RANKS:xF[:UNTIL]", default_text="none", factory=_no_straggle),
    _S("balance", str, "off", "sync mode: split each global batch over the ranks so that their step times meet "
       "(a fixed cost per step plus a cost per sample per rank, fitted to the last two windows; docs/method.md: "
       "*Balancing that converges*), the gradient staying the global mean; auto: once the rule finds stragglers "
       "and stays sync. With off, forced sync stays even (runs are bit-reproducible), but --update auto may "
       "still pick balanced sync when it measures best",
       choices=("on", "off", "auto")),
    _S("bucket_cap_mb", float, 25.0, "sync mode: MiB of dense gradient per reduction bucket; buckets are formed in "
       "reverse layer order and each Iallreduce starts as soon as its layers' backward is done (DDP's "
       "bucket_cap_mb)", rule="> 0", metavar="MIB"),
    # performance
    _S("threads", int, None, "BLAS/OpenMP threads per rank, applied to every pool with threadpoolctl; shown in "
       "the summary and by python -m hxmpi", rule=">= 1", default_text="host's usable cores / its ranks, at least 1"),
    _S("dtype", str, "float32", "type of parameters, gradients and data", choices=("float32", "float64")),
    # failure handling and testing aids
    _S("stall_timeout", float, 0.0, "after this many seconds in any blocking collective of the run, name the "
       "ranks missing from it (a 'stall' record from rank 0; 0: off); docs/reference/failures.md", rule=">= 0",
       metavar="SECONDS"),
    _S("stall_abort", bool, False, "abort the job when a stall is detected (every rank that sees it aborts)"),
    _S("fail_at", tuple, None, "testing aid: raise an error on RANK at global step STEP", parse=_fail_at,
       metavar="RANK:STEP", default_text="none"),
    _S("quiet", bool, False, "no progress output"),
)}
del _S
