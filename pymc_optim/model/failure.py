"""What a failed inner solve does to a model's log density: the `on_failure` policies.

Shared by every model-level helper (Laplace marginals, agents' optimality conditions), so that
one name means one behaviour across the package:

- ``"reject"``: the log-density term becomes −inf where the solve failed, so NUTS rejects the
  point (it shows up as a divergence) and ``pm.find_MAP`` steps back;
- ``"raise"``: evaluating the term raises an ``AssertionError`` naming the failure;
- ``"warn"``: a :class:`~pymc_optim.PymcOptimWarning` is emitted at each failed evaluation and
  the term is computed at the solver's last iterate. Never silent, but not rejected either:
  for exploring a model (``find_MAP``, prior checks), not for final inference.

Counting failures under sampling
--------------------------------
Rejecting failed solves truncates the posterior where they happen, so failures are counted and
reported in one place, :func:`failure_summary`. Counting them is not trivial: a Deterministic is
recorded only for *accepted* draws (never a rejected point), and a divergence may have other
causes than a failed solve. So every policy's success flag passes through a counting Op
(:class:`CountFailures`) which tallies the failed *evaluations* of the log density in the
process that evaluates it (a sampler's worker process with ``cores > 1``). The sampler
:class:`CountingNUTS` (PyMC's NUTS plus one statistic) reads that tally after each iteration
and records the difference as ``sample_stats.failed_solves``: failed evaluations per draw and
chain, rejected proposals included, exact with any number of cores. Sample with
``pm.sample(step=pmo.CountingNUTS())`` and call ``pmo.failure_summary(idata)``; without the
statistic, the summary falls back to divergences (an upper bound on rejected failures) and to
the recorded success flags of accepted draws.

Each failed evaluation is also counted under one reason: the `SolverStatus` of the first failed
solve behind the flag (:func:`apply_failure_policy` finds the solver Ops that computed it), or
``"unknown"`` when no solver Op did. :class:`CountingNUTS` records these as
``failed_solves_<reason>``, which sum to ``failed_solves``.
"""

from __future__ import annotations

import warnings

import numpy as np
import pymc as pm
import pytensor.scalar as ps
import pytensor.tensor as pt
from pytensor.raise_op import Assert
from pytensor.tensor.elemwise import CAReduce, DimShuffle, Elemwise
from pytensor.tensor.variable import TensorVariable

from pymc_optim._warnings import PymcOptimWarning
from pymc_optim.graph.failure_ops import (
    FAILED_EVALUATIONS,
    FAILED_EVALUATIONS_BY_REASON,
    FAILURE_REASONS,
    CountFailures,
    WarnOnFailure,
    count_failures,
)
from pymc_optim.graph.solver_op import SolverOp
from pymc_optim.model._idata import require_group

__all__ = [
    "ON_FAILURE",
    "CountFailures",
    "CountingNUTS",
    "WarnOnFailure",
    "apply_failure_policy",
    "check_on_failure",
    "count_failures",
    "failure_summary",
    "guard_solution",
]

ON_FAILURE = ("reject", "raise", "warn")
#: Name of the sampler statistic written by `CountingNUTS`.
FAILED_SOLVES_STAT = "failed_solves"
#: Names of its statistics by reason (``failed_solves_max_iter``, ...), which sum to it: one
#: int64 scalar each, so ArviZ gives them no extra dimension.
REASON_STATS = {reason: f"{FAILED_SOLVES_STAT}_{reason}" for reason in FAILURE_REASONS}


def check_on_failure(on_failure: str) -> str:
    """Validate the user's `on_failure` when the graph is built."""
    if on_failure not in ON_FAILURE:
        raise ValueError(
            f"`on_failure` must be one of {', '.join(map(repr, ON_FAILURE))}; got {on_failure!r}."
        )
    return on_failure


def apply_failure_policy(
    term: TensorVariable,
    success: TensorVariable,
    on_failure: str,
    message: str,
    *,
    label: str | None = None,
) -> TensorVariable:
    """`term` (a log-density contribution) under the `on_failure` policy; `message` names
    the solve ("the inner solve of the Laplace marginal did not converge"). Failed
    evaluations are counted under `label` (default: `message`)."""
    check_on_failure(on_failure)
    status = solve_status(success)
    success = count_failures(pt.all(success), message if label is None else label, status)
    if on_failure == "reject":
        return pt.switch(success, term, -np.inf)
    if on_failure == "raise":
        return Assert(message)(term, success)
    return WarnOnFailure(message)(term, success)


def guard_solution(
    x_star: TensorVariable,
    success: TensorVariable,
    on_failure: str,
    message: str,
    *,
    label: str | None = None,
) -> tuple[TensorVariable, TensorVariable | None]:
    """A solution `x_star` that a model may use, under the `on_failure` policy, and the
    log-density term that policy adds (None when it adds none).

    ``"reject"``: the term is 0, or −inf where the solve failed, and the solution is 0 there
    (a NaN from a failed solve must not reach the likelihood: its log density would be NaN,
    not −inf). ``"raise"`` and ``"warn"``: the policy acts on the solution itself (an
    ``AssertionError`` when it is evaluated; a warning and the last iterate). `message` and
    `label` as for :func:`apply_failure_policy`.
    """
    check_on_failure(on_failure)
    if on_failure == "reject":
        term = apply_failure_policy(pt.constant(0.0), success, on_failure, message, label=label)
        return pt.switch(success, x_star, pt.zeros_like(x_star)), term
    return apply_failure_policy(x_star, success, on_failure, message, label=label), None


def solve_status(success: TensorVariable) -> TensorVariable | None:
    """The `SolverStatus` codes behind a success flag, flattened into one int64 vector in the
    order of the solves; None when some part of the flag was not computed by a solver Op.

    `success` is a solver Op's success output (vectorized or not), or one derived from such
    outputs by ``pt.all``, ``&`` and reshaping (a constrained mode's two solves); the status is
    that node's last output, after the counters.
    """
    statuses = []
    pending = [success]
    while pending:
        var = pending.pop()  # depth first, left to right: the order of the flags
        node = var.owner
        if node is None:
            return None
        op = node.op
        core = getattr(op, "core_op", op)  # a vectorized solve wraps its Op in a Blockwise
        if isinstance(core, SolverOp):
            # outputs: [*x_stars, success, n_iterations, n_evaluations, status]
            if node.outputs.index(var) != len(node.outputs) - 4:
                return None
            statuses.append(node.outputs[-1].ravel())
        elif isinstance(op, DimShuffle) or (
            isinstance(op, CAReduce | Elemwise) and isinstance(op.scalar_op, ps.AND)
        ):
            pending.extend(reversed(node.inputs))
        else:
            return None
    return statuses[0] if len(statuses) == 1 else pt.concatenate(statuses)


def _total_failed_evaluations() -> int:
    return sum(FAILED_EVALUATIONS.values())


def _failed_evaluations_by_reason() -> dict[str, int]:
    by_reason = dict.fromkeys(FAILURE_REASONS, 0)
    for (_, reason), count in list(FAILED_EVALUATIONS_BY_REASON.items()):
        by_reason[reason] += count
    return by_reason


class CountingNUTS(pm.NUTS):
    """PyMC's NUTS that also records ``failed_solves``: the inner solves of the model that
    failed during each iteration (rejected proposals included), and the same by reason as
    ``failed_solves_<reason>`` (``max_iter``, ``nonfinite``, ..., ``unknown``: the names of
    `SolverStatus`), which sum to ``failed_solves``.

    Use as ``pm.sample(step=pmo.CountingNUTS())`` (it takes NUTS's arguments) and read the
    counts with :func:`pymc_optim.failure_summary`. The statistic is exact with any number of
    cores: each chain's log density is evaluated in the process that runs its sampler, and
    chains sharing a process run one after the other.
    """

    name = "counting_nuts"
    stats_dtypes_shapes = {
        **pm.NUTS.stats_dtypes_shapes,
        FAILED_SOLVES_STAT: (np.int64, []),
        **{name: (np.int64, []) for name in REASON_STATS.values()},
    }

    def astep(self, q0):
        before = _total_failed_evaluations()
        before_by_reason = _failed_evaluations_by_reason()
        q, stats = super().astep(q0)
        stats[0][FAILED_SOLVES_STAT] = _total_failed_evaluations() - before
        after_by_reason = _failed_evaluations_by_reason()
        for reason, name in REASON_STATS.items():
            stats[0][name] = after_by_reason[reason] - before_by_reason[reason]
        return q, stats


def failure_summary(idata, *, threshold: float = 0.01, warn: bool = True):
    """Failed inner solves per chain of a sampled model, with a warning when they are frequent.

    The one place where failures under sampling are reported (see the module notes).

    Parameters
    ----------
    idata : xarray.DataTree
        From ``pm.sample``, with a ``sample_stats`` group; best with
        ``step=pmo.CountingNUTS()``, which records the exact ``failed_solves`` statistic.
    threshold : float, default 0.01
        Warn when, in some chain, more than this fraction of the draws hit a failed solve
        (or, without the statistic, diverged): under ``on_failure="reject"`` these points were
        rejected and the posterior may be truncated there.
    warn : bool, default True
        Emit that :class:`~pymc_optim.PymcOptimWarning`.

    Returns
    -------
    summary : pandas.DataFrame
        One row per chain: ``draws``; ``failed_solves`` (failed evaluations during the draws,
        rejected ones included; -1 without the statistic); ``draws_with_failures`` (draws
        whose iteration hit one); ``divergences``; ``unsolved_draws`` (accepted draws whose
        recorded success flag, a ``*_success`` or ``*_solved`` variable of the posterior, is
        False: possible only under ``on_failure="warn"``); then, with the statistic, one
        column ``failed_<reason>`` per reason that occurred in some chain (``failed_max_iter``,
        ``failed_nonfinite``, ..., ``failed_unknown``, in `SolverStatus` order), which sum to
        ``failed_solves``.

    Examples
    --------
    Without :class:`CountingNUTS`' statistic, divergences bound the failures from above:

    >>> import arviz as az, numpy as np
    >>> import pymc_optim as pmo
    >>> idata = az.from_dict(
    ...     {
    ...         "posterior": {"mu": np.zeros((2, 50))},
    ...         "sample_stats": {"diverging": np.zeros((2, 50), dtype=bool)},
    ...     }
    ... )
    >>> summary = pmo.failure_summary(idata, warn=False)
    >>> [int(n) for n in summary["divergences"]]
    [0, 0]
    """
    import pandas as pd

    require_group(
        idata,
        "sample_stats",
        "failure_summary",
        must_be="an xarray.DataTree with a `sample_stats` group (what `pm.sample` returns)",
        fix="Pass the result of `pm.sample` (with `step=pmo.CountingNUTS()` for the exact "
        "count of failed solves).",
    )
    stats = idata.sample_stats
    n_chains, n_draws = stats.sizes["chain"], stats.sizes["draw"]
    has_count = FAILED_SOLVES_STAT in stats
    if has_count:
        failed = stats[FAILED_SOLVES_STAT].values.reshape(n_chains, n_draws)
    else:
        failed = np.full((n_chains, n_draws), -1)
    divergences = (
        stats["diverging"].values.reshape(n_chains, n_draws).sum(1)
        if "diverging" in stats
        else np.zeros(n_chains, dtype=int)
    )
    unsolved = np.zeros(n_chains, dtype=int)
    posterior = idata.children.get("posterior")
    for name in [] if posterior is None else list(posterior.data_vars):
        var = posterior[name]
        if var.dtype == bool and (name.endswith("_success") or name.endswith("_solved")):
            flags = var.values.reshape(n_chains, n_draws, -1).all(-1)
            unsolved += (~flags).sum(1)
    summary = pd.DataFrame(
        {
            "draws": n_draws,
            "failed_solves": failed.sum(1) if has_count else -1,
            "draws_with_failures": (failed > 0).sum(1) if has_count else -1,
            "divergences": divergences,
            "unsolved_draws": unsolved,
        },
        index=pd.Index(range(n_chains), name="chain"),
    )
    for reason, name in REASON_STATS.items():
        if has_count and name in stats:
            by_chain = stats[name].values.reshape(n_chains, n_draws).sum(1)
            if by_chain.any():
                summary[f"failed_{reason}"] = by_chain
    if warn:
        _warn_if_frequent(summary, has_count, threshold)
    return summary


def _warn_if_frequent(summary, has_count: bool, threshold: float) -> None:
    column = "draws_with_failures" if has_count else "divergences"
    fraction = (summary[column] + summary["unsolved_draws"]) / summary["draws"]
    frequent = fraction[fraction > threshold]
    if frequent.empty:
        return
    where = ", ".join(
        f"chain {c}: {summary.loc[c, column]} of {summary.loc[c, 'draws']} draws"
        for c in frequent.index
    )
    if has_count:
        message = (
            f"Inner solves failed in more than {threshold:.0%} of the draws ({where}; "
            f"{int(summary['failed_solves'].sum())} failed evaluations in all). Failures "
            "rejected (on_failure='reject', the default) truncate the posterior where the "
            "solver fails; with on_failure='warn' those draws used an unconverged solution. "
            "Check the solver's options (max_iter, x0, method) or the priors before trusting "
            "these draws."
        )
    else:
        message = (
            f"More than {threshold:.0%} of the draws diverged ({where}); some may be failed "
            "inner solves, which truncate the posterior. Sample with "
            "`step=pmo.CountingNUTS()` to count the failed solves exactly."
        )
    warnings.warn(message, PymcOptimWarning, stacklevel=3)
