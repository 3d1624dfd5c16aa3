"""Validation shared by the public solver functions (run when the graph is built)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import numpy as np

from pymc_optim._trace import trace_limit

__all__ = ["check_iteration_limit", "check_method", "check_optimizer_kwargs", "check_tolerance"]


def check_method(method: str, valid: Iterable[str], routine: str) -> str:
    """Return the canonical spelling of `method` (case-insensitive); raise listing valid ones."""
    valid = tuple(valid)
    if not isinstance(method, str):
        raise TypeError(f"`method` must be a string; got {method!r}.")
    by_lower = {m.lower(): m for m in valid}
    if method.lower() not in by_lower:
        raise ValueError(
            f"`method` {method!r} is not a method of `{routine}`. Valid methods: "
            + ", ".join(repr(m) for m in valid)
            + "."
        )
    return by_lower[method.lower()]


def check_optimizer_kwargs(
    optimizer_kwargs: Mapping | None, *, reserved: Mapping[str, str]
) -> dict:
    """Copy `optimizer_kwargs`, refusing keys the solver sets itself (`reserved`: key -> fix)."""
    if optimizer_kwargs is None:
        return {}
    if not isinstance(optimizer_kwargs, Mapping):
        raise TypeError(
            f"`optimizer_kwargs` must be a dict of keyword arguments for the solver; "
            f"got {type(optimizer_kwargs).__name__} {optimizer_kwargs!r}. Pass a mapping, "
            "e.g. `optimizer_kwargs={'tol': 1e-10}`."
        )
    for key, fix in reserved.items():
        if key in optimizer_kwargs:
            raise ValueError(f"`optimizer_kwargs` must not contain {key!r}: {fix}")
    trace_limit(optimizer_kwargs)  # validates pymc_optim's own "trace" key (see _trace)
    return dict(optimizer_kwargs)


def check_iteration_limit(value, argument: str) -> int:
    """`value` as an iteration limit: an integer ≥ 1 (a float such as 2.5 is refused, not
    truncated)."""
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < 1:
        raise ValueError(
            f"`{argument}` must be an integer of at least 1 (an iteration limit); got "
            f"{value!r}. Pass e.g. `{argument}=100`."
        )
    return int(value)


def check_tolerance(value, argument: str) -> float:
    """`value` as a convergence tolerance: a finite real number > 0."""
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float | np.integer | np.floating)
        or not np.isfinite(value)
        or value <= 0
    ):
        raise ValueError(
            f"`{argument}` must be positive and finite (a convergence tolerance); got "
            f"{value!r}. Pass e.g. `{argument}=1e-8`."
        )
    return float(value)
