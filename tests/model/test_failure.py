"""Failures under sampling: counted per chain (rejected proposals included) and reported by
`pmo.failure_summary`, for agents and for the Laplace marginal, with one and two cores.

The models fail on a known part of the parameter space (an objective or likelihood that is NaN
there), where nothing else can diverge: a 1-d Gaussian target whose only non-finite values come
from the failed solves. So every failed evaluation must be a divergence and every divergence a
failed evaluation — the counts are compared exactly.
"""

from __future__ import annotations

import warnings

import arviz as az
import numpy as np
import pymc as pm
import pytensor.tensor as pt
import pytest

import pymc_optim as pmo
from pymc_optim.graph.status import SolverStatus
from pymc_optim.model.failure import (
    FAILED_EVALUATIONS,
    FAILED_EVALUATIONS_BY_REASON,
    count_failures,
    solve_status,
)

SAMPLE = dict(tune=50, draws=50, chains=2, random_seed=11, progressbar=False)
SAMPLE["compute_convergence_checks"] = False


def nan_agent_model(on_failure: str = "reject") -> pm.Model:
    """x*(a) = a, but the objective is NaN for a > 1: the solve fails there."""
    with pm.Model() as model:
        a = pm.Normal("a", 0.0, 1.0)
        x = pt.scalar("x")
        objective = pt.switch(a > 1.0, np.nan, (x - a) ** 2)
        x_star = pmo.Optimum("x_star", objective, x, x0=0.0, on_failure=on_failure)
        pm.Normal("y", x_star, 1.0, observed=[0.3])
    return model


def nan_laplace_model() -> pm.Model:
    """A Gaussian latent whose likelihood is NaN for c < 0 (√c scales the latent)."""
    y = np.array([0.2, -0.4, 1.0, 0.5, 0.1, -0.3])
    with pm.Model() as model:
        c = pm.Normal("c", 0.5, 1.0)
        x = pm.Normal("x", 0.0, 1.0, shape=3)
        pm.Normal("y", x[np.arange(6) % 3] * pt.sqrt(c), 1.0, observed=y)
    return pmo.marginalize_laplace(model, "x")


def two_reason_agent_model() -> pm.Model:
    """x*(a) = a by Newton within 3 iterations, which fails for a > 1 (the objective is NaN:
    "nonfinite") and for a < -1 (a quartic, which Newton approaches only linearly from x0 = 0:
    "max_iter"); between them a quadratic, solved in one step."""
    with pm.Model() as model:
        a = pm.Normal("a", 0.0, 1.0)
        x = pt.scalar("x")
        quadratic = (x - a) ** 2
        objective = pt.switch(
            a > 1.0, np.nan, pt.switch(a < -1.0, quadratic**2 + quadratic, quadratic)
        )
        # max_iter 3: the quadratic needs one iteration, the quartic more than ten from |a| > 1
        x_star = pmo.Optimum(
            "x_star", objective, x, x0=0.0, method="newton", optimizer_kwargs={"max_iter": 3}
        )
        pm.Normal("y", x_star, 1.0, observed=[0.3])
    return model


def _by_reason(label) -> dict[str, int]:
    return {reason: n for (lab, reason), n in FAILED_EVALUATIONS_BY_REASON.items() if lab == label}


def _sample(model, cores):
    with model:
        return pm.sample(step=pmo.CountingNUTS(), cores=cores, **SAMPLE)


def _summary_expecting_the_warning(idata):
    with pytest.warns(pmo.PymcOptimWarning, match="Inner solves failed in more than 1% of the"):
        return pmo.failure_summary(idata)


@pytest.mark.parametrize("cores", [1, 2])
def test_failed_solves_of_an_agent_are_counted_per_chain(cores):
    idata = _sample(nan_agent_model(), cores)
    summary = _summary_expecting_the_warning(idata)

    divergences = idata.sample_stats["diverging"].sum("draw").values
    assert list(summary["divergences"]) == list(divergences)
    # every rejected failure is a divergence here and nothing else diverges
    assert list(summary["failed_solves"]) == list(divergences)
    assert list(summary["draws_with_failures"]) == list(divergences)
    assert (summary["failed_solves"] > 0).all()
    assert (summary["unsolved_draws"] == 0).all()  # rejected points are never accepted
    assert float(idata.posterior["a"].max()) <= 1.0


@pytest.mark.slow
@pytest.mark.parametrize("cores", [1, 2])
def test_failed_solves_of_a_laplace_marginal_are_counted_per_chain(cores):
    idata = _sample(nan_laplace_model(), cores)
    summary = _summary_expecting_the_warning(idata)

    divergences = idata.sample_stats["diverging"].sum("draw").values
    assert list(summary["failed_solves"]) == list(divergences)
    assert (summary["failed_solves"] > 0).all()
    assert float(idata.posterior["c"].min()) >= 0.0


def test_the_count_is_one_per_failed_evaluation():
    logp = nan_laplace_model().compile_logp()
    label = "the inner solve of the Laplace marginal did not converge"
    before = FAILED_EVALUATIONS[label]
    for c in [-0.5, 0.4, -2.0, 1.0, -0.1]:
        logp({"c": np.array(c)})
    assert FAILED_EVALUATIONS[label] - before == 3


def test_without_the_counting_sampler_divergences_bound_the_failures():
    with nan_agent_model():
        idata = pm.sample(cores=1, **SAMPLE)
    assert "failed_solves" not in idata.sample_stats
    with pytest.warns(pmo.PymcOptimWarning, match=r"step=pmo.CountingNUTS\(\)"):
        summary = pmo.failure_summary(idata)
    assert (summary["failed_solves"] == -1).all()
    assert list(summary["divergences"]) == list(idata.sample_stats["diverging"].sum("draw"))


def test_accepted_unsolved_draws_under_warn_are_counted():
    """Under "warn" the failed points are accepted: the recorded `_success` flags count them."""
    posterior = {
        "a": np.zeros((2, 4)),
        "x_star_success": np.array([[True, False, True, True], [False, False, True, True]]),
    }
    sample_stats = {"diverging": np.zeros((2, 4), dtype=bool), "failed_solves": np.zeros((2, 4))}
    sample_stats["failed_solves"][0, 1] = sample_stats["failed_solves"][1, :2] = 1
    idata = az.from_dict({"posterior": posterior, "sample_stats": sample_stats})
    with pytest.warns(pmo.PymcOptimWarning, match="chain 0: 1 of 4 draws, chain 1: 2 of 4"):
        summary = pmo.failure_summary(idata)
    assert list(summary["unsolved_draws"]) == [1, 2]
    assert list(summary["failed_solves"]) == [1, 2]


def test_rare_failures_do_not_warn():
    sample_stats = {
        "diverging": np.zeros((1, 200), dtype=bool),
        "failed_solves": np.zeros((1, 200)),
    }
    sample_stats["failed_solves"][0, 7] = 1  # 0.5 % of the draws
    idata = az.from_dict({"posterior": {"a": np.zeros((1, 200))}, "sample_stats": sample_stats})
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        summary = pmo.failure_summary(idata)
    assert int(summary["failed_solves"].iloc[0]) == 1


def test_failure_summary_refuses_what_is_not_a_sampled_datatree():
    posterior = {"a": np.zeros((1, 4))}
    with pytest.raises(TypeError, match=r"`idata` of `failure_summary` .* got a Dataset"):
        pmo.failure_summary(az.from_dict({"posterior": posterior}).posterior.to_dataset())
    with pytest.raises(TypeError, match=r"sample_stats.* the groups \['posterior'\]"):
        pmo.failure_summary(az.from_dict({"posterior": posterior}))


def test_warn_policy_counts_its_failed_evaluations():
    logp = nan_agent_model("warn").compile_logp()
    label = "the solve for `x_star`"
    before = FAILED_EVALUATIONS[label]
    with pytest.warns(pmo.PymcOptimWarning, match="The solve for `x_star` failed"):
        logp({"a": np.array(2.0)})
    logp({"a": np.array(0.0)})
    assert FAILED_EVALUATIONS[label] - before == 1


def test_failed_evaluations_are_counted_by_the_reason_of_the_solve():
    """The C/Python backend (the numpy Newton loop in `perform`): each failed evaluation once
    in all and once under its solve's status; the reasons sum to the total."""
    logp = two_reason_agent_model().compile_logp(mode="CVM")
    label = "the solve for `x_star`"
    total, by_reason = FAILED_EVALUATIONS[label], _by_reason(label)
    for a in [-2.0, 0.0, 2.0, -1.5, 0.5, 3.0, 1.5]:
        logp({"a": np.array(a)})
    increments = {r: n - by_reason.get(r, 0) for r, n in _by_reason(label).items()}
    assert {r: n for r, n in increments.items() if n} == {"max_iter": 2, "nonfinite": 3}
    assert FAILED_EVALUATIONS[label] - total == 5


def test_failed_solves_by_reason_under_sampling():
    """`CountingNUTS` records one statistic per reason, summing draw by draw to
    `failed_solves`; `failure_summary` adds a column per reason that occurred, after the
    columns it always has."""
    with two_reason_agent_model():
        step = pmo.CountingNUTS(compile_kwargs={"mode": "CVM"})
        idata = pm.sample(step=step, cores=1, **SAMPLE)
    stats = idata.sample_stats
    reasons = [name for name in stats.data_vars if name.startswith("failed_solves_")]
    assert len(reasons) == len(SolverStatus)  # the failing statuses and "unknown"
    assert all(
        stats[name].dtype == np.int64 and stats[name].dims == ("chain", "draw") for name in reasons
    )
    assert (sum(stats[name] for name in reasons) == stats["failed_solves"]).all()

    summary = _summary_expecting_the_warning(idata)
    assert list(summary.columns) == [
        "draws",
        "failed_solves",
        "draws_with_failures",
        "divergences",
        "unsolved_draws",
        "failed_max_iter",
        "failed_nonfinite",
    ]
    assert (
        summary["failed_max_iter"] + summary["failed_nonfinite"] == summary["failed_solves"]
    ).all()
    assert summary["failed_max_iter"].sum() > 0 and summary["failed_nonfinite"].sum() > 0
    # every failed evaluation is rejected, and nothing else diverges
    assert list(summary["failed_solves"]) == list(stats["diverging"].sum("draw").values)
    assert -1.0 <= float(idata.posterior["a"].min()) <= float(idata.posterior["a"].max()) <= 1.0


def _vectorized(success, a, b):
    """`success` of a batch of solves, one per element of `b` in place of `a`."""
    from pytensor.graph.replace import vectorize_graph

    vectorized = vectorize_graph(success, {a: b})
    assert vectorized.owner.op.core_op is success.owner.op  # a Blockwise of the solver Op
    return vectorized


def test_the_status_is_found_behind_the_flags_a_policy_receives():
    """A solve's flag, a batch of them, and flags combined by `pt.all` and `&` (a constrained
    mode's two solves) lead to their solves' statuses, in order; a flag computed otherwise has
    none, and its failures are counted as "unknown"."""
    a, b, x = pt.scalar("a"), pt.vector("b"), pt.scalar("x")
    x_star, success = pmo.minimize(pt.switch(a > 1.0, np.nan, (x - a) ** 2), x, x0=0.0)
    assert solve_status(success).eval({a: 2.0}).tolist() == [SolverStatus.NONFINITE]

    batched = _vectorized(success, a, b)
    combined = pt.all(batched) & success
    assert solve_status(combined).eval({a: 0.0, b: [0.0, 3.0, 2.0]}).tolist() == [0, 2, 2, 0]
    assert solve_status(success & (a > 0)) is None

    label = "test_the_status_is_found_behind_the_flags"
    counted = count_failures(pt.all(combined), label, solve_status(combined))
    unknown = count_failures(success & (a > 0), f"{label} (unknown)")
    before = _by_reason(label)
    counted.eval({a: 0.0, b: [0.0, 3.0]})
    unknown.eval({a: -1.0})
    assert _by_reason(label)["nonfinite"] - before.get("nonfinite", 0) == 1
    assert _by_reason(f"{label} (unknown)") == {"unknown": 1}


def test_failure_summary_shows_only_the_reasons_that_occurred():
    zeros = np.zeros((2, 3), dtype=np.int64)
    sample_stats = {
        "diverging": zeros.astype(bool),
        "failed_solves": np.array([[2, 0, 1], [0, 0, 0]]),
        "failed_solves_singular": np.array([[1, 0, 1], [0, 0, 0]]),
        "failed_solves_max_iter": np.array([[1, 0, 0], [0, 0, 0]]),
        "failed_solves_nonfinite": zeros,
    }
    idata = az.from_dict({"posterior": {"a": np.zeros((2, 3))}, "sample_stats": sample_stats})
    summary = pmo.failure_summary(idata, warn=False)
    assert list(summary.columns[5:]) == ["failed_max_iter", "failed_singular"]
    assert list(summary["failed_singular"]) == [2, 0]
    assert list(summary["failed_max_iter"]) == [1, 0]
