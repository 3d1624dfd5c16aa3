"""INLA-style inference over hyperparameters: deterministic integration of the Laplace marginal."""

from __future__ import annotations

import numbers
import time
import warnings
from functools import partial

import numpy as np
import pymc as pm
from pymc.model.fgraph import ModelDeterministic, fgraph_from_model, model_from_fgraph
from pytensor.graph.traversal import ancestors

from pymc_optim._progress import Progress
from pymc_optim._warnings import PymcOptimWarning
from pymc_optim.model import inla_integration as rules
from pymc_optim.model.inla_ccd import ccd_design, ccd_log_weights  # noqa: F401  (imported from here)
from pymc_optim.model.inla_summaries import (
    QUANTILES,  # noqa: F401  (imported from here)
    inla_group,
    plot_inla_marginals,
)
from pymc_optim.model.laplace import marginalize_laplace
from pymc_optim.model.laplace_checks import check_flag, check_model
from pymc_optim.model.laplace_error import check_inla
from pymc_optim.model.laplace_target import LaplaceTarget

__all__ = ["fit_inla", "plot_inla_marginals"]

INTEGRATIONS = ("auto", "grid", "ccd", "importance", "empirical_bayes")
#: Most hyperparameters a grid integrates (R-INLA's default for 1–2): the grid has ~17^m points.
GRID_MAX_DIM = 2
#: Most hyperparameters of the central composite design: the resolution-V fraction has up to
#: 256 points at 12 (R-INLA's "ccd" serves the same range).
CCD_MAX_DIM = 12
#: Gap, in posterior sds, between the CCD's split-normal draws' means and the design's own means
#: above which fit_inla warns (the accuracy fit_inla aims at for posterior means: 0.1 sd; the
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
    laplace_error: bool = True,
    laplace_correction: bool = False,
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
    laplace_error : bool, default True
        Check the Laplace approximation itself: its error δ(θ) in log p(y | θ) at the mode and
        at ±√3 sds along each axis (as :func:`pymc_optim.laplace_error`), the shift of each
        hyperparameter's posterior mean it implies, and a warning above 0.1 posterior sd. Run
        where the latent's H is diagonal (by quadrature: a few percent of the fit's time);
        for other structures only with `laplace_correction` (by importance sampling), and
        ``idata.inla.attrs["laplace_error_method"]`` says so. ``False`` skips it.
    laplace_correction : bool, default False
        Integrate the corrected marginal log p(θ, y) + δ̂(θ) (δ̂ the quadratic through δ at the
        check's points, in the coordinates of the Gaussian fit at the mode) instead of the
        Laplace one, centred at the corrected mode: the draws, weights and summaries are then
        the corrected posterior's (``idata.inla.hessian`` stays the Laplace marginal's).
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
        ``hyperparameter``; attrs ``integration``, ``n_evaluations``, ``mode_success``. With
        `laplace_error` or `laplace_correction`, the check's ``laplace_points`` (unconstrained,
        dims ``laplace_point, hyper``), ``laplace_correction`` (δ there),
        ``laplace_pareto_k`` (NaN for the quadrature) and ``laplace_mean_shift_sd`` (how far
        the correction moves each posterior mean, in posterior sds); attrs
        ``laplace_error_method``, ``laplace_error_seconds``, ``laplace_error_time_fraction``
        (of the whole call), ``laplace_corrected``.

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
        :func:`pymc_optim.marginalize_laplace` is the safe route. When the Laplace
        approximation's error moves a hyperparameter's posterior mean by more than 0.1
        posterior sd (without `laplace_correction`), or cannot be estimated reliably: then
        only NUTS on the full model (or the corrected fit) is right.

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
    a much larger function than the loop saves at these point counts. The latent draws visit the θ
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
    started = time.perf_counter()
    check_flag(mean_correction, "mean_correction", "centre the latent draws at the mode")
    check_flag(laplace_error, "laplace_error", "skip the check of the Laplace error")
    check_flag(laplace_correction, "laplace_correction", "integrate the Laplace marginal")
    _check_options(integration, draws)
    check_model(model, "model", "fit_inla")
    rng = np.random.default_rng(random_seed)
    marginal_model, target = _compile(
        model, latent, hessian_structure, mean_correction, marginal_kwargs
    )
    return _fit_compiled(
        model,
        marginal_model,
        target,
        rng,
        integration=integration,
        draws=int(draws),
        laplace_error=laplace_error,
        laplace_correction=laplace_correction,
        progressbar=progressbar,
        started=started,
    )


def _check_options(integration, draws) -> None:
    """Raise a ValueError for an unknown `integration` or a `draws` that is not a positive
    integer."""
    if integration not in INTEGRATIONS:
        raise ValueError(f"`integration` must be one of {INTEGRATIONS}; got {integration!r}.")
    if (
        isinstance(draws, bool)
        or not isinstance(draws, numbers.Real)
        or int(draws) != draws
        or draws < 1
    ):
        raise ValueError(f"`draws` must be a positive integer; got {draws!r}.")


def _compile(model, latent, hessian_structure, mean_correction, marginal_kwargs):
    """The marginal model of `model` and its compiled target: the part of a fit that depends
    on the model's structure only, not on the values of its data (shared variables)."""
    marginal_model = marginalize_laplace(
        _without_latent_deterministics(model, latent),
        latent,
        hessian_structure=hessian_structure,
        **marginal_kwargs,
    )
    return marginal_model, LaplaceTarget.from_model(marginal_model, mean_correction)


def _fit_compiled(
    model,
    marginal_model,
    target: LaplaceTarget,
    rng,
    *,
    integration: str,
    draws: int,
    laplace_error: bool,
    laplace_correction: bool,
    progressbar: bool,
    started: float,
):
    """`fit_inla` from a compiled `target` of `marginal_model` (see :func:`_compile`), at the
    current values of the models' data; warnings are attributed to fit_inla's caller."""
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
    check = None
    log_density, centre, lp_centre, integration_scale = target.log_density, mode, lp_mode, scale
    if laplace_error or laplace_correction:
        check = check_inla(target, mode, scale, rng, correct=laplace_correction)
        log_density, centre, lp_centre, integration_scale = check.integration_inputs(
            target, mode, lp_mode, scale
        )

    with Progress(progressbar, f"fit_inla ({used})") as progress:
        target.progress = progress
        integrate = {
            "grid": rules.grid,
            "ccd": partial(rules.ccd, constrained=target.constrained),
            "importance": rules.importance,
            "empirical_bayes": rules.empirical_bayes,
        }[used]
        result = integrate(
            log_density, centre, lp_centre, integration_scale, int(draws), rng, progress=progress
        )
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
            stacklevel=3,
        )
    if used == "importance" and result.pareto_k > PARETO_K_THRESHOLD:
        warnings.warn(
            f"fit_inla: the Pareto k̂ of importance sampling is {result.pareto_k:.2f} > "
            f"{PARETO_K_THRESHOLD}: the weights are unreliable and so is the posterior. NUTS on "
            "`pmo.marginalize_laplace(model, latent)` is the safe route.",
            PymcOptimWarning,
            stacklevel=3,
        )

    idata = _posterior(model, marginal_model, target, result.draws, rng, progressbar)
    group = inla_group(target, result, mode, hessian, used, mode_success)
    if check is not None:
        checked = check.finish(target, result, used, rng, time.perf_counter() - started)
        group = group.assign(checked.data_vars)
        group.attrs.update(checked.attrs)
    idata["inla"] = group
    return idata


def _posterior(model, marginal_model, target, theta_draws, rng, progressbar):
    """The ``posterior`` group: the θ draws in the constrained space, a latent draw at each and
    the model's Deterministics."""
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
    # (no second compilation of the marginal); the draws keep their random order.
    target.recover(theta_draws, idata.posterior, rng, progressbar)
    if model.deterministics:
        pm.compute_deterministics(idata, model=model, extend_dataset=True, progressbar=False)
    return idata


def _without_latent_deterministics(model: pm.Model, latent) -> pm.Model:
    """`model` without the deterministics computed from `latent` (the marginal model cannot
    carry them; they are computed from the joint draws in the original model afterwards)."""
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


def _find_mode(target: LaplaceTarget, start: np.ndarray):
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
            stacklevel=4,
        )
    return mode, lp_mode, success


def _non_finite_message(where: str, x) -> str:
    return (
        f"The Laplace marginal log density is not finite at {where}, θ = {np.round(x, 6)} "
        "(unconstrained). The inner solve may fail there (see `on_failure` of "
        "`pmo.marginalize_laplace`) or the model has no support: check "
        "`pmo.marginalize_laplace(model, latent).point_logps()`."
    )


def _negative_hessian(target: LaplaceTarget, x: np.ndarray) -> np.ndarray:
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
