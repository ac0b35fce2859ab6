"""Serial checks of the run log: plain progress lines off a terminal, JSONL records, time to target."""
import io
import json

import pytest

from hxmpi.runlog import Progress, RunLog, accuracy_points, time_to_target, time_to_target_interpolated


def test_plain_progress_lines_off_a_terminal():
    out = io.StringIO()
    p = Progress(3 * 2**20, "staging", "B", every_s=0.0, file=out)
    p.update(2**20, "1/3 files, 0 from cache")
    p.update(2 * 2**20, "3/3 files, 1 from cache")
    p.close()
    assert out.getvalue().splitlines() == ["staging 1.0/3.0 MiB  1/3 files, 0 from cache",
                                           "staging 3.0/3.0 MiB  3/3 files, 1 from cache"]


def test_progress_is_rate_limited_but_always_shows_the_end():
    out = io.StringIO()
    p = Progress(10, "train", "epoch", every_s=3600.0, file=out)
    for _ in range(10):
        p.update(1)
    assert out.getvalue().splitlines() == ["train 10/10 epoch"]
    silent = io.StringIO()
    q = Progress(1, "train", "epoch", enabled=False, file=silent)
    q.update(1)
    assert silent.getvalue() == ""


def test_only_rank_0_writes_the_jsonl(tmp_path):
    path = tmp_path / "log.jsonl"
    for rank in (1, 0):
        log = RunLog(str(path), rank, quiet=True)
        log.emit({"event": "x", "rank": rank})
        log.close({"event": "summary"})
        assert [e["event"] for e in log.events] == ["x", "summary"]
    assert [json.loads(line) for line in path.read_text().splitlines()] == [
        {"event": "x", "rank": 0}, {"event": "summary"}]


def test_time_to_target_sums_training_time_up_to_the_first_epoch_at_target():
    epochs = [{"epoch": 1, "train_time_s": 0.5, "test_accuracy": 0.8},
              {"epoch": 2, "train_time_s": 0.25, "test_accuracy": 0.95},
              {"epoch": 3, "train_time_s": 0.25, "test_accuracy": 0.97}]
    assert time_to_target(epochs, 0.95) == (0.75, 2)
    assert time_to_target(epochs, 0.99) == (None, None)
    assert time_to_target([], 0.5) == (None, None)


def test_time_to_target_is_interpolated_between_evaluations():
    epochs = [{"epoch": 1, "train_time_s": 1.0, "test_accuracy": 0.6},
              {"epoch": 2, "train_time_s": 2.0, "test_accuracy": 0.8},
              {"epoch": 3, "train_time_s": 1.0, "test_accuracy": 0.9}]
    assert time_to_target_interpolated(epochs, 0.7) == pytest.approx(2.0)  # half way through epoch 2 (1 + 2 / 2)
    assert time_to_target_interpolated(epochs, 0.8) == 3.0   # at epoch 2's evaluation
    assert time_to_target_interpolated(epochs, 0.5) == 1.0   # at the first evaluation: no point before it
    assert time_to_target_interpolated(epochs, 0.95) is None


def test_evaluations_within_epochs_are_points_of_time_to_target():
    """``--eval-every`` records (seconds into their epoch) sit between the epochs' own points;
    other events are skipped."""
    records = [{"event": "policy"},
               {"event": "evaluation", "epoch": 1, "epoch_train_s": 0.5, "test_accuracy": 0.6},
               {"event": "epoch", "epoch": 1, "train_time_s": 1.0, "test_accuracy": 0.7},
               {"event": "evaluation", "epoch": 2, "epoch_train_s": 0.25, "test_accuracy": 0.9},
               {"event": "epoch", "epoch": 2, "train_time_s": 1.0, "test_accuracy": 0.85}]
    assert accuracy_points(records) == [(0.5, 0.6, 1), (1.0, 0.7, 1), (1.25, 0.9, 2), (2.0, 0.85, 2)]
    assert time_to_target(records, 0.65) == (1.0, 1)
    assert time_to_target(records, 0.8) == (1.25, 2)     # the evaluation within epoch 2, not its end
    assert time_to_target_interpolated(records, 0.8) == pytest.approx(1.125)  # half way from 0.7 to 0.9
    assert time_to_target_interpolated(records, 0.55) == 0.5
    assert time_to_target_interpolated(records, 0.95) is None
