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
# Every member, always: a directive's own ``:members:`` list does not narrow this default (Sphinx
# replaces it with True), so a page selects with ``:inherited-members:`` and ``:exclude-members:``.
autodoc_default_options = {"members": True, "show-inheritance": True}
autodoc_member_order = "bysource"
autodoc_typehints = "none"  # signatures as written; keeps type names out of nitpicky cross-references
autodoc_preserve_defaults = True  # defaults as written in the source (a path default would print this machine's)

# The public docstrings are numpy style (Parameters, Returns, Raises, Examples: tests/test_docs.py
# checks them); instance attributes are listed as fields (``Attributes``), so that they add no
# objects a class's own members would duplicate under ``-W``.
napoleon_numpy_docstring = True
napoleon_google_docstring = False
napoleon_use_param = True
napoleon_use_rtype = False
napoleon_use_ivar = True

html_theme = "furo"
html_title = f"hxmpi {release}"
html_static_path = []


#: Classes whose instances hxmpi makes (a call returns them): their constructors are not public,
#: so the API page shows no signature for them.
MADE_BY_HXMPI = {"hxmpi.HierRequest", "hxmpi.comm.exchange.ExchangeRequest"}


def _no_constructor(app, what, name, obj, options, signature, return_annotation):
    if what == "class" and name in MADE_BY_HXMPI:
        return "", return_annotation
    return None


def setup(app):
    app.connect("autodoc-process-signature", _no_constructor)
