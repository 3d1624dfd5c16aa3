"""Rust (1987) model: the Bellman fixed point EV(θ) and the choice likelihood, as graphs."""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import pytensor.tensor as pt
from pytensor.tensor.variable import TensorVariable

from pymc_optim.datasets.rust1987.data import (
    Rust1987Data,
    transition_matrix,
    transition_probabilities,
)
from pymc_optim.problems.fixed_point import fixed_point

__all__ = [
    "COST_SCALE",
    "INNER_TOL",
    "bellman_update",
    "choice_log_likelihood",
    "expected_value",
    "replacement_logit",
    "rust_model",
]

#: Maintenance cost scale: c(s) = 0.001 θ₁₁ s, as in Rust's Table IX.
COST_SCALE = 0.001
#: Inner solves stop at max|EV − T(EV)| ≤ 1e-10: far below the outer optimizer's gtol, so EV(θ)
#: is exact to what the likelihood can see.
INNER_TOL = 1e-10


# --- the model: Bellman fixed point and choice likelihood ---------------------------------------


def bellman_update(ev, rc, theta11, transition, beta) -> TensorVariable:
    """T(EV; θ) = P · logsumexp(v(·, keep), v(·, replace)), the logsum Bellman operator.

    The log-sum-exp subtracts the larger of the two values first, so it is exact for values of
    any size (EV is of order 1/(1 − β) at β near 1).
    """
    ev = pt.as_tensor_variable(ev)
    cost = COST_SCALE * theta11 * pt.arange(ev.shape[0], dtype="float64")
    v_keep = -cost + beta * ev
    v_replace = -rc - cost[0] + beta * ev[0]
    top = pt.maximum(v_keep, v_replace)
    logsum = top + pt.log(pt.exp(v_keep - top) + pt.exp(v_replace - top))
    return pt.dot(pt.as_tensor_variable(transition), logsum)


class ExpectedValue(NamedTuple):
    """What :func:`expected_value` returns.

    ev : the expected value function EV(θ), shape (n,).
    success : boolean scalar, whether the inner solve converged.
    solution : the solver's own output (EV itself, or the relative value function h =
        EV − EV(0)); pass it to :func:`pymc_optim.solution_info` for iterations and residual.
    """

    ev: TensorVariable
    success: TensorVariable
    solution: TensorVariable


def expected_value(
    rc,
    theta11,
    transition,
    beta: float,
    *,
    relative: bool = True,
    method: str = "newton",
    tol: float = INNER_TOL,
    max_iter: int | None = None,
    x0=None,
) -> ExpectedValue:
    """EV(θ) solving EV = T(EV; θ), with implicit gradients, via :func:`pymc_optim.fixed_point`.

    Parameters
    ----------
    rc, theta11 : scalar TensorVariable or float
        Replacement cost RC and maintenance cost slope θ₁₁.
    transition : (n, n) array
        Mileage transition matrix, see :func:`transition_matrix`.
    beta : float
        Discount factor in [0, 1).
    relative : bool, default True
        Solve for the relative value function h = EV − EV(0) (below) instead of EV itself.
    method : {"newton", "anderson", "iteration"}, default "newton"
        Passed to :func:`pymc_optim.fixed_point`. ``"newton"`` is Rust's Newton–Kantorovich
        step; ``"iteration"`` (value iteration) needs about log(tol)/log(β) sweeps, ~2·10⁵ at
        β = 0.9999.
    tol : float, default 1e-10
        Stop when max|x − T(x)| ≤ tol (the same residual as EV's, see Notes).
    max_iter : int, optional
        The solver's iteration limit (its default when ``None``).
    x0 : array, optional
        Initial guess (zeros when ``None``).

    Returns
    -------
    result : ExpectedValue
        ``(ev, success, solution)``; when the solve fails, ``success`` is False and ``ev`` is
        built from the last iterate.

    Notes
    -----
    Conditioning. ∂T/∂EV = β P Π with Π a stochastic matrix (keep with probability p_k(s'),
    move to state 0 otherwise), so I − ∂T/∂EV has the eigenvalue 1 − β along the constant
    vector: at β = 0.9999 the Newton and implicit-gradient solves with it have condition number
    ~10⁴, and EV itself is of order 1/(1 − β). Since T(EV + k) = T(EV) + βk, the fixed point is
    EV = h + k with h = T(h) − T(h)(0) (relative value iteration: H(h) = H(h + k), so the
    constant direction of I − ∂H/∂h has eigenvalue 1) and k = T(h)(0)/(1 − β). Then
    EV − T(EV) = h − H(h) exactly, so the solver's residual is EV's. The likelihood depends on EV
    only through EV(s) − EV(0) = h(s).
    """
    transition = pt.as_tensor_variable(np.asarray(transition, dtype="float64"))
    n = int(transition.type.shape[0])
    x = pt.vector("ev" if not relative else "h", shape=(n,), dtype="float64")
    update = bellman_update(x, rc, theta11, transition, beta)
    if relative:
        update = update - pt.dot(np.eye(n)[0], update)
    options = {} if max_iter is None else {"max_iter": max_iter}
    solution, success = fixed_point(
        update,
        x,
        x0=np.zeros(n) if x0 is None else x0,
        method=method,
        tol=tol,
        **options,
    )
    if relative:
        ev = solution + bellman_update(solution, rc, theta11, transition, beta)[0] / (1.0 - beta)
    else:
        ev = solution
    return ExpectedValue(ev, success, solution)


def replacement_logit(ev, rc, theta11, beta) -> TensorVariable:
    """v(s, replace) − v(s, keep) for every state s: the log-odds of replacing."""
    ev = pt.as_tensor_variable(ev)
    cost = COST_SCALE * theta11 * pt.arange(ev.shape[0], dtype="float64")
    return -rc + cost - cost[0] + beta * (ev[0] - ev)


def choice_log_likelihood(ev, rc, theta11, beta, state, decision) -> TensorVariable:
    """log P(decision_i | state_i) for every observation (a vector, for sums and BHHH scores)."""
    z = replacement_logit(ev, rc, theta11, beta)[np.asarray(state)]
    decision = np.asarray(decision)
    # log σ(z) = −softplus(−z), log(1 − σ(z)) = −softplus(z): exact in both tails.
    return pt.switch(decision == 1, -pt.softplus(-z), -pt.softplus(z))


def rust_model(
    data: Rust1987Data,
    beta: float,
    *,
    transition=None,
    rc_prior_sd: float = 20.0,
    theta11_prior_sd: float = 20.0,
    flat_priors: bool = False,
    on_failure: str = "reject",
    **expected_value_kwargs,
):
    """The choice part of Rust's model as a PyMC model, EV solved inside it.

    Parameters
    ----------
    data : Rust1987Data
    beta : float
        Discount factor.
    transition : (n, n) array, optional
        Defaults to the first-stage estimate from `data`'s increments.
    rc_prior_sd, theta11_prior_sd : float, default 20
        Scales of the weakly informative half-normal priors on RC and θ₁₁ (their published
        values at β = 0.9999 are 10 and 2.3).
    flat_priors : bool, default False
        Use improper flat priors on (0, ∞) instead: the MAP is then the MLE.
    on_failure : {"reject", "raise", "warn"}, default "reject"
        What an unconverged EV solve does to the log density (the package's shared policy):
        ``"reject"`` makes it −inf (NUTS rejects the point), ``"raise"`` raises, ``"warn"``
        warns and uses the last iterate.
    **expected_value_kwargs
        Passed to :func:`expected_value`.

    Returns
    -------
    model : pm.Model
        Free variables ``RC`` and ``theta11``; deterministics ``ev``, ``p_replace`` (per state)
        and ``ev_converged``; the observed ``decision`` (Bernoulli with logit v_replace − v_keep);
        the potential ``ev_failure`` (0, or the `on_failure` policy where EV did not converge).
    """
    import pymc as pm

    from pymc_optim.model.failure import apply_failure_policy, check_on_failure

    check_on_failure(on_failure)

    if transition is None:
        transition = transition_matrix(transition_probabilities(data.increment), data.n)
    with pm.Model(coords={"state": np.arange(data.n)}) as model:
        if flat_priors:
            rc = pm.HalfFlat("RC")
            theta11 = pm.HalfFlat("theta11")
        else:
            rc = pm.HalfNormal("RC", sigma=rc_prior_sd)
            theta11 = pm.HalfNormal("theta11", sigma=theta11_prior_sd)
        ev, success, _ = expected_value(rc, theta11, transition, beta, **expected_value_kwargs)
        logit = replacement_logit(ev, rc, theta11, beta)
        pm.Deterministic("ev", ev, dims="state")
        pm.Deterministic("p_replace", pm.math.sigmoid(logit), dims="state")
        pm.Deterministic("ev_converged", success)
        pm.Bernoulli("decision", logit_p=logit[data.state], observed=data.decision)
        message = "the Bellman fixed point EV = T(EV) did not converge"
        pm.Potential(
            "ev_failure", apply_failure_policy(pt.constant(0.0), success, on_failure, message)
        )
    return model
