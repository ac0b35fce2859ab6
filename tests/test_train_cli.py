"""The CLI as a user runs it: mpirun jobs reach accuracy, failures end every rank, bad flags are clean."""
import json
import re
import subprocess
import sys
from importlib import import_module

import pytest
from mpilaunch import mpirun_command, run_job

MPIRUN = mpirun_command()
needs_mpirun = pytest.mark.skipif(not MPIRUN, reason="no mpirun on this machine")


def launch(n, *args, timeout=300):
    return run_job(MPIRUN + ["-n", str(n), sys.executable, "-m", "hxmpi.train", *args], timeout=timeout)


@needs_mpirun
@pytest.mark.parametrize("n,model,target", [(4, "mlp", 0.95), (2, "mlp", 0.95), (4, "moe", 0.90),
                                            (3, "moe", 0.90)])
def test_default_run_reaches_accuracy(tmp_path, n, model, target):
    log = tmp_path / "log.jsonl"
    proc = launch(n, "--model", model, "--log", str(log), "--ranks-per-node", "2")
    assert proc.returncode == 0, proc.stderr
    records = [json.loads(line) for line in log.read_text().splitlines()]
    summary = records[-1]
    assert summary["event"] == "summary" and summary["world_size"] == n
    assert summary["num_nodes"] == -(-n // 2) and summary["epochs"] == 20
    assert summary["test_accuracy"] >= target, summary
    assert [r["epoch"] for r in records if r["event"] == "epoch"] == list(range(1, 21))
    # The update policy decided every --policy-window steps and logged each decision.
    assert any(r["event"] == "policy" for r in records)


@needs_mpirun
def test_default_run_reaches_accuracy_beside_a_busy_neighbour(tmp_path):
    """A transient CPU hog (a busy process for the first 20 s) beside the default run: its noise
    must not trip auto into a worse model (issue 27: it went async in 2 runs of 5 and ended at
    0.944-0.953). One noisy window changes nothing, and a trial that does not pay returns."""
    hog = subprocess.Popen([sys.executable, "-c", "import time\nt = time.time()\nwhile time.time() - t < 20: pass"])
    try:
        log = tmp_path / "log.jsonl"
        proc = launch(4, "--log", str(log), "--ranks-per-node", "2")
    finally:
        hog.kill()
        hog.wait()
    assert proc.returncode == 0, proc.stderr
    records = [json.loads(line) for line in log.read_text().splitlines()]
    assert records[-1]["test_accuracy"] >= 0.95, records[-1]
    policy = [r for r in records if r["event"] == "policy"]
    assert policy and all(r["action"] in ("stay", "wait", "trial", "keep", "return", "hold", "change", "post-local")
                          for r in policy)


@needs_mpirun
@pytest.mark.parametrize("n", [2, 3])
def test_failing_rank_ends_the_job_with_its_message(n):
    proc = launch(n, "--fail-at", f"{n - 1}:3", "--quiet", timeout=120)
    assert proc.returncode != 0
    assert f"rank {n - 1} failed: RuntimeError: injected failure (fail_at) at step 3" in proc.stderr


BAD_FLAGS = [
    (["--epochs", "0"], "--epochs must be >= 1, got 0"),
    (["--model", "cnn"], "--model must be one of softmax, mlp, moe, got 'cnn'"),
    (["--dataset", "nope"], "unknown dataset 'nope': not a bundled dataset (digits) nor a store"),
    (["--model", "moe", "--experts", "3", "--ranks-per-node", "1"], None),
    (["--hidden", "a,b"], "expected comma-separated integers"),
    (["--resume"], "--resume needs a checkpoint directory"),
    (["--fail-at", "x"], "argument --fail-at: expects RANK:STEP"),
    (["--straggle", "x"], "argument --straggle: expects RANKS:SECONDS (e.g. 3:0.02) or RANKS:xF"),
    (["--straggle", "1:x0.5"], "needs ranks >= 0 and a delay >= 0 or a factor >= 1"),
    (["--straggle", "1:x3:1.5"], "UNTIL is a fraction of the schedule's steps in (0, 1]"),
    (["--policy-hysteresis", "0"], "--policy-hysteresis must be >= 1, got 0"),
    (["--policy-explore", "some"], "--policy-explore must be one of all, rule, got 'some'"),
    (["--local-steps-until", "2"], "--local-steps-until must lie in [0, 1], got 2.0"),
    (["--model", "moe", "--update", "async"], "--update async needs a model whose steps are local; MoE"),
    (["--straggler-threshold", "-1"], "--straggler-threshold must be > 0, got -1.0"),
    (["--target-accuracy", "2"], "--target-accuracy must lie in [0, 1], got 2.0"),
    (["--batch-size", "1", "--epochs", "1"], None),
    (["--dtype", "float16"], "--dtype must be one of float32, float64, got 'float16'"),
    (["--threads", "0"], "--threads must be >= 1, got 0"),
    (["--balance", "maybe"], "--balance must be one of on, off, auto, got 'maybe'"),
]


@pytest.fixture(scope="module")
def bad_flag_runs():
    """Every bad-flag job, run a few at a time: they are independent and mostly start-up latency."""
    from concurrent.futures import ThreadPoolExecutor
    cases = [(n, tuple(flags)) for n in (1, 2) for flags, _ in BAD_FLAGS]
    with ThreadPoolExecutor(4) as pool:
        done = list(pool.map(lambda case: launch(case[0], *case[1], timeout=120), cases))
    return dict(zip(cases, done))


@needs_mpirun
@pytest.mark.parametrize("n", [1, 2])
@pytest.mark.parametrize("flags,message", BAD_FLAGS)
def test_bad_flags_give_one_line_error(bad_flag_runs, n, flags, message):
    proc = bad_flag_runs[n, tuple(flags)]
    if message is None:  # errors only at some rank counts
        if "--batch-size" in flags:  # a global batch must give every rank a sample
            if n == 1:
                assert proc.returncode == 0, proc.stderr
                return
            message = f"--batch-size 1 is smaller than the {n} ranks"
        elif 3 % n == 0:  # experts must be a multiple of the rank count
            assert proc.returncode == 0, proc.stderr
            return
        else:
            message = "--experts 3 must be a positive multiple of the 2 ranks"
    assert proc.returncode == 2, (proc.returncode, proc.stderr)
    errors = [line for line in proc.stderr.splitlines() if "error:" in line]
    assert len(errors) == 1 and message in errors[0], proc.stderr


@pytest.mark.parametrize("text,ranks,delay,factor,until", [
    ("2:0.01", (2,), 0.01, 1.0, 1.0), ("1,3:x2.5", (1, 3), 0.0, 2.5, 1.0), ("0:X3", (0,), 0.0, 3.0, 1.0),
    ("1:x3:0.5", (1,), 0.0, 3.0, 0.5), ("1:0.02:0.25", (1,), 0.02, 1.0, 0.25)])
def test_straggle_takes_a_delay_or_a_factor(text, ranks, delay, factor, until):
    from hxmpi.train.command import parse_config
    from hxmpi.schema import Straggle
    assert parse_config(["--straggle", text]).straggle == Straggle(ranks, delay, factor, until)


def test_policy_flags_are_documented_on_the_method_page():
    """Every update-policy flag is in --help (generated from the schema) and explained in docs/method.md."""
    from pathlib import Path

    from hxmpi.schema import SETTINGS
    method = (Path(__file__).resolve().parent.parent / "docs" / "method.md").read_text()
    for name in ("update", "b1", "b2", "straggler_threshold", "policy_window", "policy_hysteresis", "policy_gain",
                 "policy_explore", "local_steps_until", "max_staleness", "straggle", "balance"):
        assert SETTINGS[name].flag in method, name
    for words in ("time_to_target_interpolated", "frees a core", "Hysteresis", "post-local", "fixed cost per step"):
        assert words.lower() in method.lower(), words


def help_text():
    out = subprocess.run([sys.executable, "-m", "hxmpi.train", "--help"], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    return out.stdout


def test_help_documents_every_setting():
    """One flag per setting and no other (but --help and --version), each with the schema's help."""
    from hxmpi.schema import SETTINGS
    text = help_text()
    options = text.split("options:")[1]
    listed = set(re.findall(r"^  (?:-h, )?(--[a-z0-9-]+)", options, re.M))
    assert listed == {s.flag for s in SETTINGS.values()} | {"--help", "--version"}
    # One "(default: ...)" per flag at most, and no references to documents outside the repository.
    entries = re.split(r"\n  (?=-)", options)
    for entry in entries:
        assert entry.count("default") <= 1, entry
    flat = "".join(options.split())  # argparse wraps lines (at hyphens too)
    for s in SETTINGS.values():
        assert "".join(s.help.split()) in flat, s.name
    for stale in ("claim", "CLAIMS", "source B"):
        assert stale not in text


def test_trainconfig_is_the_schema():
    """TrainConfig's fields are the settings, in order, with the schema's defaults; sub-configs take
    theirs from the schema too (the policy window was 20 on the command line and 10 in UpdateConfig)."""
    from dataclasses import fields

    from hxmpi.data.staging import StagingConfig
    from hxmpi.schema import SETTINGS
    from hxmpi.train.run_config import TrainConfig
    from hxmpi.train.update_engine import UpdateConfig
    cfg = TrainConfig()
    assert [f.name for f in fields(TrainConfig)] == list(SETTINGS)
    assert all(getattr(cfg, name) == s.make_default() for name, s in SETTINGS.items())
    for sub in (StagingConfig(), UpdateConfig()):
        for f in fields(sub):
            assert f.name in SETTINGS or f.name == "progress", f.name
            assert getattr(sub, f.name) == (SETTINGS[f.name].make_default() if f.name in SETTINGS else False)
    assert cfg.update_config() == UpdateConfig() and cfg.update_config().policy_window == 20
    assert cfg.staging_config() == StagingConfig(progress=True)
    changed = TrainConfig(policy_window=3, fetch_workers=2, straggler_threshold=0.5, quiet=True)
    assert changed.update_config().policy_window == 3 and changed.update_config().straggler_threshold == 0.5
    assert changed.staging_config() == StagingConfig(fetch_workers=2)


@pytest.mark.parametrize("build,setting,message", [
    (lambda: import_module("hxmpi.train.run_config").TrainConfig(epochs=0), "epochs", "must be >= 1, got 0"),
    (lambda: import_module("hxmpi.train.run_config").TrainConfig(epochs=2.5), "epochs", "must be an integer, got 2.5"),
    (lambda: import_module("hxmpi.train.run_config").TrainConfig(model="cnn"), "model", "must be one of softmax, mlp, moe"),
    (lambda: import_module("hxmpi.train.run_config").TrainConfig(hidden=[64, 0]), "hidden", "must be non-empty, with every value >= 1, got [64, 0]"),
    (lambda: import_module("hxmpi.train.run_config").TrainConfig(hidden=[]), "hidden", "must be non-empty"),
    (lambda: import_module("hxmpi.train.run_config").TrainConfig(lr=float("nan")), "lr", "must be > 0, got nan"),
    (lambda: import_module("hxmpi.train.update_engine").UpdateConfig(policy_window=0), "policy_window", "must be >= 1"),
    (lambda: import_module("hxmpi.train.update_engine").UpdateConfig(update="later"), "update", "must be one of auto"),
    (lambda: import_module("hxmpi.data.staging").StagingConfig(fetch_workers=0), "fetch_workers",
     "must be >= 1, got 0"),
    (lambda: import_module("hxmpi.data.staging").StagingConfig(staging="disk"), "staging",
     "must be one of auto, memory, distributed, got 'disk'"),
])
def test_every_config_checks_its_settings_when_built(build, setting, message):
    """The same check, naming the setting (never a flag), whichever config is built."""
    from hxmpi.errors import SettingError
    with pytest.raises(SettingError, match=re.escape(message)) as info:
        build()
    assert info.value.setting == setting and "--" not in str(info.value)


@needs_mpirun
@pytest.mark.parametrize("n", [2, 3])
def test_stall_abort_ends_the_job_naming_the_rank(n):
    proc = launch(n, "--update", "sync", "--straggle", f"{n - 1}:0.5", "--stall-timeout", "0.1",
                  "--stall-abort", "--quiet", timeout=120)
    assert proc.returncode != 0
    # The straggler is named (a rank still starting up may be named with it).
    assert re.search(rf"stall: ranks \[([0-9, ]*, )?{n - 1}\] missing at step 0", proc.stderr), proc.stderr
