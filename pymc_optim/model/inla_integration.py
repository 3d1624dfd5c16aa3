"""Integration rules over the hyperparameters θ of a Laplace marginal: grid, CCD, importance.

Each rule takes the log density as a numpy function of points (rows of θ in the unconstrained
space), the mode θ̂ and its log density, and the scale L of the standardized coordinates z
(θ = θ̂ + L z, z standard Gaussian under the Gaussian fit at the mode), and returns an
:class:`Integration`: the points it evaluated and their weights, a weighted support for
summaries and densities, and draws of θ. Pure numpy and scipy: importable without PyMC or
PyTensor.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
from scipy.special import logsumexp

from pymc_optim.model.inla_ccd import CCD_F0, ccd_design, ccd_log_weights

__all__ = [
    "Integration",
    "ccd",
    "empirical_bayes",
    "grid",
    "importance",
    "log_normalize",
    "moments",
    "normalize",
]

#: Grid step in the standardized coordinates z (posterior sds of the Gaussian fit at the mode).
#: R-INLA uses 0.75; 0.5 keeps the cubic interpolation between points (for quantiles) accurate
#: to well under 1% of a posterior sd on skewed marginals.
_GRID_STEP = 0.5
#: The grid grows until every face lies this far below the highest log density: e^-7.5 ≈ 5.5e-4
#: of the peak density, a tail mass below 1e-3 for a bivariate Gaussian.
_GRID_LOG_DROP = 7.5
#: Initial half-width of the grid, in steps (±2 sds); it then grows face by face.
_GRID_START = 4
#: Refinement of the grid for interpolated draws and quantiles, per dimension count (the fine
#: lattice has ~170 points in 1-d and ~7,000 in 2-d).
_GRID_REFINE = {1: 10, 2: 5}
#: Draws of the CCD's split-normal fit used for summaries and densities: the 5% quantile then
#: carries a Monte Carlo error of ~0.7% of a posterior sd.
_CCD_SUPPORT = 100_000
#: Degrees of freedom of the Student-t proposal: heavier tails than the Gaussian fit (so the
#: importance weights stay bounded when the posterior's tails are a little heavier) with a finite
#: variance.
_STUDENT_T_DF = 4.0
#: Scale of the proposal relative to the inverse Hessian (tests shrink it to provoke a large k̂).
_IMPORTANCE_SCALE = 1.0
#: Proposal draws per requested posterior draw (importance sampling); at least _IMPORTANCE_MIN.
_IMPORTANCE_FACTOR = 4
_IMPORTANCE_MIN = 2000

#: log p(θ, y) (up to a constant) at each row of its argument; −inf where not finite.
LogDensity = Callable[[np.ndarray], np.ndarray]


def grid(
    log_density: LogDensity,
    mode: np.ndarray,
    lp_mode: float,
    scale: np.ndarray,
    draws: int,
    rng: np.random.Generator,
    *,
    progress=None,
) -> Integration:
    """A regular grid in z with step 0.5, grown until its faces lie 7.5 below the peak log
    density (1 or 2 hyperparameters).

    Parameters
    ----------
    log_density : callable
        log p(θ, y) (up to a constant) at each row of an (n, m) array of points θ.
    mode : numpy.ndarray
        θ̂, shape (m,).
    lp_mode : float
        The log density at `mode`.
    scale : numpy.ndarray
        L, shape (m, m): θ = θ̂ + L z.
    draws : int
        Draws of θ to return.
    rng : numpy.random.Generator
    progress : optional
        Told how many evaluations come (``progress.add(n)``) before each batch.

    Returns
    -------
    integration : Integration
        The points are equally spaced in z, so a point's weight is its density. The draws come
        from the cells of a finer lattice on which the log density is interpolated (cubic),
        which also is the support (with a Gaussian smoothing of 0.6 fine steps in quantiles).
    """
    m = mode.size
    step = _GRID_STEP
    lo, hi = np.full(m, -_GRID_START), np.full(m, _GRID_START)
    cache: dict[tuple, float] = {}
    # grow each face of the box while it is not _GRID_LOG_DROP below the peak (≤ 40 steps: ±20
    # sds of the Gaussian fit, far beyond any mass a Laplace-marginal posterior has there)
    for _ in range(20):
        index = list(itertools.product(*[range(a, b + 1) for a, b in zip(lo, hi, strict=True)]))
        new = [i for i in index if i not in cache]
        if progress is not None:
            progress.add(len(new))
        values = log_density(mode + (np.asarray(new, dtype=float) * step) @ scale.T)
        cache.update(zip(new, values, strict=True))
        peak = max(lp_mode, max(cache[i] for i in index))
        grown = False
        for j in range(m):
            for bound, direction in ((lo, -1), (hi, 1)):
                face = max(cache[i] for i in index if i[j] == bound[j])
                if face > peak - _GRID_LOG_DROP and abs(bound[j]) < 40:
                    bound[j] += 2 * direction
                    grown = True
        if not grown:
            break
    axes = [np.arange(a, b + 1) * step for a, b in zip(lo, hi, strict=True)]
    index = list(itertools.product(*[range(a, b + 1) for a, b in zip(lo, hi, strict=True)]))
    z = np.asarray(index, dtype=float) * step
    values = np.array([cache[i] for i in index])
    points = mode + z @ scale.T

    # interpolated log density on a finer lattice (cells of the fine lattice carry the draws)
    from scipy.interpolate import RegularGridInterpolator

    finite = np.isfinite(values)
    floor = values[finite].min() - 30.0  # −inf (rejected solves) as a far-below value
    table = np.where(finite, values, floor).reshape([len(a) for a in axes])
    interpolator = RegularGridInterpolator(axes, table, method="cubic")
    refine = _GRID_REFINE[m]
    fine_step = step / refine
    # (linspace, not arange: arange's rounding can step past the last node, which the
    # interpolator refuses)
    fine_axes = [np.linspace(a[0], a[-1], (len(a) - 1) * refine + 1) for a in axes]
    fine_z = np.stack([g.ravel() for g in np.meshgrid(*fine_axes, indexing="ij")], axis=-1)
    fine_log = interpolator(fine_z)
    # a cell's mass is its centre's density; the half cells at the box's faces count half
    edge = np.zeros(len(fine_z))
    for j, a in enumerate(fine_axes):
        edge += np.isclose(fine_z[:, j], a[0]) | np.isclose(fine_z[:, j], a[-1])
    fine_log = fine_log - edge * np.log(2.0)
    fine_weights = normalize(fine_log)
    picks = rng.choice(len(fine_z), size=draws, p=fine_weights)
    jitter = rng.uniform(-0.5, 0.5, (draws, m)) * fine_step
    draws_z = np.clip(
        fine_z[picks] + jitter, [a[0] for a in axes], [a[-1] for a in axes]
    )  # stay inside the explored box
    return Integration(
        points=points,
        log_density=values,
        log_weights=log_normalize(values),
        support=mode + fine_z @ scale.T,
        support_weights=fine_weights,
        draws=mode + draws_z @ scale.T,
        bandwidth=0.6 * fine_step,
        extra={"grid_step": step},
    )


def ccd(
    log_density: LogDensity,
    mode: np.ndarray,
    lp_mode: float,
    scale: np.ndarray,
    draws: int,
    rng: np.random.Generator,
    *,
    constrained: Callable[[np.ndarray], list[np.ndarray]],
    progress=None,
) -> Integration:
    """The central composite design (:func:`pymc_optim.model.inla_ccd.ccd_design`) in z, with
    the weights that integrate a standard Gaussian and its second moment exactly.

    Parameters are those of :func:`grid`, and `constrained`: the values whose moments are
    reported (the hyperparameters in the constrained space, flattened per point) at each row
    of an (n, m) array of points.

    Returns
    -------
    integration : Integration
        With the design's own means and sds of `constrained` (``moments``); draws and support
        from a split normal in z whose two scales per axis match the log density at the axial
        points; ``extra["fit_mean_gap_sd"]``: how far the split normal's means lie from the
        design's, in posterior sds (large where p(θ | y) is not close to that split normal).
    """
    m = mode.size
    z = ccd_design(m)
    if progress is not None:
        progress.add(len(z) - 1)
    values = np.concatenate([[lp_mode], log_density(mode + z[1:] @ scale.T)])
    radius = CCD_F0 * np.sqrt(m)
    log_delta = ccd_log_weights(m)
    # split-normal scales per axis from the axial points ±radius·e_j
    sigma = np.ones((m, 2))  # (axis, [negative side, positive side])
    for j in range(m):
        for side, sign in ((0, -1.0), (1, 1.0)):
            target_z = np.zeros(m)
            target_z[j] = sign * radius
            k = int(np.argmin(np.abs(z - target_z).sum(axis=1)))
            drop = lp_mode - values[k]
            if np.isfinite(drop) and drop > 0:
                sigma[j, side] = radius / np.sqrt(2 * drop)
    support_z = _split_normal(sigma, max(_CCD_SUPPORT, draws), rng)
    support = mode + support_z @ scale.T
    points = mode + z @ scale.T
    log_weights = log_normalize(log_delta + values)
    # means and sds by the design's own rule (exact to second order); quantiles from the fit
    design_moments = moments(constrained(points), np.exp(log_weights))
    # the fit's own means, from its draws: where they part from the design's, p(θ | y) is not
    # the split normal the draws and quantiles come from (a correlation the axes cannot carry)
    fit_mean, _ = moments(constrained(support), np.full(len(support), 1.0 / len(support)))
    sd = design_moments[1]
    gap = np.abs(fit_mean - design_moments[0]) / np.where(sd > 0, sd, np.inf)
    return Integration(
        points=points,
        log_density=values,
        log_weights=log_weights,
        moments=design_moments,
        support=support,
        support_weights=np.full(len(support), 1.0 / len(support)),
        draws=support[:draws],
        extra={"split_normal_scales": sigma, "fit_mean_gap_sd": gap},
    )


def importance(
    log_density: LogDensity,
    mode: np.ndarray,
    lp_mode: float,
    scale: np.ndarray,
    draws: int,
    rng: np.random.Generator,
    *,
    progress=None,
) -> Integration:
    """Importance sampling from a Student-t (4 degrees of freedom) at the mode with shape L Lᵀ,
    the weights Pareto-smoothed (PSIS, ``arviz_stats``).

    Parameters are those of :func:`grid`.

    Returns
    -------
    integration : Integration
        The proposal draws with their smoothed weights (points and support), draws resampled
        from them, and the Pareto k̂ of the weights (``pareto_k``; above 0.7 they are
        unreliable).
    """
    from arviz_stats.base import array_stats
    from scipy.stats import multivariate_t

    m = mode.size
    n = max(_IMPORTANCE_FACTOR * draws, _IMPORTANCE_MIN)
    proposal = multivariate_t(loc=np.zeros(m), shape=np.eye(m), df=_STUDENT_T_DF)
    z = np.atleast_2d(proposal.rvs(size=n, random_state=rng)).reshape(n, m)
    points = mode + _IMPORTANCE_SCALE * z @ scale.T
    if progress is not None:
        progress.add(n)
    values = log_density(points)
    log_ratio = values - proposal.logpdf(z)
    finite = np.isfinite(log_ratio)
    smoothed = np.full(n, -np.inf)
    # array_stats.psislw takes the negated log weights (a log likelihood, as in PSIS-LOO)
    smoothed_finite, pareto_k = array_stats.psislw(log_ratio[finite].max() - log_ratio[finite])
    smoothed[finite] = smoothed_finite
    weights = normalize(smoothed)
    picks = rng.choice(n, size=draws, p=weights)
    return Integration(
        points=points,
        log_density=values,
        log_weights=log_normalize(smoothed),
        support=points,
        support_weights=weights,
        draws=points[picks],
        pareto_k=float(pareto_k),
    )


def empirical_bayes(
    log_density: LogDensity,
    mode: np.ndarray,
    lp_mode: float,
    scale: np.ndarray,
    draws: int,
    rng: np.random.Generator,
    *,
    progress=None,
) -> Integration:
    """θ fixed at the mode: one point of weight 1, every draw equal to it (nothing is
    evaluated). Parameters are those of :func:`grid`."""
    return Integration(
        points=mode[None],
        log_density=np.array([lp_mode]),
        log_weights=np.zeros(1),
        support=mode[None],
        support_weights=np.ones(1),
        draws=np.repeat(mode[None], draws, axis=0),
    )


@dataclass
class Integration:
    """What an integration rule found: its points, weights, support and draws of θ."""

    points: np.ndarray  # (n, m) unconstrained
    log_density: np.ndarray  # (n,)
    log_weights: np.ndarray  # (n,) normalized
    support: np.ndarray  # (s, m) weighted points for summaries and densities
    support_weights: np.ndarray  # (s,) summing to 1
    draws: np.ndarray  # (draws, m)
    pareto_k: float = np.nan
    #: (mean, sd) of the flattened constrained outputs when the rule has its own (CCD)
    moments: tuple | None = None
    #: Gaussian smoothing of the support in quantiles, in posterior sds (lattices only)
    bandwidth: float = 0.0
    extra: dict = field(default_factory=dict)


def moments(constrained: list[np.ndarray], weights: np.ndarray):
    """(mean, sd) of the values `constrained` (one array per variable, points first),
    flattened and concatenated per point, under the normalized `weights`."""
    flat = np.concatenate([c.reshape(len(c), -1) for c in constrained], axis=1)
    mean = weights @ flat
    return mean, np.sqrt(np.maximum(weights @ (flat - mean) ** 2, 0.0))


def log_normalize(log_values) -> np.ndarray:
    """log of the weights ∝ exp(`log_values`), summing to one (−inf where a weight is 0)."""
    log_values = np.asarray(log_values, dtype=float)
    return log_values - logsumexp(log_values)


def normalize(log_values) -> np.ndarray:
    """The weights ∝ exp(`log_values`), summing to one."""
    return np.exp(log_normalize(log_values))


def _split_normal(sigma: np.ndarray, n: int, rng) -> np.ndarray:
    """n draws of independent split normals with scales sigma[j] = (negative, positive side)."""
    m = len(sigma)
    positive = rng.uniform(size=(n, m)) < sigma[:, 1] / sigma.sum(axis=1)
    magnitude = np.abs(rng.standard_normal((n, m)))
    return np.where(positive, magnitude * sigma[:, 1], -magnitude * sigma[:, 0])
