"""The one switch over what importing pymc_optim changes in PyTensor and PyMC.

Every rewrite that can change a graph holding none of pymc_optim's Ops asks :func:`enabled`
when it runs, and every replaced object of PyTensor or PyMC is installed and removed through
:func:`install` — so :func:`disable_rewrites` turns them all off at once and
:func:`enable_rewrites` puts them back.
"""

from __future__ import annotations

from collections.abc import Callable

__all__ = ["disable_rewrites", "enable_rewrites", "enabled", "install", "rewrites_enabled"]

#: Whether the rewrites and replacements act; read by every rewriter when it runs, so a change
#: affects every later compilation in the process.
_ENABLED = True

#: (put in place, take out) of each replacement of a PyTensor or PyMC object, in install order.
_REPLACEMENTS: list[tuple[Callable[[], None], Callable[[], None]]] = []


def enabled() -> bool:
    """Whether the rewrites act (for rewriters to check when they run)."""
    return _ENABLED


def install(put: Callable[[], None], take: Callable[[], None]) -> None:
    """Put a replacement of a PyTensor or PyMC object in place now (if the switch is on), and
    have :func:`disable_rewrites` take it out (`take`) and :func:`enable_rewrites` put it back."""
    _REPLACEMENTS.append((put, take))
    if _ENABLED:
        put()


def disable_rewrites() -> None:
    """Undo, for the rest of the process, every change ``import pymc_optim`` made to PyTensor
    and PyMC.

    After this, a graph that holds none of pymc_optim's Ops compiles exactly as it does in a
    process that never imported pymc_optim, and PyMC's functions are PyMC's own:

    - the structured linear-algebra rewrites (Kronecker and block-diagonal matrices through
      their factors, at compile time and in PyMC's logprob rewrites) and the batched-``slogdet``
      fix are off;
    - the fused-elementwise (``pymc_optim_composite_unique_inputs``) and batched-``Split``
      (``pymc_optim_blockwise_split``) rewrites are off;
    - PyTensor's ``local_useless_switch`` and PyMC's MvNormal log density are PyTensor's and
      PyMC's own objects again.

    What stays: rewrites that match only pymc_optim's Ops (the scalar-Newton specialization of
    one-unknown solves, the merge of copied Laplace-Hessian parts, the removal of the Laplace
    marker, batched graph-native solves), which cannot touch another graph and which the solvers
    need; and the numba and JAX implementations of pymc_optim's Ops. Graphs built while the
    rewrites were on keep their factored form. :func:`enable_rewrites` turns everything back on.

    Examples
    --------
    >>> import pymc_optim as pmo
    >>> pmo.disable_rewrites()
    >>> pmo.rewrites_enabled()
    False
    >>> pmo.enable_rewrites()  # back to the state after import
    """
    global _ENABLED
    if not _ENABLED:
        return
    _ENABLED = False
    for _, take in reversed(_REPLACEMENTS):
        take()


def enable_rewrites() -> None:
    """Undo :func:`disable_rewrites` (the state after ``import pymc_optim``).

    Examples
    --------
    >>> import pymc_optim as pmo
    >>> pmo.disable_rewrites(); pmo.enable_rewrites(); pmo.rewrites_enabled()
    True
    """
    global _ENABLED
    if _ENABLED:
        return
    _ENABLED = True
    for put, _ in _REPLACEMENTS:
        put()


def rewrites_enabled() -> bool:
    """Whether the rewrites and replacements of ``import pymc_optim`` are on (see
    :func:`disable_rewrites`).

    Examples
    --------
    >>> import pymc_optim as pmo
    >>> pmo.rewrites_enabled()  # on after ``import pymc_optim``
    True
    """
    return _ENABLED
