"""Model plumbing for agents' problems: an optimal choice or an equilibrium as a model variable.

Inside a ``pm.Model``, :func:`Optimum` and :func:`Equilibrium` solve a problem whose parameters
are model variables, register the solution as a Deterministic (with dims), apply a failure
policy, and register the solver's diagnostics next to it. They read like ``pm.Deterministic``:

>>> import numpy as np, pymc as pm, pytensor.tensor as pt
>>> import pymc_optim as pmo
>>> with pm.Model(coords={"asset": ["a", "b"]}) as model:
...     gamma = pm.LogNormal("gamma", 1.0, 0.5)
...     w = pt.vector("w", shape=(2,))
...     objective = -(w @ np.array([0.05, 0.03])) + 0.5 * gamma * (w**2 * 0.04).sum()
...     budget = {"type": "eq", "fun": w.sum() - 1.0}
...     w_star = pmo.Optimum("w_star", objective, w, x0=[0.5, 0.5], constraints=budget,
...                          dims="asset")
>>> sorted(model.named_vars)
['gamma', 'w_star', 'w_star_failed', 'w_star_n_iterations', 'w_star_success']
"""

from __future__ import annotations

from collections.abc import Sequence

from pytensor.tensor.variable import TensorVariable

from pymc_optim.graph.diagnostics import solution_info
from pymc_optim.model.failure import ON_FAILURE, check_on_failure, guard_solution
from pymc_optim.problems.minimize import minimize
from pymc_optim.problems.root import root

__all__ = ["ON_FAILURE", "Equilibrium", "Optimum"]


def Optimum(  # noqa: N802  (named like pm.Deterministic, which it extends)
    name: str,
    objective: TensorVariable,
    x: TensorVariable,
    *,
    dims: str | Sequence[str] | None = None,
    on_failure: str = "reject",
    diagnostics: bool = True,
    **minimize_kwargs,
) -> TensorVariable:
    """An agent's optimal choice x* = argminₓ `objective` as a named Deterministic of the model.

    Parameters
    ----------
    name : str
        Name of the Deterministic holding x*.
    objective : TensorVariable
        Scalar expression of `x` and of model variables (the parameters), as for
        :func:`minimize`. Maximize u by minimizing −u.
    x : TensorVariable
        The choice: one root variable of the objective's graph.
    dims : str or sequence of str, optional
        Dims of x* (as for ``pm.Deterministic``).
    on_failure : {"reject", "raise", "warn"}, default "reject"
        What a failed solve (``success`` False) does. "reject": the model's log density is −inf
        there (a ``pm.Potential`` named ``{name}_failed``), so samplers reject the point and
        an unconverged answer never enters the likelihood (the returned variable is 0 there).
        "raise": evaluating the model raises an ``AssertionError`` naming `name`. "warn": emits
        a :class:`PymcOptimWarning` at each failed evaluation and passes the unconverged x on.
        With bounds or constraints, a degenerate active set (a constraint on its bound with a
        zero multiplier, where x*(θ) has a kink; see :mod:`pymc_optim.problems.constrained`) and
        infeasible constraints count as failures too. Failed evaluations are counted:
        ``pmo.failure_summary(idata)`` reports them after sampling (exactly with
        ``pm.sample(step=pmo.CountingNUTS())``).
    diagnostics : bool, default True
        Also register ``{name}_success`` and ``{name}_n_iterations`` as Deterministics, so that
        the trace records them for accepted draws (``pmo.solution_info`` gives more on the raw
        solution). A name already in the model is an error, never overwritten.
    **minimize_kwargs
        Passed to :func:`minimize`: ``x0``, ``method``, ``bounds``, ``constraints``,
        ``optimizer_kwargs``, ...

    Returns
    -------
    x_star : TensorVariable
        The registered Deterministic (differentiable by the implicit rule; with bounds or
        constraints, through the KKT conditions).

    Examples
    --------
    A firm's output q* maximizing the profit 2q − c q², so q* = 1/c, and its sensitivity to the
    cost parameter c, dq*/dc = −1/c², by the implicit rule:

    >>> import pymc as pm, pytensor.tensor as pt
    >>> import pymc_optim as pmo
    >>> with pm.Model() as model:
    ...     c = pm.LogNormal("c", 0.0, 0.5)
    ...     q = pt.scalar("q")
    ...     q_star = pmo.Optimum("q_star", c * q**2 - 2.0 * q, q, x0=1.0)
    >>> round(float(q_star.eval({c: 4.0})), 6)
    0.25
    >>> round(float(pt.grad(q_star, c).eval({c: 4.0})), 6)
    -0.0625
    """
    _check_single(x, "Optimum")
    check_on_failure(on_failure)
    x_star, success = minimize(objective, x, **minimize_kwargs)
    return _register(name, x_star, success, dims, on_failure, diagnostics)


def Equilibrium(  # noqa: N802  (named like pm.Deterministic, which it extends)
    name: str,
    equations: TensorVariable | Sequence[TensorVariable],
    x: TensorVariable,
    *,
    dims: str | Sequence[str] | None = None,
    on_failure: str = "reject",
    diagnostics: bool = True,
    **root_kwargs,
) -> TensorVariable:
    """An equilibrium x* solving ``equations(x, θ) = 0`` as a named Deterministic of the model.

    Parameters are those of :func:`Optimum`, with `equations` (expressions of `x` and of model
    variables, as for :func:`root`) in place of the objective and ``**root_kwargs`` passed to
    :func:`root` (``x0``, ``method``, ``jac``, ``optimizer_kwargs``, ...).

    Returns
    -------
    x_star : TensorVariable
        The registered Deterministic.

    Examples
    --------
    A market clearing price p*: demand a/p equals supply p.

    >>> import pymc as pm, pytensor.tensor as pt
    >>> import pymc_optim as pmo
    >>> with pm.Model() as model:
    ...     a = pm.LogNormal("a", 0.0, 0.3)
    ...     p = pt.scalar("p")
    ...     price = pmo.Equilibrium("price", a / p - p, p, x0=1.0)
    >>> round(float(price.eval({a: 4.0})), 10)
    2.0
    """
    _check_single(x, "Equilibrium")
    check_on_failure(on_failure)
    x_star, success = root(equations, x, **root_kwargs)
    return _register(name, x_star, success, dims, on_failure, diagnostics)


def _check_single(x, helper: str) -> None:
    if isinstance(x, list | tuple):
        raise TypeError(
            f"`x` of `{helper}` must be one variable, registered under one name; got a list of "
            f"{len(x)}. Call `{helper}` once per variable, or concatenate them."
        )


def _register(name, x_star, success, dims, on_failure, diagnostics):
    import pymc as pm

    model = _check_names(name, diagnostics, on_failure)
    info = solution_info(x_star)
    messages = {
        "reject": f"The solve for `{name}` failed (success=False; on_failure='reject')",
        "raise": f"The solve for `{name}` failed (success=False); on_failure='raise'. Use "
        "on_failure='reject' to let the sampler reject such parameter values instead.",
        "warn": f"The solve for `{name}` failed (success=False; on_failure='warn')",
    }
    # counted once per evaluation of the log density (see pmo.failure_summary)
    x_used, term = guard_solution(
        x_star, success, on_failure, messages[on_failure], label=f"the solve for `{name}`"
    )
    if term is not None:
        pm.Potential(f"{name}_failed", term, model=model)
    x_det = pm.Deterministic(name, x_used, dims=dims, model=model)
    if diagnostics:
        pm.Deterministic(f"{name}_success", info.success, model=model)
        pm.Deterministic(f"{name}_n_iterations", info.n_iterations, model=model)
    return x_det


def _check_names(name, diagnostics: bool, on_failure: str):
    """The model on the context stack, after checking that none of the names `name` registers
    is taken (PyMC's own error would not say which helper registered it)."""
    import pymc as pm

    if not isinstance(name, str) or not name:
        raise TypeError(f"`name` must be a non-empty string; got {name!r}.")
    try:
        model = pm.modelcontext(None)
    except TypeError:
        raise TypeError(
            f"`Optimum`/`Equilibrium` {name!r} must be called inside a model context "
            "(`with pm.Model(): ...`): it registers model variables. To solve outside a model, "
            "use `pmo.minimize` or `pmo.root`."
        ) from None
    registered = [name]
    if on_failure == "reject":
        registered.append(f"{name}_failed")
    if diagnostics:
        registered += [f"{name}_success", f"{name}_n_iterations"]
    taken = [n for n in registered if n in model.named_vars]
    if taken:
        raise ValueError(
            f"`name` {name!r} registers {registered}, but the model already has "
            f"{taken}. Choose another `name`"
            + (", or pass `diagnostics=False`." if diagnostics else ".")
        )
    return model
