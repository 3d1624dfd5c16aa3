"""Sphinx configuration of the pymc_optim documentation site (build: see the README)."""

from pathlib import Path

import pymc_optim

DOCS = Path(__file__).resolve().parent

project = "pymc_optim"
author = "the pymc_optim authors"
copyright = "2026, the pymc_optim authors"
release = version = pymc_optim.__version__

extensions = [
    "sphinx.ext.autodoc",
    "sphinx.ext.autosummary",
    "sphinx.ext.intersphinx",
    "sphinx.ext.mathjax",
    "numpydoc",
    "myst_nb",
    "sphinx_design",
]

# `examples` is a link to the repository's notebooks/ folder: the notebooks are kept (and
# tested) there; their data folders hold READMEs that are not pages of the site.
exclude_patterns = ["_build", "examples/data/**", "**/.ipynb_checkpoints", "jupyter_execute"]
source_suffix = {".rst": "restructuredtext", ".md": "myst-nb", ".ipynb": "myst-nb"}

# ---- API reference: one page per public name, from the public namespace itself -------------
# api.md is generated from pymc_optim.__all__ (and the __all__ of pymc_optim.distributions and
# pymc_optim.datasets) on every build, so a new public name gets its page and a module moved
# inside the package changes nothing here.


def _write_api_page() -> None:
    from pymc_optim import datasets, distributions

    def block(names):
        return "\n".join(f"   {name}" for name in names)

    text = f"""# API reference

Every public name of `pymc_optim` (its `__all__`), then the distributions and the data sets.
The pages are generated from the docstrings; each function's Examples section runs as a doctest
in CI.

```{{eval-rst}}
.. currentmodule:: pymc_optim

.. autosummary::
   :toctree: generated
   :nosignatures:

{block(sorted(pymc_optim.__all__, key=str.lower))}
```

## Distributions

Gaussian Markov random field priors for latent fields, and the BYM2 scaling factor
({{doc}}`user_guide/gmrf`).

```{{eval-rst}}
.. currentmodule:: pymc_optim.distributions

.. autosummary::
   :toctree: generated
   :nosignatures:

{block(sorted(distributions.__all__, key=str.lower))}
```

## Data sets

```{{eval-rst}}
.. currentmodule:: pymc_optim.datasets

.. autosummary::
   :toctree: generated
   :nosignatures:

{block(sorted(datasets.__all__, key=str.lower))}
```
"""
    path = DOCS / "api.md"
    if not path.exists() or path.read_text() != text:
        path.write_text(text)
    # a page generated for a name that is no longer public would be an orphan (a -W error)
    names = {f"pymc_optim.{n}" for n in pymc_optim.__all__}
    names |= {f"pymc_optim.distributions.{n}" for n in distributions.__all__}
    names |= {f"pymc_optim.datasets.{n}" for n in datasets.__all__}
    for stale in (DOCS / "generated").glob("*.rst"):
        if stale.stem not in names:
            stale.unlink()


_write_api_page()

autosummary_generate = True
autosummary_imported_members = True
autodoc_typehints = "none"  # the numpydoc Parameters section carries the types
autodoc_default_options = {"members": True, "inherited-members": False}
numpydoc_show_class_members = False
numpydoc_class_members_toctree = False
numpydoc_xref_param_type = False

intersphinx_mapping = {}  # no network at build time: links to other projects are plain URLs

# ---- notebooks: executed during the build, with a cache -------------------------------------
# "cache": jupyter-cache re-executes a notebook only when its code changed. The test suite
# (tests/test_docs.py) builds with a fresh cache, so every CI run executes each notebook once.
nb_execution_mode = "cache"
nb_execution_timeout = 900  # per cell; only stops a hung kernel (a notebook takes ~1 minute)
nb_execution_raise_on_error = True  # a failing assert cell fails the build
nb_execution_show_tb = True
nb_merge_streams = True
myst_enable_extensions = ["dollarmath", "amsmath", "colon_fence", "deflist"]
myst_heading_anchors = 3

# ---- theme ------------------------------------------------------------------------------------
html_theme = "pydata_sphinx_theme"
html_title = "pymc_optim"
html_theme_options = {
    "navbar_align": "left",
    "show_toc_level": 2,
    "navigation_with_keys": False,
    "footer_start": ["copyright"],
    "footer_end": ["sphinx-version", "theme-version"],
}
html_context = {"default_mode": "light"}
html_static_path = []
html_show_sourcelink = False
