"""An older PyMC, PyTensor or ArviZ is named at import, with the versions needed."""

import pytest

from pymc_optim import _versions


def test_the_installed_stack_passes():
    _versions.check_versions()


def test_an_older_line_is_named_with_the_version_needed(monkeypatch):
    monkeypatch.setitem(_versions.REQUIRED, "pytensor", (99, 1))
    with pytest.raises(ImportError, match=r"pytensor >= 99\.1.*installed: pytensor 3\.\d+"):
        _versions.check_versions()
