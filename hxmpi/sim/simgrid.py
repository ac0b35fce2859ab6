"""Which SimGrid the simulator runs, and a build of SimGrid 4.1 with SMPI from source.

``python -m hxmpi.sim`` replays traces with SimGrid's ``smpirun -replay``. It takes, in order:
``--smpirun PATH``, env ``HXMPI_SMPIRUN``, a build in the cache prefix (``default_prefix()``,
``~/.cache/hxmpi/simgrid-4.1``, or env ``HXMPI_SIMGRID_PREFIX``), else the ``smpirun`` on PATH
(Debian's package ``libsimgrid-dev``, SimGrid 3.32). SimGrid 3.34 and later replay large linear
phases far faster than 3.32 (3.32 spends P^3 removing finished communications from a list).

``python -m hxmpi.sim.simgrid build`` builds SimGrid 4.1 into the cache prefix: the source
distribution from PyPI (``pip download simgrid==4.1 --no-binary :all:``), CMake with SMPI on and
what replay does not need off (Java, Python, model checking, Fortran, documentation), ``make -jN``,
``make install``. It installs the Debian packages the build needs (cmake, g++, make, Boost headers)
when it runs as root, and does nothing when the prefix already holds a working ``smpirun``. The
source and object files stay under ``<prefix>-build``, so an interrupted build resumes. It takes
about an hour on 2 cores. ``python -m hxmpi.sim.simgrid which`` prints the SimGrid a replay would
use.
"""
from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tarfile
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Sequence

from ..errors import HxmpiError

__all__ = ["VERSION", "ENV_SMPIRUN", "ENV_PREFIX", "CMAKE_FLAGS", "DEBIAN_PACKAGES", "SimGridError", "SimGrid",
           "default_prefix", "find", "build", "main"]

#: The SimGrid release the build installs.
VERSION = "4.1"
#: Env var naming an ``smpirun`` to use (before the cache prefix and PATH).
ENV_SMPIRUN = "HXMPI_SMPIRUN"
#: Env var overriding the cache prefix of the source build.
ENV_PREFIX = "HXMPI_SIMGRID_PREFIX"
#: CMake options: SMPI and an optimised library; nothing replay does not use. enable_debug=OFF
#: compiles the debug log calls out (faster replays); LTO off halves the link time on 2 cores.
CMAKE_FLAGS = ("-DCMAKE_BUILD_TYPE=Release", "-Denable_smpi=ON", "-Denable_model-checking=OFF",
               "-Denable_java=OFF", "-Denable_python=OFF", "-Denable_documentation=OFF", "-Denable_fortran=OFF",
               "-Denable_sthread=OFF", "-Denable_lto=OFF", "-Denable_ns3=OFF", "-Denable_debug=OFF")
#: Debian packages the build needs (Boost's headers are SimGrid's one mandatory library).
DEBIAN_PACKAGES = ("cmake", "g++", "make", "libboost-dev")
INSTALL_HINT = (f"build SimGrid {VERSION}: python -m hxmpi.sim.simgrid build; or install SimGrid 3.32's SMPI: "
                "apt-get install libsimgrid-dev (it ships smpirun and smpireplaymain)")


class SimGridError(HxmpiError):
    """No usable SimGrid, or a build step that failed; the message says what to do."""


@dataclass(frozen=True)
class SimGrid:
    """One SimGrid installation: its ``smpirun``, the replay program it runs, its version ("4.1")
    and where it was found (``--smpirun``, ``HXMPI_SMPIRUN``, the cache prefix, PATH)."""
    smpirun: str
    replay_main: str
    version: str
    found_by: str

    @property
    def label(self) -> str:
        """What a result records as its MPI library: "SimGrid 4.1"."""
        return f"SimGrid {self.version}"

    def at_least(self, version: str) -> bool:
        """Whether this SimGrid is ``version`` or later."""
        return _version_tuple(self.version) >= _version_tuple(version)


def _version_tuple(text: str) -> tuple:
    return tuple(int(x) for x in re.findall(r"\d+", text)[:3])


def default_prefix(version: str = VERSION) -> Path:
    """Install prefix of the source build: env HXMPI_SIMGRID_PREFIX, else ``$XDG_CACHE_HOME/hxmpi``
    (default ``~/.cache/hxmpi``) ``/simgrid-<version>``."""
    if os.environ.get(ENV_PREFIX):
        return Path(os.environ[ENV_PREFIX])
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return cache / "hxmpi" / f"simgrid-{version}"


def _inspect(smpirun: str, found_by: str) -> SimGrid:
    """The installation behind an ``smpirun`` script: its replay program and version."""
    path = shutil.which(smpirun) if os.sep not in smpirun else smpirun
    if path is None or not os.path.isfile(path):
        raise SimGridError(f"smpirun {smpirun!r} ({found_by}) does not exist")
    try:
        with open(path, errors="replace") as fh:
            text = fh.read()
    except OSError as exc:
        raise SimGridError(f"smpirun {path} ({found_by}): cannot read it: {exc.strerror}") from None
    version = re.search(r'^SIMGRID_VERSION="SimGrid version ([^"]+)"', text, re.M)
    if version is None:
        raise SimGridError(f"smpirun {path} ({found_by}): no SIMGRID_VERSION line; is it SimGrid's smpirun?")
    main = re.search(r'^\s*EXEC="([^"$]*smpireplaymain)"', text, re.M)
    if main is None or not os.path.isfile(main.group(1)):
        raise SimGridError(f"smpirun {path} ({found_by}): its replay program "
                           f"{main.group(1) if main else 'smpireplaymain'} is missing: {INSTALL_HINT}")
    return SimGrid(path, main.group(1), version.group(1).strip(), found_by)


def find(smpirun: Optional[str] = None) -> SimGrid:
    """The SimGrid a replay uses: ``smpirun`` if given, env HXMPI_SMPIRUN, the cache prefix's
    build, else ``smpirun`` on PATH; SimGridError saying what to install if none works."""
    if smpirun:
        return _inspect(smpirun, "--smpirun")
    if os.environ.get(ENV_SMPIRUN):
        return _inspect(os.environ[ENV_SMPIRUN], ENV_SMPIRUN)
    built = default_prefix() / "bin" / "smpirun"
    if built.is_file():
        return _inspect(str(built), f"the cache prefix {built.parent.parent}")
    if shutil.which("smpirun") is None:
        raise SimGridError(f"no smpirun found: {INSTALL_HINT}")
    return _inspect("smpirun", "PATH")


# ------------------------------------------------------------------------------------------ build
def _run(cmd: Sequence[str], cwd: Optional[Path] = None, log: Optional[Path] = None) -> None:
    """Run a build step; its output goes to ``log`` (the last lines are shown on failure)."""
    print("+ " + " ".join(map(str, cmd)), flush=True)
    if log is None:
        proc = subprocess.run(list(cmd), cwd=cwd)
    else:
        with open(log, "w") as fh:
            proc = subprocess.run(list(cmd), cwd=cwd, stdout=fh, stderr=subprocess.STDOUT)
    if proc.returncode != 0:
        tail = ""
        if log is not None:
            tail = "\n".join(log.read_text(errors="replace").splitlines()[-15:])
        raise SimGridError(f"{' '.join(map(str, cmd[:3]))} failed (exit {proc.returncode})"
                           + (f"; see {log}:\n{tail}" if log else ""))


def _debian_packages(install: bool) -> None:
    """Install the missing ``DEBIAN_PACKAGES`` with apt-get (root only; otherwise say which)."""
    missing = [p for p in DEBIAN_PACKAGES
               if subprocess.run(["dpkg-query", "-W", "-f=${Status}", p], capture_output=True,
                                 text=True).stdout.strip() != "install ok installed"]
    if not missing:
        return
    if not install or os.geteuid() != 0 or shutil.which("apt-get") is None:
        raise SimGridError(f"the build needs these Debian packages: apt-get install {' '.join(missing)}")
    _run(["apt-get", "update", "-q"])
    _run(["apt-get", "install", "-y", "-q", *missing])


def build(prefix: Optional[Path] = None, version: str = VERSION, jobs: int = 2, apt: bool = True) -> SimGrid:
    """Build SimGrid ``version`` with SMPI into ``prefix`` (default ``default_prefix``); a no-op
    when ``prefix`` already holds it. Returns the installation."""
    prefix = Path(prefix or default_prefix(version)).resolve()
    smpirun = prefix / "bin" / "smpirun"
    if smpirun.is_file():
        try:
            have = _inspect(str(smpirun), "the build prefix")
            if have.version == version:
                print(f"SimGrid {version} is already in {prefix}")
                return have
        except SimGridError:
            pass  # a broken install: build again
    _debian_packages(apt)
    if shutil.which("cmake") is None:
        raise SimGridError("cmake is not on PATH: apt-get install cmake")
    work = Path(f"{prefix}-build")
    work.mkdir(parents=True, exist_ok=True)
    tarball = work / f"simgrid-{version}.tar.gz"
    if not tarball.is_file():
        _run([sys.executable, "-m", "pip", "download", f"simgrid=={version}", "--no-binary", ":all:",
              "--no-deps", "-d", str(work)])
    src = work / f"simgrid-{version}"
    if not (src / "CMakeLists.txt").is_file():
        with tarfile.open(tarball) as tar:
            tar.extractall(work, filter="data")
    objdir = src / "_build"
    objdir.mkdir(exist_ok=True)
    _run(["cmake", "..", f"-DCMAKE_INSTALL_PREFIX={prefix}", *CMAKE_FLAGS], cwd=objdir, log=objdir / "cmake.log")
    _run(["make", f"-j{jobs}"], cwd=objdir, log=objdir / "make.log")
    _run(["make", "install"], cwd=objdir, log=objdir / "install.log")
    got = _inspect(str(smpirun), "the build prefix")
    print(f"SimGrid {got.version} installed in {prefix} ({got.smpirun})")
    return got


def main(argv: Optional[Sequence[str]] = None) -> int:
    """``python -m hxmpi.sim.simgrid {build,which}``; returns the exit code."""
    p = argparse.ArgumentParser(prog="python -m hxmpi.sim.simgrid", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build", help=f"build SimGrid {VERSION} with SMPI into the cache prefix (once)")
    b.add_argument("--prefix", help=f"install prefix (default: env {ENV_PREFIX}, else {default_prefix()})")
    b.add_argument("--jobs", type=int, default=2, help="parallel compile jobs (default 2)")
    b.add_argument("--no-apt", action="store_true", help="do not apt-get install missing Debian packages")
    w = sub.add_parser("which", help="print the SimGrid that python -m hxmpi.sim would use")
    w.add_argument("--smpirun", help="an smpirun to inspect instead")
    args = p.parse_args(argv)
    try:
        if args.cmd == "build":
            build(Path(args.prefix) if args.prefix else None, jobs=args.jobs, apt=not args.no_apt)
        else:
            sg = find(args.smpirun)
            print(f"{sg.label}: {sg.smpirun} (found by {sg.found_by}); replay program {sg.replay_main}")
    except SimGridError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
