"""INLA-style inference over hyperparameters: deterministic integration of the Laplace marginal."""

from __future__ import annotations

import itertools
import numbers
import warnings
from dataclasses import dataclass, field

import numpy as np
import pymc as pm
import pytensor
import pytensor.tensor as pt
from pytensor.conditional.op import ifelse
from pytensor.gradient import grad
from pytensor.graph.replace import graph_replace, vectorize_graph
from pytensor.graph.traversal import ancestors
from scipy.special import logsumexp

from pymc_optim._modes import PYTHON_MODE
from pymc_optim._progress import Progress
from pymc_optim._warnings import PymcOptimWarning

# fit_inla is built on laplace's plumbing: its marginal, start, warm starts and latent draws.
from pymc_optim.model import laplace as _laplace
from pymc_optim.model._idata import require_group
from pymc_optim.model.laplace import LaplaceMarginal, marginalize_laplace

__all__ = ["fit_inla", "plot_inla_marginals"]

INTEGRATIONS = ("auto", "grid", "ccd", "importance", "empirical_bayes")
#: Most hyperparameters a grid integrates (R-INLA's default for 1–2): the grid has ~17^m points.
GRID_MAX_DIM = 2
#: Most hyperparameters of the central composite design: the resolution-V fraction has up to
#: 256 points at 12 (R-INLA's "ccd" serves the same range).
CCD_MAX_DIM = 12
#: Quantiles reported in ``idata.inla.quantiles`` (R-INLA's summary.hyperpar plus quartiles).
QUANTILES = (0.025, 0.05, 0.25, 0.5, 0.75, 0.95, 0.975)

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
#: CCD radius factor f₀ (Rue et al. 2009 §6.5, R-INLA's default): points on the sphere of radius
#: f₀√m, just outside the unit-variance contour.
_CCD_F0 = 1.1
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
#: Gap, in posterior sds, between the CCD's split-normal draws' means and the design's own means
#: above which fit_inla warns (the issue's accuracy yardstick for posterior means: 0.1 sd; the
#: fit's means carry a Monte Carlo error of ~0.003 sd from its 100,000 draws).
CCD_GAP_THRESHOLD_SD = 0.1
#: Pareto k̂ above which importance sampling is unreliable (Vehtari et al. 2024).
PARETO_K_THRESHOLD = 0.7
#: Central finite-difference step of the gradient (unconstrained units, scaled by max(1, |θ|)):
#: the implicit gradient is accurate to ~1e-9 (inner Newton solves converge quadratically), so
#: the rounding error ~1e-9/h = 1e-5 and the truncation error ~h² = 1e-8, relative.
_FD_STEP = 1e-4
#: BFGS on −log p(θ | y): stop when every gradient entry is below this (the resulting mode error,
#: ~H⁻¹·gtol, is far below a posterior sd for any data set with more than a handful of points).
_MODE_GTOL = 1e-5
_MODE_MAXITER = 500
#: Points per marginal density curve in ``idata.inla``.
_DENSITY_POINTS = 201


def fit_inla(
    model: pm.Model,
    latent,
    *,
    integration: str = "auto",
    draws: int = 1000,
    hessian_structure: str = "auto",
    random_seed=None,
    progressbar: bool = True,
    mean_correction: bool = True,
    **marginal_kwargs,
):
    """Posterior of a latent Gaussian model by INLA-style integration over its hyperparameters.

    The latent field is integrated out by :func:`pymc_optim.marginalize_laplace`; the
    hyperparameters θ (the remaining free variables) are then integrated numerically, without
    MCMC (Rue, Martino & Chopin 2009): the mode θ̂ of log p(θ | y), the Hessian there, and a
    grid, a central composite design (CCD) or importance sampling in the standardized
    coordinates z, with θ = θ̂ + V Λ^(-1/2) z for the eigendecomposition V Λ Vᵀ of the negative
    Hessian. Everything happens in PyMC's unconstrained value space (with the log-Jacobians of
    the transforms); results are reported in the constrained space.

    Parameters
    ----------
    model : pm.Model
        Left unchanged.
    latent : str, TensorVariable or list of them
        The latent field, as for :func:`pymc_optim.marginalize_laplace`.
    integration : {"auto", "grid", "ccd", "importance", "empirical_bayes"}, default "auto"
        ``"grid"``: a regular grid in z with step 0.5, grown until its faces lie 7.5 below the
        peak log density (at most 2 hyperparameters). ``"ccd"``: the central composite design
        (at most 12). ``"importance"``: draws from a Student-t (4 degrees of freedom) at the
        mode with covariance the inverse Hessian, weighted by the Laplace marginal and
        Pareto-smoothed (PSIS); the Pareto k̂ is reported. ``"empirical_bayes"``: θ fixed at the
        mode. ``"auto"``: grid up to 2 hyperparameters, CCD up to 12, importance above; the
        choice is in ``idata.inla.attrs["integration"]``.
    draws : int, default 1000
        Joint draws of θ and of the latent in ``idata.posterior`` (one chain).
    hessian_structure : str, default "auto"
        Of the *latent's* Hessian, passed to :func:`pymc_optim.marginalize_laplace`.
    random_seed : int or numpy.random.Generator, optional
    progressbar : bool, default True
        A progress bar over the marginal evaluations, then over latent recovery.
    mean_correction : bool, default True
        Centre each latent draw at the conditional mean to first order in the skewness of
        p(x | θ, y) rather than at the mode (as in :func:`pymc_optim.recover_latent`).
    **marginal_kwargs
        Passed to :func:`pymc_optim.marginalize_laplace` (``method``, ``on_failure``,
        ``optimizer_kwargs``, ``block_size``).

    Returns
    -------
    idata : xarray.DataTree
        ``posterior``: `draws` joint draws of the hyperparameters (from the integration's
        approximation of p(θ | y)), of the latent (for each θ draw, one draw of N(x*(θ), H⁻¹) by
        :func:`pymc_optim.recover_latent`) and of the model's deterministics (those of the
        latent too: they are computed from the joint draws in `model`), under the
        original names, dims and coords, so ``az.summary`` and
        ``pm.sample_posterior_predictive(idata, model=model)`` work. ``inla``: the integration
        points in the unconstrained space (``points``, dims ``point, hyper``), their log
        density ``log_density`` (log p(θ, y) up to a constant) and normalized ``log_weights``,
        the ``mode`` and the negative ``hessian`` of log p(θ | y) there (unconstrained), the
        ``pareto_k`` (NaN unless importance sampling), the hyperparameters' (and θ-only
        deterministics') posterior ``mean``, ``sd`` and ``quantiles`` and their marginal
        densities ``density_x``, ``density`` (R-INLA's ``marginals.hyperpar``), dims
        ``hyperparameter``; attrs ``integration``, ``n_evaluations``, ``mode_success``.

    Raises
    ------
    ValueError
        Unknown `integration`, `draws` < 1, no free hyperparameter left once `latent` is
        marginalized, a discrete hyperparameter, more hyperparameters than `integration`
        supports, a non-finite marginal at the start or at the mode, a Hessian at the mode that
        is not negative definite.

    Warns
    -----
    PymcOptimWarning
        When the mode search did not converge, or when the Pareto k̂ of importance sampling
        exceeds 0.7: the result may then be wrong, and NUTS on the model returned by
        :func:`pymc_optim.marginalize_laplace` is the safe route.

    Notes
    -----
    *Hessian.* The negative Hessian of log p(θ | y) at the mode is computed by central finite
    differences of the marginal model's gradient (which runs through the implicit derivative of
    the inner mode), 2·m gradient evaluations, symmetrized. It is not differentiated
    symbolically: that would need second derivatives of the inner solution x*(θ).

    *Weights.* Grid: the points are equally spaced in z, so a point's weight is its density.
    CCD: the center, 2m axial points and a resolution-V two-level fraction, scaled onto the
    sphere of radius f₀√m (f₀ = 1.1); the weights Δ_k multiply the density at the points and are
    chosen, as in Rue et al. (2009, §6.5), so that the rule integrates a standard Gaussian and
    its second moment exactly: Δ₀ ∝ (1 − 1/f₀²)/φ(0) at the center and Δ ∝ 1/(n f₀² φ(f₀√m)) at
    each of the n other points. Importance: w ∝ p(θ, y)/q(θ), Pareto-smoothed by
    ``arviz_stats.base.array_stats.psislw``.

    *Draws and marginals.* Grid: the log density is interpolated (cubic) on a finer lattice in
    z, and θ is drawn from its cells. CCD: from a split normal in z whose two scales per axis
    match the log density at the axial points (R-INLA's "asymmetric Gaussian"). Importance: by
    resampling the weighted proposal draws. Means, sds, quantiles and densities (a weighted
    Gaussian KDE) of each hyperparameter come from the same weighted support, except the CCD's
    means and sds, which come from its points and weights. The CCD is accurate when p(θ | y) is
    close to Gaussian in the unconstrained space (many groups per variance); with few, prefer
    the grid (≤ 2 hyperparameters) or importance sampling, whose k̂ says when it fails. The CCD
    says when it fails too: it warns when its split-normal draws' means and the design's own
    means disagree by more than ``CCD_GAP_THRESHOLD_SD`` (0.1) posterior sd
    (``idata.inla.attrs["ccd_fit_mean_gap_sd"]``).

    *Cost.* One compiled function of θ serves the whole fit: it returns the marginal, its
    gradient (a lazy branch: mode search and Hessian only), the inner mode, H and success, and
    a latent draw from a given standard noise (a lazy branch: latent draws only), and each
    inner Newton solve starts at the last successful mode. The marginal is evaluated point by
    point with it (a loop): vectorizing the marginal's graph over a batch of θ points compiles
    a much larger function (tens of seconds for a 300-element latent, more than 15 minutes for
    a dense one of 25) than the loop saves at these point counts. The latent draws visit the θ
    draws along their main axis so that each solve starts near its mode; a separate draw
    function compiled the mean correction's reverse pass through H(x) a second time.

    Examples
    --------
    >>> import numpy as np, pymc as pm
    >>> import pymc_optim as pmo
    >>> y = np.array([0.8, 1.9, 0.2, 1.1, 1.5, 0.4])
    >>> with pm.Model() as model:
    ...     mu = pm.Normal("mu", 0.0, 2.0)
    ...     u = pm.Normal("u", mu, 1.0, shape=6)
    ...     obs = pm.Normal("y", u, 0.5, observed=y)
    >>> idata = pmo.fit_inla(model, "u", draws=200, random_seed=1, progressbar=False)
    >>> idata.inla.attrs["integration"], idata.posterior["u"].shape
    ('grid', (1, 200, 6))
    """
    _laplace._check_flag(mean_correction, "mean_correction", "centre the latent draws at the mode")
    if integration not in INTEGRATIONS:
        raise ValueError(f"`integration` must be one of {INTEGRATIONS}; got {integration!r}.")
    _laplace._check_model(model, "model", "fit_inla")
    if (
        isinstance(draws, bool)
        or not isinstance(draws, numbers.Real)
        or int(draws) != draws
        or draws < 1
    ):
        raise ValueError(f"`draws` must be a positive integer; got {draws!r}.")
    rng = np.random.default_rng(random_seed)
    marginal_model = marginalize_laplace(
        _without_latent_deterministics(model, latent),
        latent,
        hessian_structure=hessian_structure,
        **marginal_kwargs,
    )
    target = _Target.from_model(marginal_model, mean_correction)
    m = target.size
    used = integration
    if integration == "auto":
        used = "grid" if m <= GRID_MAX_DIM else "ccd" if m <= CCD_MAX_DIM else "importance"
    limits = {"grid": GRID_MAX_DIM, "ccd": CCD_MAX_DIM}
    if used in limits and m > limits[used]:
        raise ValueError(
            f"`integration={used!r}` supports at most {limits[used]} hyperparameters; the "
            f"marginal model has {m} ({target.labels}). Use integration='ccd' (up to "
            f"{CCD_MAX_DIM}), 'importance' or 'auto'."
        )

    mode, lp_mode, mode_success = _find_mode(target, target.start)
    hessian = _negative_hessian(target, mode)
    eigenvalues, eigenvectors = np.linalg.eigh(hessian)
    if not np.all(np.isfinite(eigenvalues)) or eigenvalues.min() <= 0:
        raise ValueError(
            "The Hessian of log p(θ | y) at the mode is not negative definite (eigenvalues of "
            f"its negative: {eigenvalues}); the mode search did not find a maximum. Check the "
            "model, or run NUTS on `pmo.marginalize_laplace(model, latent)`, the safe route."
        )
    # θ = θ̂ + L z, with z standard Gaussian under the Gaussian fit at the mode
    scale = eigenvectors / np.sqrt(eigenvalues)

    with Progress(progressbar, f"fit_inla ({used})") as progress:
        target.progress = progress
        integrate = {
            "grid": _integrate_grid,
            "ccd": _integrate_ccd,
            "importance": _integrate_importance,
            "empirical_bayes": _integrate_empirical_bayes,
        }[used]
        result = integrate(target, mode, lp_mode, scale, int(draws), rng)
    if used == "ccd" and result.extra["fit_mean_gap_sd"].max() > CCD_GAP_THRESHOLD_SD:
        gap = result.extra["fit_mean_gap_sd"]
        worst = int(np.argmax(gap))
        warnings.warn(
            f"fit_inla (ccd): the draws of the split-normal fit at the mode and the design's "
            f"own rule give means {gap[worst]:.2f} posterior sd apart for "
            f"{target.constrained_labels[worst]!r} (more than {CCD_GAP_THRESHOLD_SD}): "
            "p(θ | y) is not close to Gaussian in the unconstrained space, so the posterior "
            "draws and idata.inla's quantiles are approximate (idata.inla's means and sds come "
            "from the design). Use integration='importance', whose Pareto k̂ checks itself, or "
            "NUTS on `pmo.marginalize_laplace(model, latent)`.",
            PymcOptimWarning,
            stacklevel=2,
        )
    if used == "importance" and result.pareto_k > PARETO_K_THRESHOLD:
        warnings.warn(
            f"fit_inla: the Pareto k̂ of importance sampling is {result.pareto_k:.2f} > "
            f"{PARETO_K_THRESHOLD}: the weights are unreliable and so is the posterior. NUTS on "
            "`pmo.marginalize_laplace(model, latent)` is the safe route.",
            PymcOptimWarning,
            stacklevel=2,
        )

    idata = _posterior(
        model, marginal_model, target, result.draws, rng, progressbar, mean_correction
    )
    idata["inla"] = _inla_group(target, result, mode, hessian, used, mode_success)
    return idata


def plot_inla_marginals(idata, var_names=None, *, ax=None, **plot_kwargs):
    """Plot the hyperparameters' posterior marginal densities from :func:`fit_inla`.

    Parameters
    ----------
    idata : xarray.DataTree
        Returned by :func:`fit_inla` (it has an ``inla`` group).
    var_names : str or list of str, optional
        Hyperparameters to plot: names (a vector's name selects each of its values) or labels
        of ``idata.inla.hyperparameter`` (``"beta[0]"``); all by default.
    ax : matplotlib Axes or array of them, optional
        One per plotted label.
    **plot_kwargs
        Passed to ``Axes.plot``.

    Returns
    -------
    axes : numpy.ndarray of matplotlib Axes

    Notes
    -----
    To overlay the densities on NUTS draws of the same model, pass the axes of ArviZ's
    ``pc = az.plot_dist(nuts_idata, var_names=names, kind="hist")``, one per name:
    ``ax=[pc.get_target(name, {}) for name in names]`` (scalar hyperparameters).

    Examples
    --------
    Two hyperparameters, the group mean and the groups' spread, give one panel each:

    >>> import numpy as np, pymc as pm
    >>> import pymc_optim as pmo
    >>> y = np.array([0.8, 1.9, 0.2, 1.1, 1.5, 0.4])
    >>> with pm.Model() as model:
    ...     mu = pm.Normal("mu", 0.0, 2.0)
    ...     tau = pm.HalfNormal("tau", 1.0)
    ...     u = pm.Normal("u", mu, tau, shape=6)
    ...     obs = pm.Normal("y", u, 0.5, observed=y)
    >>> idata = pmo.fit_inla(model, "u", draws=200, random_seed=1, progressbar=False)
    >>> axes = pmo.plot_inla_marginals(idata)
    >>> len(axes)
    2
    """
    import matplotlib.pyplot as plt

    require_group(
        idata,
        "inla",
        "plot_inla_marginals",
        must_be="the xarray.DataTree returned by `pmo.fit_inla` (with an `inla` group)",
        fix="Pass the result of `pmo.fit_inla`.",
    )
    inla = idata.inla
    labels = [str(label) for label in inla["hyperparameter"].values]
    if isinstance(var_names, str):
        var_names = [var_names]
    selected = labels if var_names is None else []
    for name in var_names or []:  # a vector hyperparameter's name selects each of its values
        selected += [label for label in labels if label.startswith(f"{name}[")] or [name]
    unknown = [name for name in selected if name not in labels]
    if unknown:
        raise ValueError(f"`var_names` {unknown} are not among the hyperparameters {labels}.")
    if not selected:
        raise ValueError(f"`var_names` is empty; name some of the hyperparameters {labels}.")
    if ax is None:
        _, ax = plt.subplots(1, len(selected), figsize=(4 * len(selected), 3), squeeze=False)
    axes = np.ravel(ax)
    if len(axes) != len(selected):
        raise ValueError(
            f"`ax` must hold one axis per plotted hyperparameter ({len(selected)}: {selected}); "
            f"got {len(axes)}. Pass `var_names` to plot fewer, or leave `ax` out."
        )
    for axis, name in zip(axes, selected, strict=True):
        row = inla.sel(hyperparameter=name)
        axis.plot(row["density_x"].values, row["density"].values, **plot_kwargs)
        axis.set_title(name)
        axis.set_xlabel(name)
    return axes


def _without_latent_deterministics(model: pm.Model, latent) -> pm.Model:
    """`model` without the deterministics computed from `latent` (the marginal model cannot
    carry them; they are computed from the joint draws in the original model afterwards)."""
    from pymc.model.fgraph import ModelDeterministic, fgraph_from_model, model_from_fgraph
    from pytensor.graph.traversal import ancestors

    items = list(latent) if isinstance(latent, list | tuple) else [latent]
    names = [item if isinstance(item, str) else getattr(item, "name", None) for item in items]
    latent_rvs = [model[name] for name in names if name in model.named_vars]
    if not latent_rvs or not model.deterministics:
        return model  # marginalize_laplace reports bad names
    fgraph, memo = fgraph_from_model(model, inlined_views=True)
    latent_fg = {memo[rv] for rv in latent_rvs}
    dropped = [
        out
        for out in fgraph.outputs
        if isinstance(out.owner.op, ModelDeterministic)
        and latent_fg & set(ancestors([out.owner.inputs[0]]))
    ]
    if not dropped:
        return model
    for out in dropped:
        fgraph.remove_output(fgraph.outputs.index(out))
    new_model = model_from_fgraph(fgraph, mutate_fgraph=True)
    order = {rv.name: i for i, rv in enumerate(model.free_RVs)}  # keep the user's order
    new_model.free_RVs.sort(key=lambda rv: order[rv.name])
    return new_model


# --- the target: log p(θ, y) and its gradient in the flat unconstrained space --------------------
@dataclass
class _Target:
    fn: object
    to_constrained: object
    value_names: list
    shapes: list
    labels: list
    constrained_labels: list
    constrained_names: list
    constrained_shapes: list
    start: np.ndarray
    cold_start: np.ndarray
    x0: np.ndarray = None
    n_evaluations: int = 0
    progress: object = None

    @property
    def size(self) -> int:
        return self.start.size

    @classmethod
    def from_model(cls, marginal_model: pm.Model, mean_correction: bool = True) -> _Target:
        if not marginal_model.free_RVs:
            raise ValueError(
                "`latent` leaves no free hyperparameter: every free variable of the model is "
                "marginalized, so there is nothing to integrate over. Use "
                "`pmo.marginalize_laplace` and `pmo.recover_latent` directly (or give the model "
                "a free hyperparameter)."
            )
        discrete = [rv.name for rv in marginal_model.free_RVs if "float" not in rv.type.dtype]
        if discrete:
            raise ValueError(
                f"fit_inla integrates continuous hyperparameters only; got the discrete "
                f"hyperparameters {discrete}. Marginalize them (e.g. "
                "`pymc_extras.marginalize`) or fix them."
            )
        values = list(marginal_model.value_vars)
        start_point = marginal_model.initial_point()
        shapes = [np.shape(start_point[v.name]) for v in values]
        start = np.concatenate([np.ravel(start_point[v.name]) for v in values]).astype("float64")
        theta = pt.vector("theta", dtype="float64", shape=(start.size,))
        pieces = _split(theta, shapes, [v.dtype for v in values])
        replace = dict(zip(values, pieces, strict=True))
        logp = graph_replace(marginal_model.logp(jacobian=True), replace, strict=False)
        # One compiled function serves the whole fit: log p(θ, y), its gradient, the inner
        # mode, H and success (already part of the marginal's graph), and one latent draw of
        # N(x*(θ) + δ, H⁻¹) from a standard `noise`, with the inner solve started at `start`.
        # (A separate function for the draws compiled the mean correction's reverse pass through
        # H(x) again, 1.4–2.3 s of the 11–15 s fit at G = 300; here it shares its subgraphs
        # with the marginal's gradient.)
        (marker,) = [
            v.owner
            for v in ancestors([logp])
            if v.owner is not None and isinstance(v.owner.op, LaplaceMarginal)
        ]
        start_var = marker.inputs[1].type("start")
        noise = marker.inputs[1].type("noise")
        _, solution, solution_hessian, _, *params = marker.inputs
        recovered = _laplace._recovery_draw(
            marker, solution, solution_hessian, noise, params, mean_correction
        )
        logp, mode, hessian, success, *recovered = _laplace._warm_started(
            [logp, *marker.inputs[1:4], *recovered], solution, start_var
        )
        # The gradient (the implicit pullback, several times the cost of the solve itself) only
        # where the mode search and the Hessian need it, the draw only for the latent draws:
        # lazy branches, skipped on the grid and the design points.
        with_gradient = pt.scalar("with_gradient", dtype="bool")
        gradient = ifelse(with_gradient, grad(logp, theta), pt.zeros_like(theta))
        with_draw = pt.scalar("with_draw", dtype="bool")
        recovered = ifelse(with_draw, recovered, [pt.zeros_like(r) for r in recovered])
        fn = pytensor.function(
            [theta, start_var, with_gradient, with_draw, noise],
            [logp, gradient, mode, hessian, success, *recovered],
        )

        # constrained values of the hyperparameters and of the deterministics of θ, batched
        wanted = {rv.name for rv in marginal_model.free_RVs} | {
            d.name for d in marginal_model.deterministics
        }
        outputs = [v for v in marginal_model.unobserved_value_vars if v.name in wanted]
        outputs = graph_replace(outputs, replace, strict=False)
        thetas = pt.matrix("thetas", dtype="float64", shape=(None, start.size))
        batched = vectorize_graph(outputs, {theta: thetas})
        # a handful of calls on large batches: numpy's perform, no C module (with a cold
        # compile cache, compiling it to C took ~10 s of gcc at G = 300)
        to_constrained = pytensor.function(
            [thetas], batched, on_unused_input="ignore", mode=PYTHON_MODE
        )
        names = [v.name for v in marginal_model.unobserved_value_vars if v.name in wanted]
        constrained = to_constrained(start[None])
        constrained_shapes = [np.shape(c)[1:] for c in constrained]
        return cls(
            fn=fn,
            to_constrained=to_constrained,
            value_names=[v.name for v in values],
            shapes=shapes,
            labels=_labels([v.name for v in values], shapes),
            constrained_labels=_labels(names, constrained_shapes),
            constrained_names=names,
            constrained_shapes=constrained_shapes,
            start=start,
            cold_start=_laplace._initial_mode(marker),
            x0=_laplace._initial_mode(marker),
        )

    def evaluate(self, x, with_gradient: bool = True):
        """log p(θ, y), its gradient (zeros unless `with_gradient`), the inner mode, H and
        success at `x`; the inner solve starts at the last successful mode (a few Newton steps
        instead of ~10)."""
        return self._call(x, with_gradient, None)[:5]

    def draw(self, x, noise):
        """The latent variables (and their Deterministics) drawn at `x` from the standard
        `noise`, the inner mode and success."""
        _, _, mode, _, success, *outputs = self._call(x, False, noise)
        return outputs, mode, success

    def _call(self, x, with_gradient, noise):
        self.n_evaluations += 1
        with_draw = noise is not None
        outputs = self.fn(
            np.asarray(x, dtype="float64"),
            self.x0,
            with_gradient,
            with_draw,
            self.cold_start if noise is None else noise,
        )
        logp, gradient, mode, _, success = outputs[:5]
        self.x0 = mode if np.all(success) else self.cold_start
        return float(logp), np.asarray(gradient), *outputs[2:]

    def value_and_grad(self, x):
        logp, gradient, *_ = self.evaluate(x)
        return logp, gradient

    def log_density(self, points) -> np.ndarray:
        """log p(θ, y) (up to a constant) at each row of `points`; −inf where not finite."""
        points = np.atleast_2d(points)
        out = np.empty(len(points))
        for i, x in enumerate(points):
            out[i] = self.evaluate(x, with_gradient=False)[0]
            if self.progress is not None:
                self.progress.advance()
        out[~np.isfinite(out)] = -np.inf
        return out

    def constrained(self, points) -> list[np.ndarray]:
        return [np.asarray(c) for c in self.to_constrained(np.atleast_2d(points))]


def _find_mode(target: _Target, start: np.ndarray):
    from scipy.optimize import minimize

    lp_start, grad_start = target.value_and_grad(start)
    if not (np.isfinite(lp_start) and np.all(np.isfinite(grad_start))):
        raise ValueError(
            _non_finite_message("the starting point (the marginal model's initial point)", start)
        )

    def negative(x):
        lp, gradient = target.value_and_grad(x)
        if not (np.isfinite(lp) and np.all(np.isfinite(gradient))):
            return np.inf, np.zeros_like(x)  # the line search steps back
        return -lp, -gradient

    result = minimize(
        negative,
        start,
        jac=True,
        method="BFGS",
        options={"gtol": _MODE_GTOL, "maxiter": _MODE_MAXITER},
    )
    mode = np.asarray(result.x)
    lp_mode, grad_mode = target.value_and_grad(mode)
    if not (np.isfinite(lp_mode) and np.all(np.isfinite(grad_mode))):
        raise ValueError(_non_finite_message("the mode found by BFGS", mode))
    # BFGS reports "precision loss" when it cannot improve a point already at the tolerance's
    # edge; judge convergence by the gradient itself (10x gtol slack for that case)
    success = bool(result.success) or np.max(np.abs(grad_mode)) < 10 * _MODE_GTOL
    if not success:
        warnings.warn(
            f"fit_inla: the mode search of log p(θ | y) did not converge ({result.message}; "
            f"largest gradient entry {np.max(np.abs(grad_mode)):.2g} after {result.nit} "
            "iterations): the integration is centred on the last iterate and may be wrong. NUTS "
            "on `pmo.marginalize_laplace(model, latent)` is the safe route.",
            PymcOptimWarning,
            stacklevel=3,
        )
    return mode, lp_mode, success


def _non_finite_message(where: str, x) -> str:
    return (
        f"The Laplace marginal log density is not finite at {where}, θ = {np.round(x, 6)} "
        "(unconstrained). The inner solve may fail there (see `on_failure` of "
        "`pmo.marginalize_laplace`) or the model has no support: check "
        "`pmo.marginalize_laplace(model, latent).point_logps()`."
    )


def _negative_hessian(target: _Target, x: np.ndarray) -> np.ndarray:
    """−∇² log p(θ | y) at `x` by central differences of the (implicit) gradient."""
    m = x.size
    steps = _FD_STEP * np.maximum(1.0, np.abs(x))
    hessian = np.empty((m, m))
    for i in range(m):
        e = np.zeros(m)
        e[i] = steps[i]
        _, plus = target.value_and_grad(x + e)
        _, minus = target.value_and_grad(x - e)
        hessian[:, i] = -(plus - minus) / (2 * steps[i])
    return 0.5 * (hessian + hessian.T)


# --- integration rules ----------------------------------------------------------------------------
@dataclass
class _Result:
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


def _integrate_grid(target, mode, lp_mode, scale, draws, rng):
    m = mode.size
    step = _GRID_STEP
    lo, hi = np.full(m, -_GRID_START), np.full(m, _GRID_START)
    cache: dict[tuple, float] = {}
    # grow each face of the box while it is not _GRID_LOG_DROP below the peak (≤ 40 steps: ±20
    # sds of the Gaussian fit, far beyond any mass a Laplace-marginal posterior has there)
    for _ in range(20):
        index = list(itertools.product(*[range(a, b + 1) for a, b in zip(lo, hi, strict=True)]))
        new = [i for i in index if i not in cache]
        if target.progress is not None:
            target.progress.add(len(new))
        values = target.log_density(mode + (np.asarray(new, dtype=float) * step) @ scale.T)
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
    log_density = np.array([cache[i] for i in index])
    points = mode + z @ scale.T

    # interpolated log density on a finer lattice (cells of the fine lattice carry the draws)
    from scipy.interpolate import RegularGridInterpolator

    finite = np.isfinite(log_density)
    floor = log_density[finite].min() - 30.0  # −inf (rejected solves) as a far-below value
    table = np.where(finite, log_density, floor).reshape([len(a) for a in axes])
    interpolator = RegularGridInterpolator(axes, table, method="cubic")
    refine = _GRID_REFINE[m]
    fine_step = step / refine
    # (linspace, not arange: arange's rounding can step past the last node, which the
    # interpolator refuses; this happened at G = 3,000 in bench_inla)
    fine_axes = [np.linspace(a[0], a[-1], (len(a) - 1) * refine + 1) for a in axes]
    fine_z = np.stack([g.ravel() for g in np.meshgrid(*fine_axes, indexing="ij")], axis=-1)
    fine_log = interpolator(fine_z)
    # a cell's mass is its centre's density; the half cells at the box's faces count half
    edge = np.zeros(len(fine_z))
    for j, a in enumerate(fine_axes):
        edge += np.isclose(fine_z[:, j], a[0]) | np.isclose(fine_z[:, j], a[-1])
    fine_log = fine_log - edge * np.log(2.0)
    fine_weights = _normalize(fine_log)
    picks = rng.choice(len(fine_z), size=draws, p=fine_weights)
    jitter = rng.uniform(-0.5, 0.5, (draws, m)) * fine_step
    draws_z = np.clip(
        fine_z[picks] + jitter, [a[0] for a in axes], [a[-1] for a in axes]
    )  # stay inside the explored box
    return _Result(
        points=points,
        log_density=log_density,
        log_weights=_log_normalize(log_density),
        support=mode + fine_z @ scale.T,
        support_weights=fine_weights,
        draws=mode + draws_z @ scale.T,
        bandwidth=0.6 * fine_step,
        extra={"grid_step": step},
    )


def _integrate_ccd(target, mode, lp_mode, scale, draws, rng):
    m = mode.size
    z = ccd_design(m)
    if target.progress is not None:
        target.progress.add(len(z) - 1)
    log_density = np.concatenate([[lp_mode], target.log_density(mode + z[1:] @ scale.T)])
    radius = _CCD_F0 * np.sqrt(m)
    log_delta = ccd_log_weights(m)
    # split-normal scales per axis from the axial points ±radius·e_j
    sigma = np.ones((m, 2))  # (axis, [negative side, positive side])
    for j in range(m):
        for side, sign in ((0, -1.0), (1, 1.0)):
            target_z = np.zeros(m)
            target_z[j] = sign * radius
            k = int(np.argmin(np.abs(z - target_z).sum(axis=1)))
            drop = lp_mode - log_density[k]
            if np.isfinite(drop) and drop > 0:
                sigma[j, side] = radius / np.sqrt(2 * drop)
    support_z = _split_normal(sigma, max(_CCD_SUPPORT, draws), rng)
    support = mode + support_z @ scale.T
    points = mode + z @ scale.T
    log_weights = _log_normalize(log_delta + log_density)
    # means and sds by the design's own rule (exact to second order); quantiles from the fit
    moments = _moments(target.constrained(points), np.exp(log_weights))
    # the fit's own means, from its draws: where they part from the design's, p(θ | y) is not
    # the split normal the draws and quantiles come from (a correlation the axes cannot carry)
    fit_mean, _ = _moments(target.constrained(support), np.full(len(support), 1.0 / len(support)))
    gap = np.abs(fit_mean - moments[0]) / np.where(moments[1] > 0, moments[1], np.inf)
    return _Result(
        points=points,
        log_density=log_density,
        log_weights=log_weights,
        moments=moments,
        support=support,
        support_weights=np.full(len(support), 1.0 / len(support)),
        draws=support[:draws],
        extra={"split_normal_scales": sigma, "fit_mean_gap_sd": gap},
    )


def _integrate_importance(target, mode, lp_mode, scale, draws, rng):
    from arviz_stats.base import array_stats
    from scipy.stats import multivariate_t

    m = mode.size
    n = max(_IMPORTANCE_FACTOR * draws, _IMPORTANCE_MIN)
    proposal = multivariate_t(loc=np.zeros(m), shape=np.eye(m), df=_STUDENT_T_DF)
    z = np.atleast_2d(proposal.rvs(size=n, random_state=rng)).reshape(n, m)
    points = mode + _IMPORTANCE_SCALE * z @ scale.T
    if target.progress is not None:
        target.progress.add(n)
    log_density = target.log_density(points)
    log_ratio = log_density - proposal.logpdf(z)
    finite = np.isfinite(log_ratio)
    smoothed = np.full(n, -np.inf)
    # array_stats.psislw takes the negated log weights (a log likelihood, as in PSIS-LOO)
    smoothed_finite, pareto_k = array_stats.psislw(log_ratio[finite].max() - log_ratio[finite])
    smoothed[finite] = smoothed_finite
    weights = _normalize(smoothed)
    picks = rng.choice(n, size=draws, p=weights)
    return _Result(
        points=points,
        log_density=log_density,
        log_weights=_log_normalize(smoothed),
        support=points,
        support_weights=weights,
        draws=points[picks],
        pareto_k=float(pareto_k),
    )


def _integrate_empirical_bayes(target, mode, lp_mode, scale, draws, rng):
    return _Result(
        points=mode[None],
        log_density=np.array([lp_mode]),
        log_weights=np.zeros(1),
        support=mode[None],
        support_weights=np.ones(1),
        draws=np.repeat(mode[None], draws, axis=0),
    )


def ccd_design(m: int) -> np.ndarray:
    """Central composite design in z: the center, then 2m axial and 2^(m−p) fractional points.

    The two-level part is a regular resolution-V fraction (main effects and two-factor
    interactions unaliased, Box & Hunter 1961); every non-center point is on the sphere of
    radius f₀√m.
    """
    if m < 1:
        raise ValueError(f"`m` must be at least 1; got {m}.")
    radius = _CCD_F0 * np.sqrt(m)
    axial = np.concatenate([np.eye(m), -np.eye(m)]) * radius
    if m == 1:
        return np.concatenate([np.zeros((1, 1)), axial])
    cube = _resolution_five_fraction(m) * _CCD_F0  # ±1 entries: norm √m before scaling
    return np.concatenate([np.zeros((1, m)), axial, cube])


def ccd_log_weights(m: int) -> np.ndarray:
    """log Δ_k of :func:`ccd_design`'s points, up to a common constant.

    Δ_k multiplies the density at z_k. With the standard Gaussian density φ, the rule
    Σ Δ_k φ(z_k) g(z_k) integrates g = 1 and g = z zᵀ exactly (odd moments vanish by symmetry)
    when Δ₀ φ(0) = 1 − 1/f₀² at the center and Δ φ(r) = 1/(n f₀²) at the n points on the sphere
    of radius r = f₀√m (then Σ Δ φ(z) z zᵀ = n·r²/(n f₀² m)·I = I).
    """
    n = len(ccd_design(m)) - 1
    radius2 = _CCD_F0**2 * m
    log_phi_sphere = -0.5 * radius2  # log φ(r) − log φ(0)
    return np.concatenate(
        [[np.log(1 - 1 / _CCD_F0**2)], np.full(n, -np.log(n * _CCD_F0**2) - log_phi_sphere)]
    )


def _resolution_five_fraction(m: int) -> np.ndarray:
    """A 2^(m−p) two-level design (±1) of resolution ≥ V with the fewest base factors found."""
    for base in range(min(m, 4), m + 1):  # a word of length ≥ 5 needs ≥ 4 base letters
        generators = _generators(base, m - base)
        if generators is not None:
            full = np.array(list(itertools.product([-1.0, 1.0], repeat=base)))
            added = [
                np.prod(full[:, [b for b in range(base) if g >> b & 1]], axis=1) for g in generators
            ]
            return np.column_stack([full, *added]) if added else full
    raise AssertionError("unreachable: the full factorial (base = m) has resolution m")


def _generators(base: int, extra: int):
    """`extra` subsets of `base` factors whose defining words all have length ≥ 5, or None."""
    candidates = [g for g in range(1, 2**base) if bin(g).count("1") >= 4]

    def word_lengths_ok(chosen):
        # every product of a nonempty subset S of generators: |XOR of masks| + |S| letters
        for r in range(1, len(chosen) + 1):
            for subset in itertools.combinations(chosen, r):
                mask = 0
                for g in subset:
                    mask ^= g
                if bin(mask).count("1") + r < 5:
                    return False
        return True

    def search(chosen, start):
        if len(chosen) == extra:
            return chosen
        for i in range(start, len(candidates)):
            trial = [*chosen, candidates[i]]
            if word_lengths_ok(trial):
                found = search(trial, i + 1)
                if found is not None:
                    return found
        return None

    return search([], 0)


def _split_normal(sigma: np.ndarray, n: int, rng) -> np.ndarray:
    """n draws of independent split normals with scales sigma[j] = (negative, positive side)."""
    m = len(sigma)
    positive = rng.uniform(size=(n, m)) < sigma[:, 1] / sigma.sum(axis=1)
    magnitude = np.abs(rng.standard_normal((n, m)))
    return np.where(positive, magnitude * sigma[:, 1], -magnitude * sigma[:, 0])


# --- outputs --------------------------------------------------------------------------------------
def _posterior(model, marginal_model, target, theta_draws, rng, progressbar, mean_correction):
    import arviz as az

    values = target.constrained(theta_draws)
    free = {rv.name for rv in marginal_model.free_RVs}
    posterior, dims = {}, {}
    for name, value in zip(target.constrained_names, values, strict=True):
        if name in free:
            posterior[name] = value[None]
            if model.named_vars_to_dims.get(name):
                dims[name] = list(model.named_vars_to_dims[name])
    coords = {k: np.asarray(v) for k, v in model.coords.items() if v is not None}
    idata = az.from_dict({"posterior": posterior}, dims=dims, coords=coords)
    # The latent draws: at each θ draw, the mode and H from the target's own compiled function
    # (no second compilation of the marginal), visiting the draws in order of their position
    # along the posterior's main axis so that each inner solve starts near its mode; the draws
    # keep their random order in the posterior.
    order = _laplace._main_axis_order(theta_draws)
    hyper = [
        np.asarray(idata.posterior[rv.name].values, dtype=rv.type.dtype)
        for rv in marginal_model.free_RVs
    ]

    def solve(draw, point, start, noise):
        target.x0 = start
        return target.draw(theta_draws[draw], noise)

    per_chain = _laplace._recover(marginal_model, solve, hyper, rng, progressbar, order=order)
    _laplace._store_recovered(marginal_model, idata.posterior, per_chain)
    if model.deterministics:
        pm.compute_deterministics(idata, model=model, extend_dataset=True, progressbar=False)
    return idata


def _inla_group(target, result, mode, hessian, integration, mode_success):
    import xarray as xr

    support = target.constrained(result.support)
    flat = np.concatenate([s.reshape(len(s), -1) for s in support], axis=1)
    w = result.support_weights
    mean, sd = _moments(support, w) if result.moments is None else result.moments
    quantiles = np.array(
        [
            _weighted_quantiles(flat[:, j], w, QUANTILES, result.bandwidth * sd[j])
            for j in range(flat.shape[1])
        ]
    )
    density_x = np.empty((flat.shape[1], _DENSITY_POINTS))
    density = np.empty_like(density_x)
    for j in range(flat.shape[1]):
        density_x[j], density[j] = _weighted_density(flat[:, j], w)
    data = {
        "points": (("point", "hyper"), result.points),
        "log_density": (("point",), result.log_density),
        "log_weights": (("point",), result.log_weights),
        "mode": (("hyper",), mode),
        "hessian": (("hyper", "hyper_bis"), hessian),
        "pareto_k": ((), result.pareto_k),
        "mean": (("hyperparameter",), mean),
        "sd": (("hyperparameter",), sd),
        "quantiles": (("hyperparameter", "quantile"), quantiles),
        "density_x": (("hyperparameter", "density_point"), density_x),
        "density": (("hyperparameter", "density_point"), density),
    }
    coords = {
        "hyper": target.labels,
        "hyper_bis": target.labels,
        "hyperparameter": target.constrained_labels,
        "quantile": list(QUANTILES),
    }
    attrs = {
        "integration": integration,
        "n_evaluations": target.n_evaluations,
        "mode_success": int(mode_success),
    }
    if "fit_mean_gap_sd" in result.extra:
        attrs["ccd_fit_mean_gap_sd"] = float(result.extra["fit_mean_gap_sd"].max())
    return xr.Dataset(data, coords=coords, attrs=attrs)


def _moments(constrained, weights):
    flat = np.concatenate([c.reshape(len(c), -1) for c in constrained], axis=1)
    mean = weights @ flat
    return mean, np.sqrt(np.maximum(weights @ (flat - mean) ** 2, 0.0))


def _weighted_quantiles(values, weights, probabilities, bandwidth=0.0):
    """Quantiles of weighted points, each smoothed by a Gaussian kernel of sd `bandwidth`.

    Without a bandwidth (draws: no ties), the CDF at a point is the mass below it plus half its
    own, interpolated linearly between points. A lattice projected on one coordinate has ties
    (many points at one value): the kernel, of the order of the lattice's spacing, turns its
    staircase CDF into a smooth one, at the cost of adding bandwidth² to the variance.
    """
    from scipy.special import ndtr

    order = np.argsort(values)
    v, w = values[order], weights[order]
    if bandwidth <= 0 or not np.isfinite(bandwidth):
        cdf = np.cumsum(w) - 0.5 * w
        return np.interp(probabilities, cdf, v)
    # The smoothed CDF on a lattice of step bandwidth/10: the weights binned to its nodes (each
    # point moves by at most bandwidth/20, a 2.5% shift of its kernel), convolved with the
    # kernel's mass per node, then summed. O(nodes · 160) instead of O(nodes · points).
    step = bandwidth / 10
    t = np.arange(v[0] - 8 * bandwidth, v[-1] + 8 * bandwidth + step, step)
    if len(t) > 2_000_000:  # a bandwidth far below the spread: the kernel is negligible
        cdf = np.cumsum(w) - 0.5 * w
        return np.interp(probabilities, cdf, v)
    mass = np.bincount(np.rint((v - t[0]) / step).astype(np.int64), weights=w, minlength=len(t))
    offsets = np.arange(-80, 81) * step  # ±8 kernel sds
    kernel = np.diff(ndtr(np.append(offsets - step / 2, offsets[-1] + step / 2) / bandwidth))
    smoothed = np.convolve(mass[: len(t)], kernel / kernel.sum(), mode="same")
    cdf = np.cumsum(smoothed) - 0.5 * smoothed
    return np.interp(probabilities, cdf, t)


def _weighted_density(values, weights):
    from scipy.stats import gaussian_kde

    keep = weights > 0
    lo, hi = _weighted_quantiles(values, weights, [0.0005, 0.9995])
    x = np.linspace(lo, hi, _DENSITY_POINTS)
    if keep.sum() < 2 or np.ptp(values[keep]) == 0:
        return x, np.full_like(x, np.nan)
    kde = gaussian_kde(values[keep], weights=weights[keep])
    return x, kde(x)


def _log_normalize(log_values) -> np.ndarray:
    """log of the weights ∝ exp(`log_values`), summing to one (−inf where a weight is 0)."""
    log_values = np.asarray(log_values, dtype=float)
    return log_values - logsumexp(log_values)


def _normalize(log_values) -> np.ndarray:
    return np.exp(_log_normalize(log_values))


def _split(flat, shapes, dtypes):
    pieces, start = [], 0
    for shape, dtype in zip(shapes, dtypes, strict=True):
        size = int(np.prod(shape, dtype=int))
        pieces.append(flat[start : start + size].reshape(shape).astype(dtype))
        start += size
    return pieces


def _labels(names, shapes) -> list[str]:
    labels = []
    for name, shape in zip(names, shapes, strict=True):
        if len(shape) == 0:
            labels.append(name)
        else:
            labels.extend(f"{name}[{','.join(map(str, index))}]" for index in np.ndindex(*shape))
    return labels
