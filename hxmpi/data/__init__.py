"""Datasets and the per-epoch global shuffle.

The bundled default is the UCI handwritten digits set (1,797 samples of 8x8 pixels, 10 classes),
shipped in ``digits.npz`` with its attribution in ``DIGITS_LICENSE.txt``; it needs no download.
"""
from __future__ import annotations

import shutil
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Optional

import numpy as np

__all__ = ["Dataset", "load_digits", "split", "load_dataset"]

DATASETS = ("digits",)


@dataclass
class Dataset:
    """A classification set split into train and test parts (labels int64).

    A distributed-mode store has no ``X_train``/``y_train`` in memory: ``train_stream`` delivers
    the train split window by window instead (see ``data.staging``).
    """
    name: str
    X_train: Optional[np.ndarray]
    y_train: Optional[np.ndarray]
    X_test: np.ndarray
    y_test: np.ndarray
    n_classes: int
    n_features: int = 0  # features per sample; 0: from X_test
    train_stream: Optional[object] = None
    train_samples: int = 0  # 0: len(y_train)
    shared: Optional[object] = field(default=None, repr=False)  # the node window the arrays live in
    scratch: Optional[Path] = None  # a per-job cache directory to remove on close()
    lock: Optional[object] = field(default=None, repr=False)  # the held cache directory (data.lock)

    def __post_init__(self):
        self.n_features = self.n_features or int(np.prod(self.X_test.shape[1:]))
        self.train_samples = self.train_samples or (0 if self.y_train is None else len(self.y_train))

    def close(self) -> None:
        """Stop background staging and free the node's shared window (collective in store mode)."""
        if self.train_stream is not None:
            self.train_stream.close()
        if self.shared is not None:
            self.X_train = self.y_train = self.X_test = self.y_test = None
            self.shared.free()
            self.shared = None
        if self.scratch is not None:  # a per-job default cache directory: nothing in it outlives the job
            shutil.rmtree(self.scratch, ignore_errors=True)
            try:
                self.scratch.parent.rmdir()  # only if no other node's folder is left in it
            except OSError:
                pass
            self.scratch = None
        if self.lock is not None:  # after the directory is gone: no other run can meet it half-removed
            self.lock.release()
            self.lock = None


def load_digits() -> tuple[np.ndarray, np.ndarray]:
    """The bundled digits: X (1797, 64) float64 scaled to [0, 1], y (1797,) int64."""
    with resources.files(__package__).joinpath("digits.npz").open("rb") as fh:
        data = np.load(fh)
        return data["images"].astype(np.float64) / 16.0, data["target"].astype(np.int64)


def split(X: np.ndarray, y: np.ndarray, test_fraction: float, seed: int):
    """A fixed train/test split by seed: (X_train, y_train, X_test, y_test)."""
    order = np.random.default_rng(seed).permutation(X.shape[0])
    n_test = int(round(test_fraction * X.shape[0]))
    test, train = order[:n_test], order[n_test:]
    return X[train], y[train], X[test], y[test]


def load_dataset(name: str, seed: int = 0, test_fraction: float = 0.2) -> Dataset:
    """Load a dataset by name, split 80/20 (by default) with ``seed``."""
    if name == "digits":
        X, y = load_digits()
        return Dataset(name, *split(X, y, test_fraction, seed), n_classes=10)
    raise ValueError(f"unknown dataset {name!r}; available: {', '.join(DATASETS)}")
