"""hxmpi.sim.simgrid: which SimGrid a replay uses, and the source build's no-op and errors."""
import os
import stat
import subprocess
import sys

import pytest

from hxmpi.sim import simgrid
from hxmpi.sim.simgrid import SimGridError, build, default_prefix, find


def fake_smpirun(root, version="4.1", replay=True):
    """An installation tree with an smpirun script naming its version and replay program."""
    (root / "bin").mkdir(parents=True)
    main = root / "lib" / "simgrid" / "smpireplaymain"
    if replay:
        main.parent.mkdir(parents=True)
        main.write_text("")
    run = root / "bin" / "smpirun"
    run.write_text(f'#!/bin/sh\nSIMGRID_VERSION="SimGrid version {version}"\n  EXEC="{main}"\n')
    run.chmod(run.stat().st_mode | stat.S_IEXEC)
    return run


@pytest.fixture
def clean_env(monkeypatch, tmp_path):
    monkeypatch.delenv(simgrid.ENV_SMPIRUN, raising=False)
    monkeypatch.setenv(simgrid.ENV_PREFIX, str(tmp_path / "prefix"))
    return monkeypatch


def test_order_flag_env_prefix_path(clean_env, tmp_path):
    flag = fake_smpirun(tmp_path / "flag", "4.0")
    env = fake_smpirun(tmp_path / "env", "3.36")
    pre = fake_smpirun(tmp_path / "prefix", "4.1")
    clean_env.setenv(simgrid.ENV_SMPIRUN, str(env))
    got = find(str(flag))
    assert (got.smpirun, got.version, got.found_by, got.label) == (str(flag), "4.0", "--smpirun", "SimGrid 4.0")
    assert find().version == "3.36" and find().found_by == simgrid.ENV_SMPIRUN
    clean_env.delenv(simgrid.ENV_SMPIRUN)
    got = find()
    assert got.smpirun == str(pre) and got.version == "4.1" and got.replay_main.endswith("smpireplaymain")
    assert got.at_least("3.34") and not got.at_least("4.2")
    clean_env.setenv("PATH", str(tmp_path / "env" / "bin"))
    (tmp_path / "prefix" / "bin" / "smpirun").unlink()
    assert find().found_by == "PATH" and find().version == "3.36"


def test_errors_name_the_problem(clean_env, tmp_path):
    with pytest.raises(SimGridError, match="does not exist"):
        find(str(tmp_path / "nope"))
    broken = fake_smpirun(tmp_path / "broken", replay=False)
    with pytest.raises(SimGridError, match="replay program .* is missing"):
        find(str(broken))
    other = tmp_path / "other"
    other.write_text("#!/bin/sh\n")
    with pytest.raises(SimGridError, match="no SIMGRID_VERSION"):
        find(str(other))
    clean_env.setenv("PATH", str(tmp_path / "empty"))
    with pytest.raises(SimGridError, match="python -m hxmpi.sim.simgrid build"):
        find()


def test_default_prefix(monkeypatch, tmp_path):
    monkeypatch.delenv(simgrid.ENV_PREFIX, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert default_prefix() == tmp_path / "hxmpi" / f"simgrid-{simgrid.VERSION}"
    monkeypatch.setenv(simgrid.ENV_PREFIX, str(tmp_path / "x"))
    assert default_prefix() == tmp_path / "x"


def test_build_does_nothing_when_installed(tmp_path, capsys):
    """A prefix that holds this version is left alone: no download, no apt, no compile."""
    fake_smpirun(tmp_path / "p", simgrid.VERSION)
    got = build(tmp_path / "p", apt=False)
    assert got.version == simgrid.VERSION
    assert capsys.readouterr().out == f"SimGrid {simgrid.VERSION} is already in {tmp_path / 'p'}\n"
    assert sorted(os.listdir(tmp_path)) == ["p"]


def test_which_cli(clean_env, tmp_path):
    run = fake_smpirun(tmp_path / "s", "4.1")
    proc = subprocess.run([sys.executable, "-m", "hxmpi.sim.simgrid", "which", "--smpirun", str(run)],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and proc.stdout.startswith(f"SimGrid 4.1: {run} (found by --smpirun)")
    proc = subprocess.run([sys.executable, "-m", "hxmpi.sim.simgrid", "which", "--smpirun", str(tmp_path / "x")],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and proc.stderr.startswith("error: smpirun") and "does not exist" in proc.stderr
