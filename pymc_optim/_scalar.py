"""Argument handling shared by the scalar solvers (`minimize_scalar`, `root_scalar`)."""

from __future__ import annotations

from collections.abc import Sequence

import pytensor.tensor as pt
from pytensor.tensor.variable import TensorVariable

from pymc_optim._inner_graph import as_control_variables

__all__ = ["as_interval", "as_scalar_control", "as_scalar_expression"]


def as_scalar_control(x, routine: str, vector_routine: str) -> TensorVariable:
    if isinstance(x, list | tuple):
        raise TypeError(
            f"`x` of `{routine}` must be a single 0-d variable, not a list; "
            f"use `{vector_routine}` for several unknowns."
        )
    (x,), _ = as_control_variables(x)
    if x.ndim != 0:
        raise ValueError(
            f"`x` of `{routine}` must be 0-d; got `{x}` with {x.ndim} dimensions. "
            f"Use `{vector_routine}` for tensors."
        )
    return x


def as_scalar_expression(expr, argument: str) -> TensorVariable:
    expr = pt.as_tensor_variable(expr)
    if expr.ndim != 0:
        raise ValueError(
            f"`{argument}` must be a scalar; got `{expr}` with {expr.ndim} dimensions."
        )
    return expr


def as_interval(values: Sequence, argument: str, lengths: tuple[int, ...]) -> list[TensorVariable]:
    """Numbers or scalar expressions, as float64 scalar variables."""
    if not isinstance(values, list | tuple) or len(values) not in lengths:
        raise ValueError(
            f"`{argument}` must be a tuple of {' or '.join(map(str, lengths))} numbers or scalar "
            f"expressions; got {values!r}."
        )
    out = []
    for v in values:
        v = pt.as_tensor_variable(v)
        if v.ndim != 0:
            raise ValueError(f"`{argument}` must hold scalars; got `{v}` with {v.ndim} dimensions.")
        out.append(v.astype("float64"))
    return out
