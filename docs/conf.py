"""Sphinx configuration of hxmpi's docs. Offline by design: no intersphinx, no remote assets.

Build: ``sphinx-build -W --keep-going -b html docs docs/_build/html``. The flag table and the
performance tables are generated at build time by ``_ext/hxmpi_docs.py`` into ``docs/_generated/``
(not committed).
"""
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE / "_ext"))

import hxmpi  # noqa: E402  (installed with pip install -e '.[docs]'; also keeps Open MPI's UCX osc out)

project = "hxmpi"
author = "hxmpi developers"
copyright = "hxmpi developers"
release = version = hxmpi.__version__

extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
    "sphinx.ext.autosummary",
    "sphinx.ext.napoleon",
    "hxmpi_docs",
]
source_suffix = {".md": "markdown", ".rst": "restructuredtext"}
root_doc = "index"
exclude_patterns = ["_build", "_generated", "Thumbs.db", ".DS_Store"]
myst_heading_anchors = 3
myst_enable_extensions = ["colon_fence"]

autosummary_generate = True
autosummary_ignore_module_all = False  # a module's summary lists its __all__ (tests/test_docs.py keeps it whole)
autodoc_default_options = {"members": True, "show-inheritance": True}
autodoc_member_order = "bysource"
autodoc_typehints = "none"  # signatures as written; keeps type names out of nitpicky cross-references
autodoc_preserve_defaults = True  # defaults as written in the source (a path default would print this machine's)

html_theme = "furo"
html_title = f"hxmpi {release}"
html_static_path = []
