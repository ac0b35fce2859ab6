"""``mpirun -np N python -m hxmpi.train``: data-parallel SGD over MPI on numpy models.

Every epoch the training samples are reshuffled globally across ranks with ``HierComm.alltoallv``;
dense gradients are averaged in buckets posted during the backward pass (``--bucket-cap-mb``); MoE
experts are sharded over ranks and fed their tokens through the same hierarchical exchange. Rank 0 logs; every rank computes. The
method (exchange, staging, update policy) is described in docs/method.md.
"""
from __future__ import annotations

import argparse
import json
import sys

from mpi4py import MPI

from .. import __version__
from ..cli import abort_job, report, settle_failure
from ..errors import HxmpiError, SettingError
from ..schema import SETTINGS, flag
from .run_config import TrainConfig
from .trainer import Trainer

__all__ = ["Trainer", "TrainConfig", "UsageError", "build_parser", "flag", "parse_config", "main", "flags_markdown"]


PROG = "python -m hxmpi.train"


class UsageError(HxmpiError):
    """A bad flag or value: reported once by rank 0, exit code 2."""


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # raise instead of printing on every rank
        raise UsageError(message)


def build_parser() -> argparse.ArgumentParser:
    """The CLI: one flag per setting of ``hxmpi.schema.SETTINGS`` (its help is the schema's), and --version.

    Flags are parsed here, not checked: ``TrainConfig`` checks every value when it is built.
    """
    p = _Parser(prog=PROG, description=__doc__, formatter_class=_HelpFormatter)
    for s in SETTINGS.values():
        if s.kind is bool:
            p.add_argument(s.flag, action="store_true", help=_escaped(s.help))
            continue
        shown = ([s.rule] if s.rule else []) + [f"default: {s.shown_default()}"]
        p.add_argument(s.flag, type=_parser_of(s), default=s.make_default(), metavar=s.shown_metavar(),
                       help=_escaped(f"{s.help} ({'; '.join(shown)})"))
    p.add_argument("--version", action="version", version=f"hxmpi {__version__}")
    return p


def flags_markdown() -> str:
    """The Markdown table of every flag, from the schema: the docs build renders it into the training
    guide (docs/_ext/hxmpi_docs.py), and tests/test_docs.py checks it lists exactly the flags of --help."""
    rows = [("flag", "default", "range", "meaning"), ("---", "---", "---", "---")]
    for s in SETTINGS.values():
        shown = f"{s.flag} {s.shown_metavar()}" if s.shown_metavar() else s.flag
        rows.append((f"`{shown}`", s.shown_default(), s.rule or "", s.help))
    rows += [("`--version`", "", "", "print hxmpi's version and exit"),
             ("`-h`, `--help`", "", "", "print every flag with its default and exit")]
    return "\n".join("| " + " | ".join(cell.replace("|", "\\|") for cell in row) + " |" for row in rows)


def _escaped(text: str) -> str:
    return text.replace("%", "%%")  # argparse %-formats help texts


def _parser_of(s):
    """The text -> value function of setting ``s`` for argparse (its message kept on a bad text)."""
    if s.parse is None:
        return s.kind

    def parse(text: str):
        try:
            return s.parse(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None
    parse.__name__ = s.name
    return parse


class _HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Keeps the description's paragraphs."""


def parse_config(argv=None) -> TrainConfig:
    """A TrainConfig from command-line flags (raises UsageError on a bad flag)."""
    return TrainConfig.from_namespace(build_parser().parse_args(argv))  # checked as it is built


def _error_line(comm, exc: BaseException) -> None:
    if comm.rank == 0:
        text = f"{flag(exc.setting)} {exc.detail}" if isinstance(exc, SettingError) else str(exc)
        print(f"{PROG}: error: {text}", file=sys.stderr, flush=True)



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
