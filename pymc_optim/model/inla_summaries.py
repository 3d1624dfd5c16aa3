"""Summaries of an INLA fit: the ``inla`` group of its result, and the plot of its marginals."""

from __future__ import annotations

import numpy as np

from pymc_optim.model._idata import require_group
from pymc_optim.model.inla_integration import moments

__all__ = [
    "QUANTILES",
    "inla_group",
    "plot_inla_marginals",
    "weighted_density",
    "weighted_quantiles",
]

#: Quantiles reported in ``idata.inla.quantiles`` (R-INLA's summary.hyperpar plus quartiles).
QUANTILES = (0.025, 0.05, 0.25, 0.5, 0.75, 0.95, 0.975)
#: Points per marginal density curve in ``idata.inla``.
_DENSITY_POINTS = 201


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


def inla_group(target, result, mode, hessian, integration: str, mode_success: bool):
    """The ``inla`` group of :func:`pymc_optim.fit_inla`'s result: the integration points and
    weights, the mode and Hessian of log p(θ | y), and the hyperparameters' posterior means,
    sds, quantiles and marginal densities, from the `result` of an integration rule over the
    Laplace `target` (:class:`~pymc_optim.model.laplace_target.LaplaceTarget`)."""
    import xarray as xr

    support = target.constrained(result.support)
    flat = np.concatenate([s.reshape(len(s), -1) for s in support], axis=1)
    w = result.support_weights
    mean, sd = moments(support, w) if result.moments is None else result.moments
    quantiles = np.array(
        [
            weighted_quantiles(flat[:, j], w, QUANTILES, result.bandwidth * sd[j])
            for j in range(flat.shape[1])
        ]
    )
    density_x = np.empty((flat.shape[1], _DENSITY_POINTS))
    density = np.empty_like(density_x)
    for j in range(flat.shape[1]):
        density_x[j], density[j] = weighted_density(flat[:, j], w)
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


def weighted_quantiles(values, weights, probabilities, bandwidth=0.0):
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


def weighted_density(values, weights):
    from scipy.stats import gaussian_kde

    keep = weights > 0
    lo, hi = weighted_quantiles(values, weights, [0.0005, 0.9995])
    x = np.linspace(lo, hi, _DENSITY_POINTS)
    if keep.sum() < 2 or np.ptp(values[keep]) == 0:
        return x, np.full_like(x, np.nan)
    kde = gaussian_kde(values[keep], weights=weights[keep])
    return x, kde(x)
