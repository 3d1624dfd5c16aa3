"""The Laplace error in θ: log p(y | θ) computed exactly, against its Laplace value."""

from __future__ import annotations

import functools
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pymc as pm
import pytensor
import pytensor.tensor as pt
from pytensor.gradient import grad
from pytensor.graph.replace import graph_replace, vectorize_graph
from pytensor.graph.traversal import ancestors
from scipy.special import logsumexp

from pymc_optim._modes import PYTHON_MODE
from pymc_optim._warnings import PymcOptimWarning
from pymc_optim.backends.newton import NewtonOp
from pymc_optim.backends.scipy.ops import MinimizeOp
from pymc_optim.model.inla_integration import moments
from pymc_optim.model.laplace_checks import check_model
from pymc_optim.model.laplace_marker import laplace_node
from pymc_optim.model.laplace_target import LaplaceTarget, _split

__all__ = [
    "MEAN_SHIFT_THRESHOLD_SD",
    "METHODS",
    "InlaCheck",
    "LaplaceError",
    "check_inla",
    "laplace_error",
]

METHODS = ("auto", "quadrature", "importance")
#: |shift| of a hyperparameter's posterior mean, in posterior sds, above which the Laplace error
#: is reported by a warning: the accuracy fit_inla aims at for posterior means.
MEAN_SHIFT_THRESHOLD_SD = 0.1
#: Pareto k̂ above which an importance-sampling estimate is unreliable (Vehtari et al. 2024).
PARETO_K_THRESHOLD = 0.7
#: Distance of the design's axial points from its centre, in posterior sds: ±√3 are the nodes of
#: the three-point Gauss–Hermite rule, so the quadratic through them is the one that rule sees.
DESIGN_RADIUS = float(np.sqrt(3.0))
#: Gradient evaluations of ℓ per θ for the quadrature: Chebyshev nodes of each group's ℓ'_g on
#: [−T, T] Laplace sds. ℓ_g is analytic in the Laplace sd's units (a log link's exp(z* + t s)
#: over |t| ≤ 12 needs ~25 terms); 32 leave δ within 1e-11 of 96 on Poisson counts, and the
#: tests check it against adaptive quadrature.
_CHEBYSHEV_NODES = 32
#: Half-width T of the quadrature, in Laplace sds: a group's density beyond it is below e^-30 of
#: its peak unless its tail is more than twice as wide as the Laplace fit's (a prior-dominated
#: tail has the prior's sd, never that far beyond the posterior's at the mode).
_HALF_WIDTH = 12.0
#: Gauss–Legendre nodes on [−T, T]: a spacing of ~0.4 Laplace sds near the centre, where the
#: integrand is a near-Gaussian bump of width ~1: δ within 1e-11 of 300 nodes on Poisson counts.
_LEGENDRE_NODES = 100
#: Warnings name the first caller outside the package (fit_inla's caller).
_PACKAGE = (str(Path(__file__).parents[1]),)
#: Latent draws per θ for importance sampling (antithetic pairs), by default.
DEFAULT_DRAWS = 200
#: Gaussian draws at the mode that carry the mean shift when a fit has a single point
#: (empirical Bayes): the shift's Monte Carlo error is then ~0.02 · (its size).
_GAUSSIAN_SUPPORT = 4000
#: The quadratic model's curvature in z is kept within ±0.5 (the Gaussian fit's is 1): a
#: larger one would say that δ(θ) is not smooth on the posterior's scale, and its
#: extrapolation to a grid's faces would then dominate the marginal.
_MAX_CURVATURE = 0.5


def laplace_error(
    marginal_model: pm.Model,
    posterior,
    *,
    method: str = "auto",
    draws: int = DEFAULT_DRAWS,
    random_seed=None,
) -> LaplaceError:
    """The error of the Laplace marginal log p(y | θ) at a few θ, and the shift of each
    hyperparameter's posterior mean it implies.

    At each θ, δ(θ) = log p(y | θ) − (its Laplace value) is computed from the latent's log
    density ℓ(x, θ) = log p(y, x | θ) itself: by quadrature when the latent is conditionally
    independent given θ (a diagonal H: then ℓ is a sum of one-dimensional terms and δ the sum of
    their one-dimensional Laplace errors, each integrated to rounding), otherwise by importance
    sampling from the Gaussian approximation N(x*(θ), H⁻¹), whose Pareto k̂ says when it fails.
    The exact posterior of θ is the Laplace one times exp(δ(θ)) (normalized): with a posterior
    sample, the shift of each hyperparameter's mean is estimated by reweighting the sample with
    exp(δ̂(θ)), δ̂ the quadratic through δ at the design's points.

    Parameters
    ----------
    marginal_model : pm.Model
        Returned by :func:`pymc_optim.marginalize_laplace`.
    posterior : xarray.DataTree or numpy.ndarray
        A ``DataTree`` with a ``posterior`` group holding the hyperparameters (NUTS on
        `marginal_model`, or :func:`pymc_optim.fit_inla`'s result): δ is computed at the centre
        of the draws and at ±√3 posterior sds along each principal axis of their covariance
        (2m + 1 points for m hyperparameters), and the mean shifts are estimated. Or an (n, m)
        array of points θ in PyMC's unconstrained space, one column per entry of the marginal
        model's value variables (flattened, in the model's order): δ at those points only.
    method : {"auto", "quadrature", "importance"}, default "auto"
        ``"quadrature"`` needs a diagonal H (``pmo.laplace_info(marginal_model).structure``);
        ``"auto"`` takes it there, importance sampling otherwise.
    draws : int, default 200
        Latent draws per point for importance sampling (rounded up to an even number: they come
        in antithetic pairs ε, −ε).
    random_seed : int or numpy.random.Generator, optional

    Returns
    -------
    error : LaplaceError
        ``points``, ``correction`` (δ at each point), ``pareto_k`` (per point; NaN for the
        quadrature), ``mean_shift_sd`` (per hyperparameter, in posterior sds; NaN when
        `posterior` is an array of points), ``method`` and ``seconds``.

    Raises
    ------
    TypeError
        If `marginal_model` was not made by :func:`pymc_optim.marginalize_laplace`, or
        `posterior` is neither a DataTree with a ``posterior`` group nor an array.
    ValueError
        Unknown `method`; ``"quadrature"`` with an H that is not diagonal; `draws` < 2; points
        of the wrong width; a posterior that lacks a hyperparameter.
    NotImplementedError
        When the marginal's inner solve is not a minimization of ℓ (a latent Gaussian in
        covariance form, a constrained latent): ℓ itself is then not in the model's graph.

    Notes
    -----
    *Quadrature.* With a diagonal H the mode, H and ℓ split over the latent's entries:
    ℓ = Σ_g ℓ_g(x_g) and δ = Σ_g δ_g with δ_g = log ∫ φ(t) exp(f_g(t)) dt, f_g(t) =
    ℓ_g(x*_g + t s_g) − ℓ_g(x*_g) + t²/2 and s_g = H_gg^(-1/2). One gradient of ℓ at
    x* + t s holds every ℓ'_g(x*_g + t s_g) at once, so 64 gradients at Chebyshev nodes t ∈
    [−12, 12] give every f'_g as a Chebyshev series, integrated exactly to f_g and then against
    φ by Gauss–Legendre. Deterministic, and its cost does not grow with the number of groups
    beyond that of a gradient.

    *Importance sampling.* With ε standard normal and x = x* + L⁻ᵀε (H = L Lᵀ), the weight
    p(x, y | θ)/N(x; x*, H⁻¹) over the Laplace value is exp(ℓ(x) − ℓ(x*) + ½ εᵀε), and δ is
    the log of its mean, Pareto-smoothed (PSIS). In d latent dimensions the variance of the log
    weights grows with d: a k̂ above 0.7 says the estimate cannot be trusted.

    *Mean shift.* With δ̂(z) = δ₀ + bᵀz + ½ Σ c_j z_j² in the standardized coordinates z, the
    reweighting moves a Gaussian posterior's mean by about b/(1 − c) posterior sds: δ's slope
    per sd is the bias. Cross terms of δ̂ are not modelled (2m + 1 points).

    Examples
    --------
    A Gaussian likelihood: the Laplace approximation is exact, δ = 0.

    >>> import numpy as np, pymc as pm
    >>> import pymc_optim as pmo
    >>> y = np.array([0.8, 1.9, 0.2, 1.1, 1.5, 0.4])
    >>> with pm.Model() as model:
    ...     mu = pm.Normal("mu", 0.0, 2.0)
    ...     u = pm.Normal("u", mu, 1.0, shape=6)
    ...     obs = pm.Normal("y", u, 0.5, observed=y)
    >>> marginal = pmo.marginalize_laplace(model, "u")
    >>> error = pmo.laplace_error(marginal, np.array([[0.0], [1.0]]))
    >>> error.method, bool(np.all(np.abs(error.correction) < 1e-10))
    ('quadrature', True)
    """
    check_model(marginal_model, "marginal_model", "laplace_error")
    laplace_node(marginal_model)  # a TypeError unless it is a Laplace marginal
    start = time.perf_counter()
    rng = np.random.default_rng(random_seed)
    import xarray as xr

    if isinstance(posterior, xr.DataTree):
        if "posterior" not in posterior.children:
            raise TypeError(
                "`posterior` of `laplace_error` must be an xarray.DataTree with a `posterior` "
                f"group or an array of points; got a DataTree with the groups "
                f"{list(posterior.children)}. Pass the result of `pm.sample` or `pmo.fit_inla`."
            )
    elif not isinstance(posterior, np.ndarray | list | tuple):
        raise TypeError(
            "`posterior` of `laplace_error` must be an xarray.DataTree with a `posterior` group "
            f"or an (n, m) array of unconstrained points; got a {type(posterior).__name__}."
        )
    target = LaplaceTarget.from_model(marginal_model, mean_correction=False)
    estimator = Estimator(target, method, draws, rng)
    if not isinstance(posterior, xr.DataTree):
        points = np.asarray(posterior, dtype=float)
        if points.ndim == 1 and target.size == 1:
            points = points[:, None]
        if points.ndim != 2 or points.shape[1] != target.size:
            raise ValueError(
                f"`posterior` as points must be an (n, {target.size}) array, one column per "
                f"entry of the unconstrained hyperparameters {target.labels}; got shape "
                f"{points.shape}."
            )
        correction, pareto_k = estimator.at_points(points)
        return LaplaceError(
            method=estimator.method,
            points=points,
            correction=correction,
            pareto_k=pareto_k,
            labels=list(target.labels),
            hyperparameters=list(target.constrained_labels),
            mean_shift_sd=np.full(len(target.constrained_labels), np.nan),
            seconds=time.perf_counter() - start,
        )

    thetas = _unconstrained_draws(marginal_model, target, posterior.posterior)
    centre = thetas.mean(axis=0)
    covariance = np.atleast_2d(np.cov(thetas, rowvar=False))
    eigenvalues, eigenvectors = np.linalg.eigh(covariance)
    if eigenvalues.min() <= 0:
        raise ValueError(
            "`posterior`: the draws' covariance of the unconstrained hyperparameters is "
            f"singular (eigenvalues {eigenvalues}); pass more draws, or points instead."
        )
    scale = eigenvectors * np.sqrt(eigenvalues)
    model = fit_correction(estimator, centre, scale)
    values = target.constrained(thetas)
    weights = np.full(len(thetas), 1.0 / len(thetas))
    shift = mean_shift_sd(values, weights, model(thetas))
    return LaplaceError(
        method=estimator.method,
        points=model.points,
        correction=model.correction,
        pareto_k=model.pareto_k,
        labels=list(target.labels),
        hyperparameters=list(target.constrained_labels),
        mean_shift_sd=shift,
        seconds=time.perf_counter() - start,
    )


@dataclass
class LaplaceError:
    """What :func:`laplace_error` found: δ(θ) at its points and the mean shifts it implies.

    Attributes
    ----------
    method : {"quadrature", "importance"}
    points : numpy.ndarray
        (n, m) points θ, unconstrained, columns `labels`.
    correction : numpy.ndarray
        (n,) δ(θ) = log p(y | θ) − its Laplace value (NaN where the inner solve failed).
    pareto_k : numpy.ndarray
        (n,) Pareto k̂ of the importance weights (NaN for the quadrature).
    labels : list of str
        The unconstrained hyperparameters (columns of `points`).
    hyperparameters : list of str
        The hyperparameters in the constrained space (and θ's deterministics).
    mean_shift_sd : numpy.ndarray
        Per entry of `hyperparameters`: how far the correction moves its posterior mean, in
        posterior sds (corrected − Laplace).
    seconds : float
        Wall time of the computation.
    """

    method: str
    points: np.ndarray
    correction: np.ndarray
    pareto_k: np.ndarray
    labels: list
    hyperparameters: list
    mean_shift_sd: np.ndarray
    seconds: float

    def to_dataset(self):
        """The result as an ``xarray.Dataset`` (the variables fit_inla adds to ``idata.inla``):
        ``laplace_points`` (dims ``laplace_point, hyper``), ``laplace_correction`` and
        ``laplace_pareto_k`` (``laplace_point``), ``laplace_mean_shift_sd``
        (``hyperparameter``); attrs ``laplace_error_method``, ``laplace_error_seconds``."""
        import xarray as xr

        return xr.Dataset(
            {
                "laplace_points": (("laplace_point", "hyper"), self.points),
                "laplace_correction": (("laplace_point",), self.correction),
                "laplace_pareto_k": (("laplace_point",), self.pareto_k),
                "laplace_mean_shift_sd": (("hyperparameter",), self.mean_shift_sd),
            },
            coords={"hyper": self.labels, "hyperparameter": self.hyperparameters},
            attrs={
                "laplace_error_method": self.method,
                "laplace_error_seconds": float(self.seconds),
            },
        )


class Estimator:
    """δ(θ) = log p(y | θ) − its Laplace value at given θ, for a :class:`LaplaceTarget`."""

    def __init__(self, target: LaplaceTarget, method: str, draws: int, rng):
        if method not in METHODS:
            raise ValueError(f"`method` must be one of {METHODS}; got {method!r}.")
        if isinstance(draws, bool) or not isinstance(draws, int | np.integer) or draws < 2:
            raise ValueError(
                f"`draws` must be an integer of at least 2 (antithetic pairs); got {draws!r}."
            )
        node = laplace_node(target.marginal_model)
        self.structure = node.op.structure
        kind = getattr(self.structure, "kind", None)
        if method == "quadrature" and kind != "diagonal":
            raise ValueError(
                "`method='quadrature'` needs a diagonal H (a latent conditionally independent "
                f"given θ); this marginal's H is {kind!r}. Use method='importance' or 'auto'."
            )
        self.method = (
            method if method != "auto" else "quadrature" if kind == "diagonal" else "importance"
        )
        self.target = target
        self.draws = int(draws) + int(draws) % 2
        self.rng = rng
        with_gradient = self.method == "quadrature"
        self._log_joint = target.compiled_once(
            ("log_joint", with_gradient),
            lambda: _log_joint_function(target, node, with_gradient=with_gradient),
        )
        if self.method == "importance":
            self._sample = target.compiled_once("gaussian_draw", lambda: _draw_function(node))

    def at_points(self, points) -> tuple[np.ndarray, np.ndarray]:
        """δ and the Pareto k̂ (NaN for the quadrature) at each row of `points`."""
        out = np.array([self.at(theta) for theta in np.atleast_2d(points)])
        return out[:, 0], out[:, 1]

    def at(self, theta) -> tuple[float, float]:
        evaluation = self.target.evaluate(theta, with_gradient=False)
        if not np.all(evaluation.success) or not np.isfinite(evaluation.log_density):
            return np.nan, np.nan
        theta = np.asarray(theta, dtype="float64")
        mode = np.asarray(evaluation.mode)
        if self.method == "quadrature":
            return _quadrature(self._log_joint, theta, mode, np.asarray(evaluation.hessian)), np.nan
        return self._importance(theta, mode, evaluation.hessian)

    def _importance(self, theta, mode, hessian) -> tuple[float, float]:
        from arviz_stats.base import array_stats

        half = self.rng.standard_normal((self.draws // 2, mode.size))
        noise = np.concatenate([half, -half])  # antithetic: the odd (skewness) terms cancel
        at_mode = float(self._log_joint(theta, mode)[0])
        log_w = np.array(
            [
                float(self._log_joint(theta, self._sample(mode, hessian, eps))[0])
                - at_mode
                + 0.5 * eps @ eps
                for eps in noise
            ]
        )
        finite = np.isfinite(log_w)
        if finite.sum() < 2:
            return np.nan, np.inf
        log_w = log_w[finite]
        # array_stats.psislw takes the negated log weights and returns them smoothed and
        # normalized; the smallest weight is in the bulk, which smoothing leaves as it was up to
        # the normalization, so it gives back the scale
        try:
            smoothed, pareto_k = array_stats.psislw(log_w.max() - log_w)
        except ValueError:  # too few draws for a tail of 5, or equal weights: no smoothing
            smoothed, pareto_k = log_w, np.nan
        smallest = int(np.argmin(log_w))
        smoothed = smoothed + (log_w[smallest] - smoothed[smallest])
        return float(logsumexp(smoothed) - np.log(len(log_w))), float(pareto_k)


@dataclass
class QuadraticCorrection:
    """δ̂(θ) = δ₀ + bᵀz + ½ Σ c_j z_j², z = L⁻¹(θ − centre), fitted to δ at `points`."""

    centre: np.ndarray
    scale: np.ndarray  # L: θ = centre + L z
    coefficients: np.ndarray  # (δ₀, b, c)
    points: np.ndarray
    correction: np.ndarray
    pareto_k: np.ndarray

    def standardized(self, thetas) -> np.ndarray:
        return np.linalg.solve(self.scale, (np.atleast_2d(thetas) - self.centre).T).T

    def __call__(self, thetas) -> np.ndarray:
        """δ̂ at each row of `thetas`."""
        z = self.standardized(thetas)
        m = z.shape[1]
        d0, b, c = self.coefficients[0], self.coefficients[1 : m + 1], self.coefficients[m + 1 :]
        return d0 + z @ b + 0.5 * (z**2) @ c

    @property
    def mode_shift(self) -> np.ndarray:
        """z of the mode of −½ zᵀz + δ̂(z): b / (1 − c)."""
        m = self.centre.size
        b, c = self.coefficients[1 : m + 1], self.coefficients[m + 1 :]
        return b / (1.0 - c)

    @property
    def curvature(self) -> np.ndarray:
        m = self.centre.size
        return self.coefficients[m + 1 :]


def fit_correction(estimator: Estimator, centre, scale) -> QuadraticCorrection:
    """δ at the centre and at ±√3 along each column of `scale` (θ = centre + L z), and the
    quadratic through them; NaN coefficients when δ is not finite at some point."""
    m = centre.size
    z = np.concatenate([np.zeros((1, m)), DESIGN_RADIUS * np.eye(m), -DESIGN_RADIUS * np.eye(m)])
    points = centre + z @ scale.T
    correction, pareto_k = estimator.at_points(points)
    design = np.column_stack([np.ones(len(z)), z, 0.5 * z**2])
    if np.all(np.isfinite(correction)):
        coefficients = np.linalg.lstsq(design, correction, rcond=None)[0]
        coefficients[m + 1 :] = np.clip(coefficients[m + 1 :], -_MAX_CURVATURE, _MAX_CURVATURE)
    else:
        coefficients = np.full(2 * m + 1, np.nan)
    return QuadraticCorrection(centre, scale, coefficients, points, correction, pareto_k)


def mean_shift_sd(constrained, weights, delta) -> np.ndarray:
    """How far reweighting by exp(`delta`) moves the weighted means of `constrained` (the
    hyperparameters at each point, :meth:`LaplaceTarget.constrained`), in weighted sds."""
    if not np.all(np.isfinite(delta)):
        return np.full(sum(int(np.prod(c.shape[1:])) for c in constrained), np.nan)
    mean, sd = moments(constrained, weights)
    tilted = weights * np.exp(delta - np.max(delta))
    corrected, _ = moments(constrained, tilted / tilted.sum())
    return (corrected - mean) / np.where(sd > 0, sd, np.inf)


@dataclass
class InlaCheck:
    """fit_inla's Laplace-error check: the correction at the design around the mode, and
    (with `correct`) the corrected log density, mode and scale to integrate."""

    model: QuadraticCorrection | None
    method: str
    correct: bool
    seconds: float
    reason: str = ""
    extra: dict = field(default_factory=dict)

    def integration_inputs(self, target, mode, lp_mode, scale):
        """(log density, mode, its log density, scale) for the integration rule: `target`'s own
        unless corrected; corrected, log p(θ, y) + δ̂(θ) centred at the quadratic model's mode
        with its curvature (one more evaluation)."""
        if not self.correct or self.model is None:
            return target.log_density, mode, lp_mode, scale
        model = self.model

        def corrected(points):
            return target.log_density(points) + model(points)

        new_mode = mode + scale @ model.mode_shift
        new_scale = scale / np.sqrt(1.0 - model.curvature)
        return corrected, new_mode, float(corrected(new_mode)[0]), new_scale

    def finish(self, target, result, integration: str, rng, total_seconds: float):
        """The mean shifts on the integration's weighted set, and the ``idata.inla`` variables
        (a Dataset to merge)."""
        import xarray as xr

        hyperparameters = list(target.constrained_labels)
        if self.model is None:
            return xr.Dataset(
                coords={"hyperparameter": hyperparameters},
                attrs={"laplace_error_method": f"{self.method}: {self.reason}"},
            )
        if integration == "ccd":  # the design's own rule gives the reported means
            support, weights = result.points, np.exp(result.log_weights)
        elif len(result.support) == 1:  # empirical Bayes: the Gaussian fit at the mode
            z = rng.standard_normal((_GAUSSIAN_SUPPORT, target.size))
            support = result.support[0] + z @ self.model.scale.T
            weights = np.full(len(support), 1.0 / len(support))
        else:
            support, weights = result.support, result.support_weights
        delta = self.model(support)
        values = target.constrained(support)
        if self.correct:  # the weights are the corrected fit's: the Laplace fit's lack exp(δ̂)
            weights = _normalized(weights * np.exp(-(delta - delta.max())))
        shift = mean_shift_sd(values, weights, delta)
        error = LaplaceError(
            method=self.method,
            points=self.model.points,
            correction=self.model.correction,
            pareto_k=self.model.pareto_k,
            labels=list(target.labels),
            hyperparameters=hyperparameters,
            mean_shift_sd=shift,
            seconds=self.seconds,
        )
        dataset = error.to_dataset()
        dataset.attrs["laplace_corrected"] = int(self.correct)
        dataset.attrs["laplace_error_time_fraction"] = float(self.seconds / total_seconds)
        self.warn(shift, hyperparameters)
        return dataset

    def warn(self, shift, hyperparameters) -> None:
        model = self.model
        k = np.nanmax(model.pareto_k) if np.any(np.isfinite(model.pareto_k)) else np.nan
        if np.isfinite(k) and k > PARETO_K_THRESHOLD:
            warnings.warn(
                f"fit_inla: the Laplace error in log p(y | θ) could not be estimated reliably: "
                f"the Pareto k̂ of its importance weights reaches {k:.2f} (> "
                f"{PARETO_K_THRESHOLD}), so idata.inla['laplace_mean_shift_sd']"
                f"{' and the corrected fit' if self.correct else ''} may be wrong. NUTS on the "
                "full model is the safe route.",
                PymcOptimWarning,
                skip_file_prefixes=_PACKAGE,
            )
            return
        if not np.all(np.isfinite(model.correction)):
            warnings.warn(
                "fit_inla: the Laplace error could not be computed at every design point (an "
                "inner solve failed there); idata.inla['laplace_correction'] holds NaN. Check "
                "the fit with NUTS on the full model.",
                PymcOptimWarning,
                skip_file_prefixes=_PACKAGE,
            )
            return
        if self.correct or not np.any(np.abs(shift) > MEAN_SHIFT_THRESHOLD_SD):
            return
        worst = int(np.nanargmax(np.abs(shift)))
        warnings.warn(
            f"fit_inla: the Laplace approximation's error moves the posterior mean of "
            f"{hyperparameters[worst]!r} by {shift[worst]:+.2f} posterior sd (more than "
            f"{MEAN_SHIFT_THRESHOLD_SD}; idata.inla['laplace_mean_shift_sd'], from δ(θ) by "
            f"{self.method} at {len(model.points)} points). Pass laplace_correction=True to "
            "integrate the corrected marginal, or run NUTS on the full model.",
            PymcOptimWarning,
            skip_file_prefixes=_PACKAGE,
        )


def check_inla(target, mode, scale, rng, *, correct: bool) -> InlaCheck:
    """fit_inla's check of the Laplace error around the mode θ̂ (θ = θ̂ + L z, L = `scale`):
    δ at 2m + 1 points by quadrature where H is diagonal. Elsewhere only importance sampling
    can estimate δ, at a cost and with a variance that grow with the latent's size: it runs
    when the correction is asked for (`correct`), and otherwise the check is not run. Where ℓ
    is not in the graph, the check is unavailable (a NotImplementedError if `correct`)."""
    start = time.perf_counter()
    kind = getattr(laplace_node(target.marginal_model).op.structure, "kind", None)
    if kind != "diagonal" and not correct:
        return InlaCheck(
            None,
            "not run",
            False,
            time.perf_counter() - start,
            f"H is {kind!r}, not diagonal; `pmo.laplace_error(marginal_model, idata, "
            "method='importance')` estimates the error by importance sampling, whose Pareto k̂ "
            "says whether it can",
        )
    try:
        estimator = Estimator(target, "auto", DEFAULT_DRAWS, rng)
    except NotImplementedError as err:
        if correct:
            raise NotImplementedError(
                f"`laplace_correction=True` cannot be done for this model: {err}."
            ) from err
        return InlaCheck(None, "unavailable", False, time.perf_counter() - start, str(err))
    model = fit_correction(estimator, mode, scale)
    correct = correct and bool(np.all(np.isfinite(model.coefficients)))
    return InlaCheck(model, estimator.method, correct, time.perf_counter() - start)


def _normalized(weights):
    return weights / weights.sum()


def _quadrature(log_joint, theta, mode, hessian) -> float:
    """Σ_g δ_g for a diagonal H (see :func:`laplace_error`'s Notes), or NaN."""
    s = 1.0 / np.sqrt(hessian)
    nodes, operator, log_weights = _quadrature_rule(_CHEBYSHEV_NODES, _LEGENDRE_NODES)
    half_width = _HALF_WIDTH
    for _ in range(4):  # halve the width while ℓ' overflows at its ends
        t = half_width * nodes
        slopes = np.stack([log_joint(theta, mode + tj * s)[1] for tj in t])  # (n, d)
        if np.all(np.isfinite(slopes)):
            break
        half_width /= 2
    else:
        return np.nan
    derivative = s * slopes + t[:, None]  # f'_g(t_j) = s_g ℓ'_g(x*_g + t_j s_g) + t_j
    # f_g at the Legendre nodes (rows), and log ∫ φ exp(f_g) by their rule, per group
    f = half_width * (operator @ derivative)
    x = half_width * _legendre(_LEGENDRE_NODES)[0]
    log_terms = f + (log_weights + np.log(half_width) - 0.5 * x**2)[:, None]
    peak = log_terms.max(axis=0)
    per_group = peak + np.log(np.exp(log_terms - peak).sum(axis=0))
    return float(per_group.sum())


@functools.cache
def _legendre(n: int):
    from numpy.polynomial import legendre

    return legendre.leggauss(n)


@functools.cache
def _quadrature_rule(n: int, k: int):
    """The Chebyshev nodes x_j on [−1, 1] (first kind), the (k, n) matrix that maps a function's
    derivative at them to the function (vanishing at 0) at the k Gauss–Legendre nodes, through
    its Chebyshev series (the interpolant's coefficients by the discrete cosine transform, then
    its antiderivative), and log(w_i / √(2π)) of the Legendre weights; on [−T, T] the map
    scales by T."""
    from numpy.polynomial import chebyshev

    nodes = np.cos(np.pi * (np.arange(n) + 0.5) / n)
    transform = (2.0 / n) * np.cos(np.pi * np.outer(np.arange(n), np.arange(n) + 0.5) / n)
    transform[0] /= 2
    integrate = chebyshev.chebint(np.eye(n), lbnd=0)  # (n + 1, n): column i integrates T_i
    x, w = _legendre(k)
    evaluate = chebyshev.chebvander(x, n)  # (k, n + 1)
    return nodes, evaluate @ integrate @ transform, np.log(w) - 0.5 * np.log(2 * np.pi)


def _log_joint_function(target: LaplaceTarget, node, *, with_gradient: bool):
    """The compiled (θ, x) → ℓ(x, θ) (and ∇ₓℓ) of the Laplace marginal at `node`: the inner
    solver's objective −ℓ, with its parameters written as graphs of the flat θ."""
    solver = node.inputs[1].owner
    op = getattr(solver, "op", None)
    minimizes = isinstance(op, MinimizeOp) or (
        isinstance(op, NewtonOp) and op.minimization and not op.batch_ndim
    )
    if not minimizes or op.n_controls != 1:
        raise NotImplementedError(
            "the Laplace error needs the latent's log density ℓ(x, θ), and this marginal's "
            f"inner solve ({type(op).__name__ if op is not None else 'none'}) does not minimize "
            "−ℓ (a latent Gaussian in covariance form or a constrained latent solves another "
            "condition)"
        )
    marginal_model = target.marginal_model
    values = list(marginal_model.value_vars)
    theta = pt.vector("theta", dtype="float64", shape=(target.size,))
    pieces = _split(theta, target.shapes, [v.dtype for v in values])
    outer = solver.inputs[1 : 1 + op.n_params]
    outer = marginal_model.replace_rvs_by_values(list(outer))
    outer = graph_replace(outer, dict(zip(values, pieces, strict=True)), strict=False)
    (inner_x,) = op.problem.inner_xs
    x = inner_x.type("latent")
    replace = {inner_x: x, **dict(zip(op.problem.inner_params, outer, strict=True))}
    log_joint = -graph_replace(op.problem.inner_outputs[0], replace, strict=False)
    if with_gradient:  # the quadrature: ~32 calls per point, numpy's perform (no compilation)
        # costs less than compiling (G = 3,000: 1.2 s against 2.3 s for five points)
        return pytensor.function(
            [theta, x], [log_joint, grad(log_joint, x)], mode=PYTHON_MODE, on_unused_input="ignore"
        )
    return pytensor.function([theta, x], [log_joint], on_unused_input="ignore")


def _draw_function(node):
    """The compiled (x*, H, z) → a draw of N(x*, H⁻¹) in the Laplace `node`'s structure."""
    mode, hessian = node.inputs[1].type("mode"), node.inputs[2].type("hessian")
    noise = node.inputs[1].type("noise")
    structure = node.op.structure
    return pytensor.function(
        [mode, hessian, noise], structure.sample_gaussian(mode, hessian, noise)
    )


def _unconstrained_draws(marginal_model, target, posterior) -> np.ndarray:
    """The posterior's hyperparameter draws as rows of the flat unconstrained θ."""
    rvs = list(marginal_model.free_RVs)
    missing = [rv.name for rv in rvs if rv.name not in posterior]
    if missing:
        raise ValueError(
            f"`posterior` lacks the hyperparameters {missing} of the marginal model; pass the "
            "result of sampling that model (or of `pmo.fit_inla` on the same model)."
        )
    n = posterior.sizes["chain"] * posterior.sizes["draw"]
    columns = []
    for rv, shape in zip(rvs, target.shapes, strict=True):
        draws = np.asarray(posterior[rv.name].values, dtype="float64").reshape(n, *shape)
        transform = marginal_model.rvs_to_transforms.get(rv)
        if transform is not None:
            inputs = marginal_model.replace_rvs_by_values(list(rv.owner.inputs))
            if set(marginal_model.value_vars) & set(ancestors(inputs)):
                raise NotImplementedError(
                    f"`posterior`: the transform of {rv.name!r} depends on other "
                    "hyperparameters; pass the points θ in the unconstrained space instead."
                )
            value = rv.type(name=rv.name)
            forward = transform.forward(value, *inputs)
            batch = pt.tensor(dtype="float64", shape=(None, *value.type.shape))
            (batched,) = vectorize_graph([forward], {value: batch})
            draws = pytensor.function([batch], batched, mode=PYTHON_MODE)(draws)
        columns.append(np.asarray(draws).reshape(n, -1))
    return np.concatenate(columns, axis=1)
