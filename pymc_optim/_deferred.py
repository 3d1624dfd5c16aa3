"""Run a registration when a module is first imported, not before: JAX's dispatch for our Ops.

Importing PyTensor's JAX dispatch imports JAX, which takes seconds (a sixth of
``import pymc_optim`` when it was eager) that a user of the default C backend never needs.
PyTensor imports that module itself when a graph is first compiled with ``mode="JAX"`` (as
PyMC's numpyro and blackjax samplers do), so our ``jax_funcify`` implementations are registered
then, by a finder on ``sys.meta_path`` that runs `register` right after the module has
executed and before the compilation that imported it goes on.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
from collections.abc import Callable

__all__ = ["after_import"]

_PENDING: dict[str, list[Callable[[], None]]] = {}


def after_import(module: str, register: Callable[[], None]) -> None:
    """Call `register()` once `module` is imported: now if it already is, else right after its
    first import (wherever that import happens)."""
    if module in sys.modules:
        register()
        return
    _PENDING.setdefault(module, []).append(register)
    if not any(isinstance(finder, _Finder) for finder in sys.meta_path):
        sys.meta_path.insert(0, _Finder())


class _Finder(importlib.abc.MetaPathFinder):
    """Finds nothing itself: wraps the loader the other finders give a pending module."""

    def find_spec(self, fullname, path, target=None):
        if fullname not in _PENDING:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path, target)
        if spec is None or spec.loader is None:
            return None
        spec.loader = _ThenRegister(spec.loader, fullname)
        return spec


class _ThenRegister(importlib.abc.Loader):
    def __init__(self, loader, fullname: str):
        self._loader = loader
        self._fullname = fullname

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module) -> None:
        self._loader.exec_module(module)
        module.__loader__ = module.__spec__.loader = self._loader  # as if we had not been here
        for register in _PENDING.pop(self._fullname, []):
            register()
