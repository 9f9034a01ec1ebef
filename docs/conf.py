"""Sphinx configuration of the numbapos documentation.

Build from the repository root with ``python -m sphinx -W -b html docs docs/_build/html``.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

# The gallery runs on the CPU; plots go to files, never to a window.
os.environ.setdefault("MPLBACKEND", "Agg")

import numbapos  # noqa: E402

project = "numbapos"
author = "the numbapos developers"
copyright = "the numbapos developers"  # noqa: A001
release = numbapos.__version__
version = release

extensions = [
    "sphinx.ext.autodoc",
    "sphinx.ext.autosummary",
    "numpydoc",
    "sphinx_copybutton",
    "sphinx_gallery.gen_gallery",
]

exclude_patterns = ["_build", "examples", "**.ipynb_checkpoints"]
templates_path = ["_templates"]

# ------------------------------------------------------------------ API reference

autosummary_generate = True
autosummary_imported_members = False
autodoc_default_options = {"members": True, "inherited-members": False}
autodoc_typehints = "none"
autodoc_preserve_defaults = True  # dtype=np.float32, not <class ...>
# numpydoc renders the sections; autosummary builds the member tables itself.
numpydoc_show_class_members = False
numpydoc_class_members_toctree = False
numpydoc_xref_param_type = False
numpydoc_validation_checks: set[str] = set()

# ------------------------------------------------------------------ gallery

sphinx_gallery_conf = {
    "examples_dirs": "examples",
    "gallery_dirs": "auto_examples",
    "filename_pattern": r"/plot_",
    "abort_on_example_error": True,
    # Plots are made by every build, not taken from an earlier one.
    "run_stale_examples": True,
    "only_warn_on_example_error": False,
    "download_all_examples": False,
    "remove_config_comments": True,
    "show_memory": False,
    "plot_gallery": "True",
    "within_subsection_order": "FileNameSortKey",
}

# ------------------------------------------------------------------ HTML

html_theme = "pydata_sphinx_theme"
html_title = f"numbapos {release}"
html_theme_options = {
    "navbar_align": "left",
    "show_toc_level": 2,
    "secondary_sidebar_items": ["page-toc"],
    "footer_start": ["copyright"],
    "footer_end": [],
}
html_static_path: list[str] = []
html_show_sourcelink = False

copybutton_prompt_text = r">>> |\.\.\. |\$ "
copybutton_prompt_is_regexp = True
