"""Argument validation shared by the public solver functions (run when the graph is built)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

import numpy as np
import pytensor.tensor as pt
from pytensor.tensor.variable import TensorVariable

from pymc_optim.backends.newton import DEFAULT_MAX_ITER, DEFAULT_TOL
from pymc_optim.graph.inner_graph import (
    InnerProblem,
    as_control_variables,
    as_expression,
    build_inner_problem,
    cast_initial_guess,
)
from pymc_optim.graph.solver_op import make_solution
from pymc_optim.graph.trace import trace_limit
from pymc_optim.rewrites.structured_linalg import structure_linalg

__all__ = [
    "as_interval",
    "check_iteration_limit",
    "check_tolerance",
    "newton_options",
    "split_problem",
    "as_scalar_problem",
    "scalar_solution",
    "check_method",
    "check_optimizer_kwargs",
]


def split_problem(
    outputs: Sequence[TensorVariable], xs: Sequence[TensorVariable], *, argument: str = "objective"
) -> InnerProblem:
    """The user's graph split into controls `xs`, parameters and the inner graph
    (:func:`~pymc_optim.graph.inner_graph.build_inner_problem`), with Kronecker and block-diagonal
    matrices factored first (:func:`~pymc_optim.rewrites.structured_linalg.structure_linalg`), so
    that the parameters are the factors (e.g. cholesky(A), cholesky(B)) and not the dense (N, N)
    matrix they would make."""
    return build_inner_problem(structure_linalg(list(outputs)), xs, argument=argument)


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


def newton_options(optimizer_kwargs: dict) -> dict:
    """`tol` and `max_iter` from the user's `optimizer_kwargs` (the only ones Newton takes)."""
    unknown = set(optimizer_kwargs) - {"tol", "max_iter"}
    if unknown:
        raise ValueError(
            "`optimizer_kwargs` of `method='newton'` takes only 'tol' and 'max_iter'; got "
            f"{sorted(unknown)}."
        )
    tol = check_tolerance(optimizer_kwargs.get("tol", DEFAULT_TOL), "optimizer_kwargs['tol']")
    max_iter = check_iteration_limit(
        optimizer_kwargs.get("max_iter", DEFAULT_MAX_ITER), "optimizer_kwargs['max_iter']"
    )
    return {"tol": tol, "max_iter": max_iter}


# --- the scalar solvers (`minimize_scalar`, `root_scalar`) ---------------------------------------
def as_scalar_problem(
    expression, x, *, argument: str, routine: str, vector_routine: str
) -> tuple[TensorVariable, TensorVariable]:
    """The 0-d `expression` (named `argument`) and the 0-d control `x` of a scalar solver."""
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
    expression = pt.as_tensor_variable(as_expression(expression, argument))
    if expression.ndim != 0:
        raise ValueError(
            f"`{argument}` must be a scalar; got `{expression}` with {expression.ndim} dimensions."
        )
    return expression, x


def scalar_solution(op, x0, x: TensorVariable, interval: list, interval_given: bool):
    """``(x_star, success)`` of a scalar solver's `op`, searching `interval` or starting at `x0`."""
    if x0 is None and interval_given:
        x0 = 0.0  # unused when the search interval is given; keeps `x` out of the returned graph
    return make_solution(op, cast_initial_guess(x0, [x], False), interval, False)


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
