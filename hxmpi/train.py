"""``mpirun -np N python -m hxmpi.train``: data-parallel SGD over MPI on numpy models.

Every epoch the training samples are reshuffled globally across ranks with ``HierComm.alltoallv``;
dense gradients are averaged with one Allreduce per step; MoE experts are sharded over ranks and
fed their tokens through the same hierarchical exchange. Rank 0 logs; every rank computes. The
method (exchange, staging, update policy) is described in docs/method.md.
"""
from __future__ import annotations

import argparse
import json
import sys
from typing import Optional

from mpi4py import MPI

from . import __version__
from .cli import abort_job, report, settle_failure
from .config import TrainConfig
from .data import DATASETS
from .data.shuffle import SHUFFLES
from .data.staging import STAGING_MODES, parse_bytes
from .errors import HxmpiError, SettingError
from .models import MODELS
from .optim import SCHEDULES
from .trainer import DTYPES, Trainer
from .updates import BALANCE_MODES, Straggle

__all__ = ["Trainer", "TrainConfig", "UsageError", "build_parser", "parse_config", "main"]


class UsageError(HxmpiError):
    """A bad flag or value: reported once by rank 0, exit code 2."""


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # raise instead of printing on every rank
        raise UsageError(message)


def build_parser() -> argparse.ArgumentParser:
    """The CLI; every flag is documented here and in the README."""
    p = _Parser(prog="python -m hxmpi.train", description=__doc__, formatter_class=_HelpFormatter)
    p.add_argument("--model", choices=MODELS, default="mlp", help="numpy model to train")
    p.add_argument("--hidden", type=_int_list, default="64",
                   help="hidden layer sizes, comma-separated (MLP; MoE uses the first)")
    p.add_argument("--experts", type=int, default=None,
                   help="MoE experts in total, a multiple of the rank count (default: the smallest "
                        "multiple of the rank count >= 4)")
    p.add_argument("--capacity-factor", type=float, default=1.25,
                   help="MoE expert capacity as a multiple of the even share of tokens")
    p.add_argument("--dataset", default="digits",
                   help=f"bundled dataset ({', '.join(DATASETS)}) or a store directory / URL (see python -m hxmpi.data)")
    p.add_argument("--staging", choices=STAGING_MODES, default="auto",
                   help="store staging: memory (one shared copy per node), distributed (shards spread over "
                        "nodes, staged ahead of training), or by capacity (auto)")
    p.add_argument("--capacity-threshold", type=_size, default=None,
                   help="train bytes (suffixes K, M, G) below which a store is staged in memory "
                        "(default: 1/4 of available memory)")
    p.add_argument("--cache-dir", default=None, help="node-local staging directory (default: $TMPDIR/hxmpi-cache-JOB)")
    p.add_argument("--cache-limit", type=_size, default=None,
                   help="distributed mode: bytes of local storage per node (suffixes K, M, G); evicts the "
                        "shard used furthest in the future (default: the node's shards, at most 90%% of "
                        "the free disk)")
    p.add_argument("--prefetch-shards", type=_non_negative_int, default=2,
                   help="distributed mode: shards staged ahead of the one being trained on")
    p.add_argument("--pretrain-time", type=float, default=None, metavar="SECONDS",
                   help="memory mode: after this much training, evaluate; below --target-accuracy switch "
                        "to distributed staging (re-reading the store's index) and keep training the "
                        "model, else stop")
    p.add_argument("--retries", type=_non_negative_int, default=3, help="download retries per file (exponential backoff)")
    p.add_argument("--timeout", type=float, default=30.0, help="seconds per download request")
    p.add_argument("--fetch-workers", type=_positive_int, default=8, help="parallel downloads per node")
    p.add_argument("--epochs", type=_positive_int, default=20, help="training epochs")
    p.add_argument("--batch-size", type=_positive_int, default=64, help="global batch size (samples)")
    p.add_argument("--lr", type=float, default=0.1, help="base learning rate")
    p.add_argument("--momentum", type=float, default=0.9, help="SGD momentum")
    p.add_argument("--weight-decay", type=float, default=1e-4, help="L2 weight decay")
    p.add_argument("--schedule", choices=SCHEDULES, default="cosine", help="learning-rate schedule")
    p.add_argument("--warmup-epochs", type=float, default=1.0, help="linear warm-up length in epochs")
    p.add_argument("--step-epochs", type=float, default=10.0,
                   help="'step' schedule: multiply the rate by --gamma every this many epochs")
    p.add_argument("--gamma", type=float, default=0.1, help="'step' schedule decay factor")
    p.add_argument("--clip-norm", type=float, default=0.0, help="clip the global gradient L2 norm (0: off)")
    p.add_argument("--seed", type=int, default=0, help="seed of the split, the model and every shuffle")
    p.add_argument("--shuffle", choices=SHUFFLES, default="hier",
                   help="per-epoch global shuffle exchange (none: each rank keeps its shard)")
    p.add_argument("--ranks-per-node", type=_positive_int, default=None,
                   help="virtual nodes of this many consecutive ranks (default: real nodes, or env "
                        "HXMPI_RANKS_PER_NODE)")
    p.add_argument("--log", default=None, help="JSONL file: one record per epoch and a final summary")
    p.add_argument("--checkpoint", default=None,
                   help="directory for a checkpoint after every epoch (checked writable before training)")
    p.add_argument("--resume", action="store_true",
                   help="continue from the newest complete checkpoint in --checkpoint (logged)")
    p.add_argument("--keep-checkpoints", type=_positive_int, default=2,
                   help="checkpoints kept in --checkpoint (one directory per epoch; older ones are deleted)")
    p.add_argument("--stop-after", type=_positive_int, default=None,
                   help="stop after this many epochs of this run (for time-limited jobs; continue "
                        "later with --resume)")
    p.add_argument("--update", choices=("auto", "sync", "async"), default="auto",
                   help="update mode; auto applies the straggler rule every --policy-window steps")
    p.add_argument("--b1", type=float, default=0.3, help="straggler fraction up to which auto goes async")
    p.add_argument("--b2", type=float, default=0.7,
                   help="straggler fraction above which gradients are scaled by 1 - (B - b2)")
    p.add_argument("--straggler-threshold", type=_threshold, default=None,
                   help="step time (seconds) above which a rank straggles, or auto: 2x the lower median "
                        "(default: auto)")
    p.add_argument("--policy-window", type=_positive_int, default=20, help="steps between policy decisions")
    p.add_argument("--max-staleness", type=_positive_int, default=4,
                   help="async: local steps a rank may take per round before it waits for the average")
    p.add_argument("--target-accuracy", type=float, default=None,
                   help="adjust the step size after each epoch from the accuracy gap (the gradient "
                        "coefficient of docs/method.md)")
    p.add_argument("--straggle", type=_straggle, default=Straggle(), metavar="RANKS:SECONDS|RANKS:xF",
                   help="testing aid: ranks (comma-separated) that sleep SECONDS per step, or whose compute "
                        "time is multiplied by F (default: none)")
    p.add_argument("--stall-timeout", type=float, default=0.0,
                   help="seconds a rank may wait in any collective of the run before the ranks missing "
                        "from it are named (a 'stall' record from rank 0; 0: off)")
    p.add_argument("--stall-abort", action="store_true",
                   help="abort the job when a stall is detected (every rank that sees it aborts)")
    p.add_argument("--fail-at", type=_fail_at, default=None, metavar="RANK:STEP",
                   help="testing aid: raise an error on RANK at global step STEP")
    p.add_argument("--balance", choices=BALANCE_MODES, default="off",
                   help="sync mode: split each global batch over the ranks in proportion to their measured "
                        "speed (the gradient stays the global mean); auto: when the policy finds stragglers "
                        "and stays sync. Off by default: the split then depends on timings, so runs are not "
                        "bit-reproducible")
    p.add_argument("--threads", type=_positive_int, default=None,
                   help="BLAS/OpenMP threads per rank (default: the host's usable cores divided by its ranks, "
                        "at least 1)")
    p.add_argument("--dtype", choices=DTYPES, default="float32",
                   help="floating-point type of parameters, gradients and data")
    # --- issue 21 (branch train) flags ---
    p.add_argument("--bucket-cap-mb", type=float, default=25.0,
                   help="sync mode: MiB of dense gradient per reduction bucket; buckets are formed in reverse "
                        "layer order and each Iallreduce starts as soon as its layers' backward is done "
                        "(DDP's bucket_cap_mb)")
    p.add_argument("--quiet", action="store_true", help="no progress output")
    p.add_argument("--version", action="version", version=f"hxmpi {__version__}")
    return p


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def _non_negative_int(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {value}")
    return value


def _size(text: str) -> int:
    try:
        return parse_bytes(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _int_list(text: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"expected positive sizes, got {text!r}")
    return values


def _threshold(text: str) -> Optional[float]:
    if text == "auto":
        return None
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expects seconds or 'auto', got {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be > 0 seconds, got {value}")
    return value


def _fail_at(text: str) -> tuple[int, int]:
    try:
        rank, step = (int(v) for v in text.split(":"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expects RANK:STEP, got {text!r}") from None
    return rank, step


def _straggle(text: str) -> Straggle:
    """``"1,3:0.02"``: ranks 1 and 3 sleep 0.02 s per step; ``"3:x3"``: rank 3 computes 3x slower."""
    usage = f"expects RANKS:SECONDS (e.g. 3:0.02) or RANKS:xF (e.g. 3:x3), got {text!r}"
    try:
        ranks, amount = text.split(":")
        parsed = tuple(int(r) for r in ranks.split(",") if r.strip())
        factor = amount.strip().lower().startswith("x")
        value = float(amount.strip()[1:] if factor else amount)
    except ValueError:
        raise argparse.ArgumentTypeError(usage) from None
    if not parsed or min(parsed) < 0 or value < (1.0 if factor else 0.0):
        raise argparse.ArgumentTypeError(f"needs ranks >= 0 and a delay >= 0 or a factor >= 1; {usage}")
    return Straggle(parsed, 0.0, value) if factor else Straggle(parsed, value)


class _HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Appends ``(default: X)`` unless the help text names its default already or there is none."""

    def _get_help_string(self, action):
        text = action.help or ""
        if "default" in text or action.default is None or action.default is False \
                or action.default is argparse.SUPPRESS:
            return text
        return super()._get_help_string(action)


def flag(setting: str) -> str:
    """The command-line flag of a TrainConfig setting."""
    return "--" + setting.replace("_", "-")


def parse_config(argv=None) -> TrainConfig:
    """A TrainConfig from command-line flags (raises UsageError on a bad flag)."""
    cfg = TrainConfig.from_namespace(build_parser().parse_args(argv))
    cfg.check()  # every numeric range and combination, before any communication
    return cfg


def _error_line(comm, exc: BaseException) -> None:
    if comm.rank == 0:
        text = f"{flag(exc.setting)} {exc.detail}" if isinstance(exc, SettingError) else str(exc)
        print(f"{PROG}: error: {text}", file=sys.stderr, flush=True)


PROG = "python -m hxmpi.train"


def main(argv=None) -> int:
    """Entry point: parse flags, train, print the summary; returns the exit code.

    A failure on one rank never leaves the others waiting (rule of ``hxmpi.cli``): a set-up error
    that every rank meets (a bad flag, or one agreed collectively) prints one line from rank 0 and
    exits 2; one that some rank does not meet aborts the job after printing it. A failure while
    training aborts the job, unless every rank raised it (an agreed error): then exit 1.
    """
    comm = MPI.COMM_WORLD
    errcomm = comm.Dup()  # kept for settling set-up errors only
    try:
        cfg = parse_config(argv)
        trainer = Trainer(cfg, comm)
        if cfg.resume:
            trainer.load_checkpoint()
    except SystemExit as exc:  # --help / --version
        return int(exc.code or 0)
    except Exception as exc:  # noqa: BLE001 - any set-up failure: agreed, or the job aborts
        if getattr(exc, "agreed", False) or settle_failure(errcomm):
            _error_line(comm, exc)
            return 2
        report(PROG, exc)
        abort_job(2)
    try:
        summary = trainer.run()
    except Exception as exc:  # noqa: BLE001 - any failure must end every rank, not hang them
        if getattr(exc, "agreed", False):
            _error_line(comm, exc)
            return 1
        report(PROG, exc)
        abort_job(1)
    if comm.rank == 0 and not cfg.quiet:
        print(json.dumps(summary), flush=True)
    return 0


if __name__ == "__main__":
    from .cli import run_main  # an uncaught error on one rank ends the job
    run_main(main, "python -m hxmpi.train")
