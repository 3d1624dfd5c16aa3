"""Validation shared by the public solver functions (run when the graph is built)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from pymc_optim._trace import trace_limit

__all__ = ["check_method", "check_optimizer_kwargs"]


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
            f"`optimizer_kwargs` must be a dict of keyword arguments for scipy; "
            f"got {type(optimizer_kwargs).__name__}."
        )
    for key, fix in reserved.items():
        if key in optimizer_kwargs:
            raise ValueError(f"`optimizer_kwargs` must not contain {key!r}: {fix}")
    trace_limit(optimizer_kwargs)  # validates pymc_optim's own "trace" key (see _trace)
    return dict(optimizer_kwargs)
