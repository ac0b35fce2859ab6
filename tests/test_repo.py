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
    assert README.index(first) < README.index("## A first exchange")


@pytest.mark.skipif(not mpirun_command(), reason="no mpirun")
def test_readme_api_example_runs(tmp_path):
    code = re.search(r"```python\n(# save as demo.py.+?)```", README, re.S).group(1)
    (tmp_path / "demo.py").write_text(code)
    proc = run_job(mpirun_command() + ["-n", "5", sys.executable, str(tmp_path / "demo.py")], timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ""  # a normal run prints no error lines
    # Both paths are shown (rank 0 only).
    stats = {line.split(" ", 1)[0]: ast.literal_eval(line.split(" ", 1)[1])
             for line in proc.stdout.splitlines() if line.startswith(("auto {", "hier {"))}
    assert stats["auto"]["algorithm"] == "flat", proc.stdout
    # 3 nodes: one lane message to each other node, against 3 inter-node messages flat on rank 0.
    assert stats["hier"]["algorithm"] == "hier" and stats["hier"]["inter"]["messages"] == 2, proc.stdout
    assert stats["auto"]["inter_node"]["messages"] == 3


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


# ---------------------------------------------------------------------------------- import direction
#: The layers of the package, lowest first. A module may import its own layer and the ones below,
#: never above; the two modules of a layer that are listed together are siblings and import neither
#: the other. ``hxmpi/__init__.py`` (the public names) and ``hxmpi/__main__.py`` (``python -m hxmpi``)
#: are the package's face, above every layer, and nothing inside imports them but for ``__version__``.
LAYERS = ({"root"}, {"comm"}, {"data", "models"}, {"train", "sim"})
FACE = {"hxmpi", "hxmpi.__main__"}


def _area(module: str) -> str:
    """The area of a dotted module name: its subpackage, or "root" for hxmpi's top-level modules."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and any(parts[1] in areas for areas in LAYERS) else "root"


def _layer(area: str) -> int:
    return next(i for i, areas in enumerate(LAYERS) if area in areas)


def _package_imports(root: Path = ROOT) -> dict:
    """Every hxmpi module's imports of other hxmpi modules, function-level ones included:
    {module: {(imported module, line, names)}}. A name imported from a package that is one of its
    modules (``from . import checkpoint``) counts as that module."""
    modules = {}
    for f in sorted((root / "hxmpi").rglob("*.py")):
        rel = f.relative_to(root).with_suffix("")
        name = ".".join(rel.parts[:-1] if rel.name == "__init__" else rel.parts)
        modules[name] = (f, rel.name == "__init__")
    found = {}
    for name, (f, is_pkg) in modules.items():
        package = name if is_pkg else name.rpartition(".")[0]
        edges = set()
        for node in ast.walk(ast.parse(f.read_text())):
            if isinstance(node, ast.Import):
                targets = [(a.name, ()) for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                    base = ".".join(up + ([base] if base else []))
                names = tuple(a.name for a in node.names)
                targets = [(f"{base}.{n}", ()) for n in names if f"{base}.{n}" in modules] or [(base, names)]
            else:
                continue
            for target, names in targets:
                while target and target not in modules and "." in target:
                    target = target.rpartition(".")[0]  # hxmpi.comm._plan (compiled) -> hxmpi.comm
                if target in modules and target != name:
                    edges.add((target, node.lineno, names))
        found[name] = edges
    return found


def _direction_problems(imports: dict) -> list:
    problems = []
    for module, edges in imports.items():
        if module in FACE:
            continue
        for target, line, names in sorted(edges):
            where = f"{module}:{line} imports {target}"
            if target in FACE:
                if target != "hxmpi" or set(names) - {"__version__"}:
                    problems.append(f"{where} (the package's face)")
                continue
            a, b = _area(module), _area(target)
            if _layer(b) > _layer(a) or (a != b and _layer(a) == _layer(b)):
                problems.append(f"{where} ({a} may not import {b})")
    return problems


def _cycles(imports: dict) -> list:
    """Module-level import circles (depth-first search), each as a list of modules."""
    graph = {m: sorted({t for t, _, _ in e}) for m, e in imports.items()}
    state, stack, cycles = {}, [], []

    def visit(m):
        state[m] = 1
        stack.append(m)
        for t in graph.get(m, ()):
            if state.get(t) == 1:
                cycles.append(stack[stack.index(t):] + [t])
            elif t not in state:
                visit(t)
        stack.pop()
        state[m] = 2

    for m in graph:
        if m not in state:
            visit(m)
    return cycles


def test_imports_run_one_way():
    """root -> comm -> data/models -> train, with sim beside train: no upward or sideways import."""
    imports = _package_imports()
    assert {"hxmpi.comm.exchange", "hxmpi.train.trainer", "hxmpi.sim.simulate"} <= set(imports)
    # The walk sees real edges, those inside functions and through a package's names too.
    assert any(t == "hxmpi.comm.exchange" for t, _, _ in imports["hxmpi.train.trainer"])
    assert any(t == "hxmpi.train.checkpoint" for t, _, _ in imports["hxmpi.train.trainer"])
    assert _direction_problems(imports) == []


def test_no_import_circles():
    assert _cycles(_package_imports()) == []


def test_no_string_imports():
    """No module reaches another by name at run time (importlib, __import__, "module:NAME"), which
    the direction check could not see; only the package's face loads its public names lazily."""
    found = []
    for f in sorted((ROOT / "hxmpi").rglob("*.py")):
        if f == ROOT / "hxmpi" / "__init__.py":
            continue
        text = f.read_text()
        for pattern in (r"\bimport_module\(", r"\b__import__\(", r"[\"']hxmpi(\.\w+)*:\w+[\"']"):
            found += [f"{f.relative_to(ROOT)}: {m.group(0)}" for m in re.finditer(pattern, text)]
    assert found == []


def test_the_direction_check_catches_upward_sideways_and_circular_imports(tmp_path):
    """The checks above, on a small package made to break each rule once."""
    files = {"hxmpi/__init__.py": "", "hxmpi/errors.py": "from .comm import exchange\n",
             "hxmpi/comm/__init__.py": "", "hxmpi/comm/exchange.py": "from . import plan\n",
             "hxmpi/comm/plan.py": "from .exchange import X\n",
             "hxmpi/train/__init__.py": "", "hxmpi/train/trainer.py": "from ..sim import simulate\n",
             "hxmpi/sim/__init__.py": "", "hxmpi/sim/simulate.py": "from ..comm.plan import Layout\n",
             "hxmpi/data/__init__.py": "", "hxmpi/data/store.py": "from .. import HierComm\n"}
    for path, text in files.items():
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_text(text)
    imports = _package_imports(tmp_path)
    problems = _direction_problems(imports)
    assert problems == ["hxmpi.data.store:1 imports hxmpi (the package's face)",
                        "hxmpi.errors:1 imports hxmpi.comm.exchange (root may not import comm)",
                        "hxmpi.train.trainer:1 imports hxmpi.sim.simulate (train may not import sim)"]
    assert _cycles(imports) == [["hxmpi.comm.exchange", "hxmpi.comm.plan", "hxmpi.comm.exchange"]]


#: One job a file, short functions: the most lines a module or a function of hxmpi/ and csrc/ may have.
MODULE_LINES, FUNCTION_LINES = 800, 120
#: A Cython function's first line: def/cdef/cpdef with a name and an open parenthesis, ending
#: its line with a colon (not a ``cdef int x`` declaration, nor ``cdef class``).
CYTHON_DEF = re.compile(r"^(\s*)(?:async\s+)?(?:def|cp?def\s+(?!class\b)[^=(]*?)\s*\b(\w+)\s*\(.*:\s*(#.*)?$")


def _cython_functions(text):
    """(name, first line, lines) of each def/cdef/cpdef in Cython source: a body ends at the next
    line as little indented as its def (blank lines and comments do not end it)."""
    lines = text.splitlines()
    found = []
    for i, line in enumerate(lines):
        m = CYTHON_DEF.match(line)
        if not m:
            continue
        indent, end = len(m.group(1)), i
        for j in range(i + 1, len(lines)):
            body = lines[j]
            if not body.strip() or body.lstrip().startswith("#"):
                continue
            if len(body) - len(body.lstrip()) <= indent:
                break
            end = j
        found.append((m.group(2), i + 1, end - i + 1))
    return found


def _python_functions(text):
    """(name, first line, lines) of each function in Python source, decorators left out."""
    return [(node.name, node.lineno, node.end_lineno - node.lineno + 1) for node in ast.walk(ast.parse(text))
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))]


def _size_problems(root=ROOT):
    problems = []
    cython = (f for ext in ("pyx", "pxi", "pxd") for f in (root / "csrc").glob(f"*.{ext}"))
    files = [*(root / "hxmpi").rglob("*.py"), *cython]
    for f in sorted(files):
        text = f.read_text()
        name = f.relative_to(root)
        n = len(text.splitlines())
        if n > MODULE_LINES:
            problems.append(f"{name}: {n} lines")
        functions = _python_functions(text) if f.suffix == ".py" else _cython_functions(text)
        problems += [f"{name}:{line} {func}: {length} lines" for func, line, length in functions
                     if length > FUNCTION_LINES]
    return problems


def test_modules_and_functions_stay_short():
    """No module of hxmpi/ or csrc/ over 800 lines, no function over 120."""
    assert _size_problems() == []


def test_the_size_check_catches_a_long_module_and_long_functions(tmp_path):
    body = "    x = 1\n" * FUNCTION_LINES
    (tmp_path / "hxmpi").mkdir()
    (tmp_path / "csrc").mkdir()
    (tmp_path / "hxmpi" / "big.py").write_text("def long(a):\n" + body + "\n" * MODULE_LINES)
    method = "    cdef int long_c(self, int a) except -1:\n" + "    " + body.replace("\n    ", "\n        ")
    (tmp_path / "csrc" / "_k.pxi").write_text("cdef int x = 1\ncdef class C:\n" + method + "\ndef short():\n    pass\n")
    assert _size_problems(tmp_path) == [f"csrc/_k.pxi:3 long_c: {1 + FUNCTION_LINES} lines",
                                        f"hxmpi/big.py: {1 + FUNCTION_LINES + MODULE_LINES} lines",
                                        f"hxmpi/big.py:1 long: {1 + FUNCTION_LINES} lines"]
