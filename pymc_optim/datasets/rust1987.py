"""Rust (1987) bus engine replacement: the data, and a Bellman fixed point inside the likelihood.

Harold Zurcher, superintendent of maintenance of the Madison (Wisconsin) Metropolitan bus
company, decides every month for each bus whether to keep its engine (and pay a maintenance cost
that grows with mileage) or replace it (at cost RC, after which the mileage restarts at 0). Rust
(1987, Econometrica 55(5)) models this as a dynamic discrete choice: in mileage state s the
choice-specific values are

    v(s, keep)    = −c(s) + β EV(s),           c(s) = 0.001 θ₁₁ s,
    v(s, replace) = −RC − c(0) + β EV(0),

with i.i.d. extreme-value shocks, so P(replace | s) = logistic(v(s, replace) − v(s, keep)), and
the expected value function EV solves the Bellman ("logsum") fixed point

    EV = T(EV; θ) = P · log(exp v(·, keep) + exp v(·, replace)),

P the monthly mileage transition matrix (increments of 0, 1, …, J bins with probabilities θ₃,
truncated at the top state). The likelihood of the observed decisions needs EV(θ) and, for
gradient-based estimation or NUTS, dEV/dθ: :func:`expected_value` solves the fixed point with
:func:`pymc_optim.fixed_point` (Newton–Kantorovich: Newton's method on EV − T(EV) = 0) and
differentiates it by the implicit function theorem, never through the iterations.

Contents: :func:`load_rust1987` (raw files → state, decision, increment arrays for any bus groups
and number of states), the first stage (:func:`transition_probabilities`,
:func:`transition_matrix`), the graph builders (:func:`bellman_update`, :func:`expected_value`,
:func:`replacement_logit`, :func:`choice_log_likelihood`) and a PyMC model (:func:`rust_model`).
The data's README (``data/rust1987/README.md`` next to this module) gives the source, the licence,
the processing and the published estimates that ``tests/test_rust1987.py`` reproduces.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from importlib.resources import files
from typing import NamedTuple

import numpy as np
import pytensor.tensor as pt
from pytensor.tensor.variable import TensorVariable

from pymc_optim.fixed_point import fixed_point

__all__ = [
    "GROUP_FILES",
    "MAX_MILEAGE",
    "Rust1987Data",
    "bellman_update",
    "choice_log_likelihood",
    "expected_value",
    "load_rust1987",
    "replacement_logit",
    "rust_model",
    "transition_log_likelihood",
    "transition_matrix",
    "transition_probabilities",
]

#: Rust's bus groups 1-8: file name and rows per bus (11 header rows + monthly odometer readings).
GROUP_FILES = {
    1: ("g870.asc", 36),
    2: ("rt50.asc", 60),
    3: ("t8h203.asc", 81),
    4: ("a530875.asc", 128),
    5: ("a530874.asc", 137),
    6: ("a452374.asc", 137),
    7: ("a530872.asc", 137),
    8: ("a452372.asc", 137),
}
#: The mileage range that Rust splits into n bins (n = 90 gives 5,000-mile bins).
MAX_MILEAGE = 450_000.0
#: Header rows of each bus column; the odometer readings at the 1st and 2nd replacement (0: none).
_HEADER_ROWS = 11
_REPLACEMENT_ODOMETER_ROWS = (5, 8)
#: Maintenance cost scale: c(s) = 0.001 θ₁₁ s, as in Rust's Table IX.
COST_SCALE = 0.001
#: Inner solves stop at max|EV − T(EV)| ≤ 1e-10 (the issue's accuracy requirement).
INNER_TOL = 1e-10


@dataclass(frozen=True)
class Rust1987Data:
    """Bus-month observations, one entry per month (each bus's first month dropped).

    Attributes
    ----------
    state : ndarray of int
        0-based mileage bin s ∈ {0, …, n − 1} in the month (bin s holds mileages in
        (450,000·s/n, 450,000·(s+1)/n], with 0 in bin 0).
    decision : ndarray of int
        1 when the engine is replaced before the next month, else 0.
    increment : ndarray of int
        Bins travelled since the previous month; after a replacement, counted from mileage 0.
    bus : ndarray of int
        Rust's bus id.
    group : ndarray of int
        Rust's bus group (1-8).
    n : int
        Number of mileage states.
    """

    state: np.ndarray
    decision: np.ndarray
    increment: np.ndarray
    bus: np.ndarray
    group: np.ndarray
    n: int

    def __len__(self) -> int:
        return len(self.state)


def load_rust1987(groups: int | Iterable[int] = 4, n: int = 90) -> Rust1987Data:
    """Rust's bus data as (state, decision, increment) arrays, processed as in the paper.

    Parameters
    ----------
    groups : int or iterable of int, default 4
        Rust's bus groups (1-8; Table IX uses group 4, the 1975 GMC A5308 buses).
    n : int, default 90
        Number of mileage states: the bin width is 450,000/n miles (5,000 for n = 90). Mileages
        beyond 450,000 are put in the top state.

    Returns
    -------
    data : Rust1987Data
        One entry per bus-month, buses in file order, months in time order.

    Raises
    ------
    ValueError
        If a group is not one of 1-8 or `n` is not a positive integer.

    Notes
    -----
    The odometer is measured from the last engine replacement. The replacement between months t
    and t + 1 is the first month whose reading reaches the replacement odometer of the bus
    header; then decision_t = 1. The bin of a mileage m is ceil(n·m/450,000) counted from 1, i.e.
    s = ceil(n·m/450,000) − 1 from 0. The increment into month t is s_t − s_{t−1}, or
    ceil(n·m_t/450,000) (bins from mileage 0) after a replacement. Each bus's first month has no
    increment and is dropped.

    Examples
    --------
    >>> from pymc_optim.datasets import load_rust1987
    >>> data = load_rust1987(4, n=90)
    >>> len(data), int(data.decision.sum())
    (4292, 33)
    """
    groups = [groups] if isinstance(groups, int | np.integer) else list(groups)
    unknown = [g for g in groups if g not in GROUP_FILES]
    if unknown or not groups:
        raise ValueError(f"`groups` must be Rust's bus groups 1-8; got {groups}.")
    if int(n) != n or n < 1:
        raise ValueError(f"`n` must be a positive integer number of mileage states; got {n}.")
    n = int(n)
    columns = {k: [] for k in ("state", "decision", "increment", "bus", "group")}
    for group in groups:
        for header, odometer in _read_buses(group):
            state, decision, increment = _process_bus(header, odometer, n)
            columns["state"].append(state[1:])
            columns["decision"].append(decision[1:])
            columns["increment"].append(increment[1:])
            columns["bus"].append(np.full(len(state) - 1, int(header[0])))
            columns["group"].append(np.full(len(state) - 1, group))
    return Rust1987Data(**{k: np.concatenate(v).astype(int) for k, v in columns.items()}, n=n)


def _read_buses(group: int):
    """(header, odometer readings) of every bus in a group's file (stacked column by column)."""
    name, rows = GROUP_FILES[group]
    path = files("pymc_optim.datasets").joinpath("data", "rust1987", name)
    with path.open() as f:
        values = np.loadtxt(f)
    buses = values.reshape((rows, -1), order="F").T
    return [(bus[:_HEADER_ROWS], bus[_HEADER_ROWS:]) for bus in buses]


def _process_bus(header, odometer, n: int):
    """Bins, decisions and increments of one bus, month by month (month 0's increment unused)."""
    mileage = odometer.astype(float).copy()
    decision = np.zeros(len(odometer), dtype=int)
    replaced = np.zeros(len(odometer), dtype=bool)  # replaced between month t − 1 and t
    for row in _REPLACEMENT_ODOMETER_ROWS:
        at = header[row]
        if at <= 0 or not np.any(odometer >= at):
            continue
        t = int(np.argmax(odometer >= at))
        if t > 0:
            decision[t - 1] = 1
            replaced[t] = True
        mileage[t:] = odometer[t:] - at
    bins = np.ceil(n * mileage / MAX_MILEAGE).astype(int)  # 1-based bin of the mileage
    increment = np.zeros(len(odometer), dtype=int)
    increment[1:] = np.where(replaced[1:], bins[1:], np.diff(bins))
    return np.clip(bins - 1, 0, n - 1), decision, increment


# --- first stage: the mileage process -----------------------------------------------------------


def transition_probabilities(increment: np.ndarray) -> np.ndarray:
    """Maximum-likelihood multinomial probabilities θ₃ of increments 0, 1, …, max(increment).

    The first stage of Rust's estimation: the increments' relative frequencies (for group 4 at
    n = 90: 0.3919, 0.5953, 0.0128).
    """
    increment = np.asarray(increment)
    if increment.size == 0 or increment.min() < 0:
        raise ValueError("`increment` must be a non-empty array of non-negative integers.")
    counts = np.bincount(increment)
    return counts / counts.sum()


def transition_log_likelihood(increment: np.ndarray, probabilities: np.ndarray) -> float:
    """Log-likelihood of the increments under multinomial `probabilities`."""
    return float(np.sum(np.log(np.asarray(probabilities)[np.asarray(increment)])))


def transition_matrix(probabilities: np.ndarray, n: int) -> np.ndarray:
    """(n, n) matrix P[s, s'] of moving from bin s to s' when the engine is kept.

    Increments of j bins have probability ``probabilities[j]``; moves past the top state stay
    in it (Rust's truncation), so every row sums to 1.
    """
    probabilities = np.asarray(probabilities, dtype=float)
    P = np.zeros((n, n))
    rows = np.arange(n)
    for j, p_j in enumerate(probabilities):
        np.add.at(P, (rows, np.minimum(rows + j, n - 1)), p_j)
    return P


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

    from pymc_optim._failure import apply_failure_policy, check_on_failure

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


# --- nested fixed point maximum likelihood ------------------------------------------------------


class MLEResult(NamedTuple):
    """Maximum-likelihood estimates of (RC, θ₁₁) and their BHHH standard errors."""

    rc: float
    theta11: float
    se: np.ndarray  # BHHH standard errors of (RC, θ₁₁)
    choice_log_likelihood: float
    log_likelihood: float  # choice + first-stage transition part: Rust's "full" likelihood
    transition_probabilities: np.ndarray
    n_evaluations: int  # log-likelihood-and-gradient evaluations of the outer optimizer
    max_inner_iterations: int  # the most Newton steps any inner solve took
    max_inner_residual: float  # the largest max|x − T(x)| at the end of an inner solve
    success: bool  # outer optimizer converged and every inner solve converged
    optimizer: object  # scipy's OptimizeResult


class RustLikelihood:
    """The choice log-likelihood of Rust's model, compiled once: value, gradient, BHHH scores.

    A nested fixed point (NFXP) estimator: every evaluation solves EV = T(EV; θ) by
    :func:`expected_value` (graph-native Newton) and differentiates through it by the implicit
    function theorem. The transition probabilities are estimated first (Rust's first stage).

    Parameters
    ----------
    data : Rust1987Data
    beta : float
        Discount factor.
    relative : bool, default True
        See :func:`expected_value`.
    mode : str, optional
        PyTensor compilation mode.
    """

    def __init__(self, data: Rust1987Data, beta: float, *, relative: bool = True, mode=None):
        import pytensor

        from pymc_optim import solution_info

        self.data, self.beta = data, beta
        self.probabilities = transition_probabilities(data.increment)
        self.transition = transition_matrix(self.probabilities, data.n)
        self.theta = pt.vector("theta", shape=(2,), dtype="float64")
        rc, theta11 = self.theta[0], self.theta[1]
        self.ev, success, solution = expected_value(
            rc, theta11, self.transition, beta, relative=relative
        )
        info = solution_info(solution)
        # The accuracy requirement is on EV itself: max|EV − T(EV)|, recomputed from EV.
        residual = pt.max(
            pt.abs(self.ev - bellman_update(self.ev, rc, theta11, self.transition, beta))
        )
        loglik = choice_log_likelihood(self.ev, rc, theta11, beta, data.state, data.decision)
        total = loglik.sum()
        self.log_likelihood_and_gradient = pytensor.function(
            [self.theta],
            [total, pt.grad(total, self.theta), success, info.n_iterations, residual],
            mode=mode,
        )
        # BHHH scores: an observation's log-likelihood depends on (state, decision) only, so the
        # Jacobian of the per-observation log-likelihood has one distinct row per pair.
        pairs, self._pair_of_observation = np.unique(
            np.stack([data.state, data.decision], axis=1), axis=0, return_inverse=True
        )
        pair_loglik = choice_log_likelihood(self.ev, rc, theta11, beta, pairs[:, 0], pairs[:, 1])
        self._pair_scores = pytensor.function(
            [self.theta], pytensor.gradient.jacobian(pair_loglik, self.theta), mode=mode
        )

    def scores(self, theta) -> np.ndarray:
        """(N, 2) per-observation scores ∂ log P(d_i | s_i)/∂(RC, θ₁₁)."""
        return self._pair_scores(np.asarray(theta, dtype="float64"))[
            self._pair_of_observation.ravel()
        ]

    def fit(self, x0=(5.0, 5.0), *, gtol: float = 1e-5, standard_errors: bool = True) -> MLEResult:
        """Maximize the choice log-likelihood by BFGS on the compiled value and gradient.

        `gtol` bounds max|∇ log L| at the answer: 1e-5 puts the estimates within ~1e-5 of the
        maximum (the curvature is ~0.4 in RC and ~2.5 in θ₁₁ at β = 0.9999), far below the
        published digits; BFGS may stop on "precision loss" just below it, which is fine.
        Without `standard_errors` the scores are not evaluated (``se`` is NaN).
        """
        from scipy.optimize import minimize

        inner = {"iterations": 0, "residual": 0.0, "success": True}

        def negative(theta):
            value, gradient, success, n_iterations, residual = self.log_likelihood_and_gradient(
                np.asarray(theta, dtype="float64")
            )
            inner["iterations"] = max(inner["iterations"], int(n_iterations))
            inner["residual"] = max(inner["residual"], float(residual))
            inner["success"] &= bool(success)
            return -float(value), -gradient

        # scipy's own gtol is set 10x tighter so that it does not stop just above ours.
        result = minimize(
            negative,
            np.asarray(x0, dtype="float64"),
            jac=True,
            method="BFGS",
            options={"gtol": gtol / 10},
        )
        if standard_errors:
            scores = self.scores(result.x)
            se = np.sqrt(np.diag(np.linalg.inv(scores.T @ scores)))
        else:
            se = np.full(2, np.nan)
        choice = -float(result.fun)
        transition = transition_log_likelihood(self.data.increment, self.probabilities)
        return MLEResult(
            rc=float(result.x[0]),
            theta11=float(result.x[1]),
            se=se,
            choice_log_likelihood=choice,
            log_likelihood=choice + transition,
            transition_probabilities=self.probabilities,
            n_evaluations=int(result.nfev),
            max_inner_iterations=inner["iterations"],
            max_inner_residual=inner["residual"],
            success=bool(np.max(np.abs(result.jac)) <= gtol) and inner["success"],
            optimizer=result,
        )
