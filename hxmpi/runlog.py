"""What a run reports: its event records (kept, and appended to a JSONL file) and progress lines.

``Progress`` is the one progress display of hxmpi (the trainer's epoch bar, the staging download
line): a tqdm bar when the stream is a terminal and tqdm is installed (``pip install -e
'.[progress]'``), otherwise a plain line at most every ``every_s`` seconds, so logs of batch jobs
stay readable. ``RunLog`` collects a run's records; only rank 0 writes and shows them.
"""
from __future__ import annotations

import json
import sys
import time
from typing import Optional, TextIO

__all__ = ["Progress", "RunLog", "accuracy_points", "time_to_target", "time_to_target_interpolated", "epoch_text"]


class Progress:
    """Progress towards ``total`` (in ``unit``; ``"B"`` shows bytes in KiB/MiB/GiB)."""

    def __init__(self, total: float, desc: str, unit: str, enabled: bool = True, initial: float = 0,
                 every_s: float = 2.0, file: Optional[TextIO] = None):
        self.total, self.desc, self.unit, self.every_s = total, desc, unit, every_s
        self.n, self.postfix, self.enabled = initial, "", enabled
        self.file = file or sys.stderr
        self.bar = None
        self._shown = time.perf_counter()
        if enabled and self.file.isatty():
            try:
                from tqdm import tqdm
            except ImportError:
                pass
            else:
                scaled = unit == "B"
                self.bar = tqdm(total=total, initial=initial, desc=desc, unit=unit, file=self.file,
                                unit_scale=scaled, unit_divisor=1024 if scaled else 1000)

    def update(self, n: float = 1, postfix: str = "") -> None:
        """Advance by ``n`` units; ``postfix`` replaces the text shown after the count."""
        if not self.enabled:
            return
        self.n += n
        self.postfix = postfix or self.postfix
        if self.bar is not None:
            if postfix:
                self.bar.set_postfix_str(postfix, refresh=False)
            self.bar.update(n)
            return
        now = time.perf_counter()
        if now - self._shown >= self.every_s or self.n >= self.total:
            self._shown = now
            print(self.line(), file=self.file, flush=True)

    def line(self) -> str:
        """The plain progress line: ``desc count/total unit  postfix``."""
        if self.unit == "B":
            count = f"{self.n / 2**20:.1f}/{self.total / 2**20:.1f} MiB"
        else:
            count = f"{self.n:g}/{self.total:g} {self.unit}"
        return f"{self.desc} {count}" + (f"  {self.postfix}" if self.postfix else "")

    def close(self) -> None:
        """End the bar (no-op for plain lines)."""
        if self.bar is not None:
            self.bar.close()
            self.bar = None


class RunLog:
    """A run's records: every rank keeps them in ``events``; rank 0 appends them to ``path``
    (JSONL, one record per line; opened at the first record) and, unless quiet, shows one
    progress line per epoch."""

    def __init__(self, path: Optional[str], rank: int, quiet: bool):
        self.events: list[dict] = []
        self.path = path if rank == 0 else None
        self.show = not quiet and rank == 0
        self._file: Optional[TextIO] = None
        self._epochs: Optional[Progress] = None

    def emit(self, record: dict) -> None:
        """Keep ``record`` and append it to the JSONL file."""
        self.events.append(record)
        if self.path is not None:
            if self._file is None:
                self._file = open(self.path, "a")
            self._file.write(json.dumps(record) + "\n")
            self._file.flush()

    def start_epochs(self, total: int, done: int) -> None:
        """Open the epoch bar at ``done`` of ``total`` epochs."""
        self._epochs = Progress(total, "train", "epoch", enabled=self.show, initial=done, every_s=0.0,
                                file=sys.stdout)

    def epoch(self, record: dict) -> None:
        """Log an ``"epoch"`` record and advance the bar with its figures."""
        self.emit(record)
        if self._epochs is not None:
            self._epochs.update(1, epoch_text(record))

    def close(self, summary: Optional[dict] = None) -> None:
        """Close the bar, log ``summary`` (if given) and close the file."""
        if self._epochs is not None:
            self._epochs.close()
            self._epochs = None
        if summary is not None:
            self.emit(summary)
        if self._file is not None:
            self._file.close()
            self._file = None


def accuracy_points(records: list[dict]) -> list[tuple[float, float, int]]:
    """(training seconds, test accuracy, epoch) at every evaluation in ``records``, in order:
    each ``"epoch"`` record (its ``train_time_s`` summed, evaluation excluded) and each
    ``"evaluation"`` record within an epoch (``--eval-every``: ``epoch_train_s`` seconds into its
    epoch). Records without an ``event`` key count as epoch records; other events are skipped."""
    done, points = 0.0, []
    for r in records:
        kind = r.get("event", "epoch")
        if kind == "evaluation":
            points.append((done + r["epoch_train_s"], r["test_accuracy"], r["epoch"]))
        elif kind == "epoch":
            done += r["train_time_s"]
            points.append((done, r["test_accuracy"], r["epoch"]))
    return points


def time_to_target(records: list[dict], target: float) -> tuple[Optional[float], Optional[int]]:
    """(training seconds, epoch) at the first evaluation (``accuracy_points``) whose test accuracy
    is at least ``target``; (None, None) if none reaches it."""
    for elapsed, acc, epoch in accuracy_points(records):
        if acc >= target:
            return elapsed, epoch
    return None, None


def time_to_target_interpolated(records: list[dict], target: float) -> Optional[float]:
    """Training seconds at which the test accuracy reached ``target``, read between evaluations
    (``accuracy_points``: every epoch's, and with ``--eval-every`` those within epochs): the line
    between the last evaluation below it and the first at or above it, so a run is not charged
    the whole gap for crossing the target early in it. Reached at the first evaluation: that
    evaluation's time (no point before it). None if no evaluation reaches it."""
    before = None
    for elapsed, acc, _ in accuracy_points(records):
        if acc >= target:
            if before is None or acc <= before[1]:
                return elapsed
            t0, a0 = before
            return t0 + (target - a0) / (acc - a0) * (elapsed - t0)
        before = (elapsed, acc)
    return None


def epoch_text(r: dict) -> str:
    """An epoch record's figures, for the line after the epoch count."""
    text = (f"loss {r['train_loss']:.4f}  train_acc {r['train_accuracy']:.4f}  "
            f"test_acc {r['test_accuracy']:.4f}  lr {r['lr']:.4g}  "
            f"{r['samples'] / max(r['train_time_s'], 1e-9):.0f} samples/s")
    st = r.get("staging")
    if st:
        text += (f"  staged {st['shards_staged']} shards {st['bytes_staged'] / 2**20:.1f} MiB  "
                 f"hits {st['cache_hits']}  evicted {st['evictions']}  "
                 f"wait {st['data_wait_s']:.2f} s ({100 * r['data_wait_fraction']:.1f}%)")
    return text
