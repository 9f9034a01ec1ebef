"""The documentation: the Sphinx site builds without warnings, its code and examples run.

The build needs the ``docs`` extra (Sphinx, pydata-sphinx-theme, numpydoc,
sphinx-gallery, sphinx-copybutton, matplotlib) and skips without it; it runs
the gallery examples in ``docs/examples`` on the CPU.
"""

import doctest
import importlib
import os
import pathlib
import pkgutil
import re
import subprocess
import sys
import textwrap

import pytest

import numbapos

ROOT = pathlib.Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"

# Every module of the package except the kernels (launchers, no docstring examples;
# the CUDA ones import numba.cuda) and the command line.
MODULES = sorted(
    info.name for info in pkgutil.walk_packages(numbapos.__path__, "numbapos.")
    if not info.name.startswith("numbapos.kernels") and info.name != "numbapos.__main__"
)


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name):
    module = importlib.import_module(name)
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE,
                             verbose=False, report=True)
    assert result.failed == 0, f"{result.failed} docstring example(s) failed in {name}"


def test_docstring_examples_exist():
    finder = doctest.DocTestFinder()
    examples = sum(len(test.examples) for name in MODULES
                   for test in finder.find(importlib.import_module(name)))
    assert examples >= 5


def page_blocks(page):
    """The ``.. code-block:: python`` blocks of a page, less those marked ``:class: sketch``."""
    blocks = re.findall(r"\.\. code-block:: python\n((?:   :.*\n)*)\n((?:   .*\n|\n)+)",
                        page.read_text())
    return [textwrap.dedent(code) for options, code in blocks if "sketch" not in options]


PAGES = sorted(p.relative_to(DOCS).as_posix() for p in DOCS.rglob("*.rst")
               if "_build" not in p.parts and "auto_examples" not in p.parts
               and "generated" not in p.parts and page_blocks(p))


def test_pages_have_code():
    assert {"getting_started.rst", "guide/embeddings.rst", "guide/positions.rst",
            "guide/blocks.rst", "guide/gpu.rst"} <= set(PAGES)


@pytest.mark.parametrize("page", PAGES)
def test_page_code_runs_in_order(page):
    namespace = {"__name__": "__docs__"}
    for number, code in enumerate(page_blocks(DOCS / page), start=1):
        exec(compile(code, f"docs/{page} python block {number}", "exec"), namespace)


# The whole site with the gallery's examples run: half a minute of the default run's
# time on these 2-core machines, so it runs with the exhaustive sweeps (pytest -m
# exhaustive, which CI runs too); the pages' code and the docstring examples above
# run by default.
@pytest.mark.exhaustive
def test_sphinx_build_has_no_warnings(tmp_path):
    for module in ("sphinx", "pydata_sphinx_theme", "numpydoc", "sphinx_gallery",
                   "sphinx_copybutton", "matplotlib", "safetensors"):
        pytest.importorskip(module)
    env = dict(os.environ, MPLBACKEND="Agg")
    result = subprocess.run(
        [sys.executable, "-m", "sphinx", "-W", "--keep-going", "-b", "html", "-q",
         "-d", str(tmp_path / "doctrees"), str(DOCS), str(tmp_path / "html")],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600,
    )
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    html = tmp_path / "html"
    for page in ("index.html", "api.html", "guide/blocks.html",
                 "auto_examples/plot_demo_training.html", "generated/numbapos.nn.Embedding.html"):
        assert (html / page).exists(), page
    # The gallery's plots were made by this build's run of the examples (or an earlier one).
    assert list((html / "_images").glob("sphx_glr_plot_demo_training_*.png"))
