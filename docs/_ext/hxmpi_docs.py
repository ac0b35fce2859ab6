"""Sphinx extension: generates the pages' tables at build time, from the code and the results.

- ``_generated/flags.md``: the training flag table, from the settings schema (``hxmpi.schema.SETTINGS``
  through ``hxmpi.train.command.flags_markdown``), so the docs list exactly the flags of ``--help``.
- ``_generated/presets.md``: the simulator's platform presets (``hxmpi.sim.presets.PRESETS``), so
  the calibrated preset's fitted values on the page are the ones the package ships.
- ``_generated/performance/<stem>.md``: one fragment per ``benchmarks/results/*.json``, written by
  ``benchmarks/report.py`` (tables, the producing command, the committed plot).

The pages include these with MyST's ``{include}`` directive. ``_generated/`` is excluded from the
sources and ignored by git: it is rebuilt on every build.
"""
import importlib.util
from pathlib import Path

DOCS = Path(__file__).resolve().parent.parent
ROOT = DOCS.parent
GENERATED = DOCS / "_generated"


def _report_module():
    """benchmarks/report.py, loaded by path (benchmarks/ is not a package)."""
    spec = importlib.util.spec_from_file_location("hxmpi_report", ROOT / "benchmarks" / "report.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def presets_markdown() -> str:
    """The simulator's presets as a Markdown table: latency and bandwidth between and inside
    nodes, CPU per message, copy bandwidth and hxmpi's fixed costs per call."""
    from hxmpi.sim.presets import PRESETS

    def link(alpha, beta):
        return f"{alpha * 1e6:.2f} us, {1e-9 / beta:.1f} GB/s"
    rows = ["| preset | inter-node | intra-node | per message | copy | fixed per call |",
            "| --- | --- | --- | --- | --- | --- |"]
    rows += [f"| `{name}` | {link(m.alpha_inter, m.beta_inter)} | {link(m.alpha_intra, m.beta_intra)} | "
             f"{m.msg_overhead * 1e6:.2f} us | {1e-9 / m.beta_copy:.1f} GB/s | "
             f"{m.overhead_flat * 1e6:.0f} us flat, {m.overhead_hier * 1e6:.0f} us hier |" for name, m in PRESETS.items()]
    return "\n".join(rows)


def generate(out: Path = GENERATED) -> None:
    """Write the flag table, the presets table and the performance fragments under ``out``."""
    from hxmpi.train.command import flags_markdown
    out.mkdir(parents=True, exist_ok=True)
    (out / "flags.md").write_text(flags_markdown() + "\n")
    (out / "presets.md").write_text(presets_markdown() + "\n")
    _report_module().main([str(out / "performance")])


def _on_builder_inited(app):
    generate()


def setup(app):
    app.connect("builder-inited", _on_builder_inited)
    return {"version": "1", "parallel_read_safe": True, "parallel_write_safe": True}
