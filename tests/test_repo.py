"""Repository contracts: CI runs the README's test command verbatim; the README API example runs."""
import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

from mpilaunch import mpirun_command, run_job

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()


def readme_commands():
    return re.findall(r"```bash\n(.+?)\n```", README)


def test_ci_runs_the_readme_test_command():
    test_cmd = readme_commands()[1]
    assert "tests/run.py" in test_cmd
    ci_lines = (ROOT / ".ci" / "run").read_text().splitlines()
    assert test_cmd in ci_lines


def test_readme_starts_with_the_two_commands():
    first, second = readme_commands()[:2]
    assert "python -m hxmpi.train" in first and "pip install" in first
    assert README.index(first) < README.index("## What it does")


@pytest.mark.skipif(not mpirun_command(), reason="no mpirun")
def test_readme_api_example_runs(tmp_path):
    code = re.search(r"```python\n(# save as demo.py.+?)```", README, re.S).group(1)
    (tmp_path / "demo.py").write_text(code)
    proc = run_job(mpirun_command() + ["-n", "5", sys.executable, str(tmp_path / "demo.py")], timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ""  # a normal run prints no error lines
    # Both paths are shown (rank 0 only), and why auto went flat.
    stats = {line.split(" ", 1)[0]: ast.literal_eval(line.split(" ", 1)[1])
             for line in proc.stdout.splitlines() if line.startswith(("auto {", "hier {"))}
    assert stats["auto"]["algorithm"] == "flat", proc.stdout
    # 3 nodes: one lane message to each other node, against 3 inter-node messages flat on rank 0.
    assert stats["hier"]["algorithm"] == "hier" and stats["hier"]["inter"]["messages"] == 2, proc.stdout
    assert stats["auto"]["inter_node"]["messages"] == 3
    assert "predicted flat" in proc.stdout and "hier predicted faster below" in proc.stdout


def test_python_m_hxmpi_describes_topology():
    proc = subprocess.run([sys.executable, "-m", "hxmpi", "--json"], capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert '"local_rank": 0' in proc.stdout and '"node_sizes": [1]' in proc.stdout


@pytest.mark.skipif(not mpirun_command(), reason="no mpirun")
@pytest.mark.parametrize("n", [3, 4])
def test_python_m_hxmpi_under_mpirun(n):
    import json
    proc = run_job(mpirun_command() + ["-n", str(n), sys.executable, "-m", "hxmpi", "--json",
                                              "--ranks-per-node", "2"], timeout=120)
    assert proc.returncode == 0, proc.stderr
    rows = [json.loads(line) for line in proc.stdout.splitlines()]
    assert [r["rank"] for r in rows] == list(range(n))
    assert [(r["node"], r["local_rank"]) for r in rows] == [(r // 2, r % 2) for r in range(n)]
    assert all(r["node_sizes"] == [2] * (n // 2) + [1] * (n % 2) for r in rows)


def test_plot_without_matplotlib_prints_one_line_hint(tmp_path):
    fake = tmp_path / "matplotlib"
    fake.mkdir()
    (fake / "__init__.py").write_text("raise ImportError('No module named matplotlib')\n")
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "plot.py"), "x.json"],
                          capture_output=True, text=True, timeout=60, env={"PYTHONPATH": str(tmp_path)})
    assert proc.returncode == 2
    assert proc.stderr == "plot.py: needs matplotlib: pip install -e '.[bench]'\n"


def _asserting_functions(trees) -> tuple[dict, set]:
    """Every function defined in the test files, by name, and the names of those that assert."""
    defs = {}
    for tree in trees:
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                defs.setdefault(node.name, []).append(node)

    def called(node) -> str:
        f = node.func
        return f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", "")

    def direct(fn) -> bool:
        for node in ast.walk(fn):
            if isinstance(node, ast.Assert):
                return True
            if isinstance(node, ast.Raise) and "AssertionError" in ast.unparse(node.exc or ast.Constant(None)):
                return True
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                    and ast.unparse(node.func) in ("pytest.raises", "pytest.warns", "pytest.fail"):
                return True
        return False

    asserting = {name for name, fns in defs.items() if any(direct(fn) for fn in fns)}
    changed = True
    while changed:  # a call of an asserting helper asserts too (transitively)
        changed = False
        for name, fns in defs.items():
            if name not in asserting and any(isinstance(n, ast.Call) and called(n) in asserting
                                             for fn in fns for n in ast.walk(fn)):
                asserting.add(name)
                changed = True
    return defs, asserting


def test_every_test_function_asserts():
    """A test that checks nothing cannot fail. The rule: every ``test_*`` function of tests/ holds
    (in its body, nested functions included) an ``assert`` statement, a ``pytest.raises``,
    ``pytest.warns`` or ``pytest.fail`` call, a ``raise AssertionError``, or a call of a function
    defined in tests/ that does so by the same rule (transitively: ``support.assert_exchange_works``
    asserts, so a test calling it asserts). Helpers are matched by name."""
    files = sorted((ROOT / "tests").glob("*.py"))
    trees = {f.name: ast.parse(f.read_text()) for f in files}
    _, asserting = _asserting_functions(trees.values())
    silent = [f"{name}:{node.lineno} {node.name}" for name, tree in trees.items() if name.startswith("test_")
              for node in ast.walk(tree) if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
              and node.name.startswith("test_") and node.name not in asserting]
    assert not silent, f"test functions that assert nothing: {silent}"


def test_the_assertion_check_catches_a_silent_test():
    """The rule above, on a test that only computes, one that asserts, and one that calls a helper."""
    tree = ast.parse("def helper(x):\n    assert x\n\ndef test_silent():\n    y = 1 + 1\n\n"
                     "def test_direct():\n    assert 1\n\ndef test_via_helper():\n    helper(1)\n\n"
                     "def test_raises():\n    with pytest.raises(ValueError):\n        int('x')\n")
    _, asserting = _asserting_functions([tree])
    assert asserting == {"helper", "test_direct", "test_via_helper", "test_raises"}


def test_test_files_import_no_other_test_file():
    """Shared helpers live in tests/support.py (and fixtures in conftest.py), never in a test file."""
    imports = []
    for f in sorted((ROOT / "tests").glob("test_*.py")):
        for node in ast.walk(ast.parse(f.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            imports += [f"{f.name} imports {n}" for n in names if n.split(".")[0].startswith("test_")]
    assert not imports, imports


def test_every_hxmpi_error_derives_from_hxmpi_error():
    """``except hxmpi.HxmpiError`` catches every error hxmpi defines (errors.py promises it)."""
    import importlib
    import inspect
    import pkgutil

    import hxmpi
    from hxmpi.errors import HxmpiError
    defined = []
    for info in pkgutil.walk_packages(hxmpi.__path__, "hxmpi."):
        if info.name.endswith("__main__"):
            continue
        module = importlib.import_module(info.name)
        defined += [cls for _, cls in inspect.getmembers(module, inspect.isclass)
                    if issubclass(cls, BaseException) and cls.__module__ == module.__name__]
    assert len(defined) >= 10  # the walk found the package's errors
    assert [c.__qualname__ for c in defined if not issubclass(c, HxmpiError)] == []
