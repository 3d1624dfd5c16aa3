"""Latent Gaussian models in `marginalize_laplace`: the prior's Q (or K) read off the model.

When the single latent's prior is a Gaussian whose precision or covariance we can read
(MvNormal with ``cov``, ``chol`` or ``tau`` — GP latents included —, ICAR, CAR, AR(1),
GaussianRandomWalk) and the likelihood's curvature in the latent is diagonal (checked by two
Hessian-vector products at random points), the Newton system and the marginal's Hessian are
H = Q + diag(w) (:class:`pymc_optim.linalg.latent_gaussian.LatentGaussianStructure`): Q or K
computed once per evaluation outside the solver, w by one reverse pass inside each Newton step,
instead of the n reverse passes of a general dense Hessian. Covariance-form priors keep K (never
inverted): Rasmussen & Williams' B = I + W^½ K W^½.
"""

from __future__ import annotations

import numpy as np
import pymc as pm
import pytensor
import pytensor.tensor as pt
from pytensor.gradient import disconnected_grad, grad
from pytensor.graph.replace import graph_replace
from pytensor.graph.traversal import ancestors
from pytensor.tensor.nlinalg import MatrixInverse

from pymc_optim.backends.newton import NewtonOp
from pymc_optim.graph.solver_op import make_solution
from pymc_optim.implicit import OptimalityCondition
from pymc_optim.linalg.latent_gaussian import (
    LatentGaussianStructure,
    covariance_solve,
    logdet_b,
)
from pymc_optim.problems._arguments import check_optimizer_kwargs, newton_options, split_problem

__all__ = ["latent_gaussian_mode", "latent_gaussian_structure"]

#: Priors whose precision (or covariance) is read off the model, and the form of H they give.
#: (A Normal latent under an element-wise likelihood has a diagonal H: "auto" finds that.)
PRIOR_FORMS = {
    "MvNormalRV": "covariance",
    "ICARRV": "precision",
    "CARRV": "precision",
    "AutoRegressiveRV": "precision",
    "RandomWalkRV": "precision",
}
#: Relative agreement of H_lik v with w ⊙ v that makes the likelihood's curvature diagonal:
#: both are the same sums of products for a diagonal H_lik, so they agree to rounding (1e-16);
#: an off-diagonal entry would have to cancel to this accuracy at two random points.
DIAGONAL_RTOL = 1e-10


def latent_gaussian_structure(model: pm.Model, latent_rvs, seed: int = 20261201):
    """`LatentGaussianStructure` when the latent's prior is a Gaussian read here and the
    likelihood's curvature in it is diagonal (at two random points), else None.

    The check costs two Hessian-vector products: nothing of size d × d is built. The covariance
    form also needs w ≥ 0 there (B = I + W^½ K W^½).
    """
    if len(latent_rvs) != 1:
        return None
    (rv,) = latent_rvs
    form = PRIOR_FORMS.get(type(rv.owner.op).__name__)
    if form is None or model.rvs_to_transforms.get(rv) is not None:
        return None
    if form == "covariance" and _precision_of_mvnormal(rv.owner.inputs[3]) is not None:
        form = "precision"  # MvNormal(tau=...): PyMC inverted tau; use tau itself
    if not prior_matrix(rv, form, check_only=True):
        return None
    observed = [obs for obs in model.observed_RVs if rv in ancestors([obs])]
    value = model.rvs_to_values[rv]
    start = model.initial_point()
    shape = np.shape(start[value.name])
    d = int(np.prod(shape, dtype=int))
    z = pt.vector("z", dtype=value.dtype, shape=(d,))
    likelihood = graph_replace(
        model.logp(vars=observed, sum=True), {value: z.reshape(shape)}, strict=False
    )
    curvature = likelihood_curvature(-likelihood, z)
    direction = z.type("direction")
    hvp = grad((grad(-likelihood, z) * direction).sum(), z)
    others = [v for v in model.value_vars if v is not value]
    fn = pytensor.function([z, *others, direction], [hvp, curvature], on_unused_input="ignore")
    rng = np.random.default_rng(seed)
    found = 0
    for _ in range(8):  # two finite points, retrying jitters that fail (as the pattern probe)
        point = {
            name: np.asarray(val + rng.uniform(-1, 1, np.shape(val))).astype(np.asarray(val).dtype)
            if np.issubdtype(np.asarray(val).dtype, np.floating)
            else val
            for name, val in start.items()
        }
        v = rng.standard_normal(d).astype(z.dtype)
        Hv, w = fn(point[value.name].ravel(), *[point[o.name] for o in others], v)
        if not (np.all(np.isfinite(Hv)) and np.all(np.isfinite(w))):
            continue
        scale = np.max(np.abs(w * v), initial=0.0)
        if not np.allclose(Hv, w * v, rtol=DIAGONAL_RTOL, atol=DIAGONAL_RTOL * scale):
            return None
        if form == "covariance" and np.any(w < 0):
            return None  # B = I + W^½ K W^½ needs w ≥ 0 (a log-concave likelihood)
        found += 1
        if found == 2:
            return LatentGaussianStructure(form=form)
    return None


def latent_gaussian_mode(objective, negative_likelihood, z, x0, prior, structure, kwargs):
    """x* = argmin `objective` by graph-native Newton with A = Q + diag(w) built from parts, and
    H at x* in the structure's compact form: ``(z_star, success, hessian, marginal)``.

    `prior` is the latent's random variable (its parameters are the model's); Q (or K) enters
    the solver as one more parameter, computed once per evaluation outside it; w is one reverse
    pass of the likelihood inside each Newton step.

    For the covariance form the solver minimizes (and `solution_info` reports) `objective`
    less its terms free of z: −log p(y | z) + ½ (z − μ)ᵀK⁻¹(z − μ).

    `marginal` is ℓ(x*) + (d/2) log 2π − ½ log det H written for the form, or None (the caller
    writes it from the joint density). For the covariance form it is Rasmussen & Williams'
    (2006, Alg. 3.1) log p(y | x*) − ½ (x* − μ)ᵀK⁻¹(x* − μ) − ½ log det B: the prior's
    log det K and that of H cancel, and K⁻¹ enters only through solves with K's Cholesky
    factor, differentiated by hand (`covariance_solve`, `logdet_b`), so no Cholesky gradient
    is in the graph. The Newton condition is then F = K⁻¹(z − μ) + ∇(−log p(y | z)), the same
    function as the gradient of `objective`, written so that its pullback is one solve too.
    """
    matrix = prior_matrix(prior, structure.form)
    options = newton_options(check_optimizer_kwargs(kwargs, reserved={}))
    covariance = structure.form == "covariance"
    if covariance:
        # z has x0's static shape (a symbolic shape of z would tie the mean to z)
        mean = pt.broadcast_to(prior.owner.inputs[2], z.type.shape).astype("float64")
        # K's factor carries no gradient of its own (covariance_solve differentiates through K);
        # marked so, the solver's pullback does not send a zero through Cholesky's gradient
        factor = disconnected_grad(pt.linalg.cholesky(matrix, lower=True))
        prior_gradient = covariance_solve(matrix, factor, z - mean)
        merit = negative_likelihood + 0.5 * ((z - mean) * prior_gradient).sum()
        # (the joint's own prior term is left out: its x-independent parts, matrix solves with
        # L, would be computed for the solver on every evaluation and used by nothing)
        problem = split_problem([merit, negative_likelihood, prior_gradient], [z])
    else:
        problem = split_problem([objective, negative_likelihood], [z])
    problem, (inner_matrix,) = problem.with_parameters([matrix])
    inner_objective, inner_negative_likelihood, *inner_prior_gradient = problem.inner_outputs
    (inner_z,) = problem.inner_xs
    if covariance:
        # the merit: −log p(y | z) + ½ (z − μ)ᵀK⁻¹(z − μ), the objective less its z-free terms
        residual = inner_prior_gradient[0] + grad(inner_negative_likelihood, inner_z)
    else:
        residual = grad(inner_objective, inner_z)
    condition = OptimalityCondition(
        problem.inner_xs,
        problem.inner_params,
        [residual],
        symmetric=True,
        structure=structure,
        parts=(inner_matrix, likelihood_curvature(inner_negative_likelihood, inner_z)),
    )
    op = NewtonOp(
        problem,
        condition=condition,
        merit=inner_objective,
        value=inner_objective,
        minimization=True,
        **options,
    )
    z_star, success = make_solution(op, [pt.as_tensor_variable(x0)], [], False)
    # H at x* from the condition's own parts, as the implicit pullback builds A: the same graph
    # twice, merged at compile time, so the log-determinant and the pullback's solve share one
    # factorization of B (or of Q + W)
    to_outer = dict(zip(problem.inner_xs, [z_star], strict=True))
    to_outer.update(zip(problem.inner_params, problem.outer_params, strict=True))
    hessian = graph_replace(condition.jacobian(), to_outer, strict=False)
    marginal = None
    if covariance:
        K, w = structure.compact_parts(hessian)
        centred = z_star - mean
        marginal = (
            -graph_replace(negative_likelihood, {z: z_star}, strict=False)
            - 0.5 * (centred * covariance_solve(K, factor, centred)).sum()
            - 0.5 * logdet_b(K, w)
        )
    return z_star, success, hessian, marginal


def likelihood_curvature(negative_likelihood, z):
    """diag of ∇²(−log p(y | z)) by one reverse pass: (∇² f)ᵀ 1 is the diagonal when ∇² f is."""
    return grad(grad(negative_likelihood, z).sum(), z)


def _precision_of_mvnormal(cov):
    """tau when PyMC built `cov` as matrix_inverse(tau) (``MvNormal(tau=...)``), else None."""
    op = getattr(cov.owner, "op", None)
    core = getattr(op, "core_op", op)
    return cov.owner.inputs[0] if isinstance(core, MatrixInverse) else None


def prior_matrix(rv, form: str, *, check_only: bool = False):
    """The prior's precision Q (``form="precision"``) or covariance K, (d, d) float64, as a graph
    of the prior's parameters. With `check_only`, whether this prior's parameters are of a kind
    read here (not batched, AR of order 1, Normal initial and innovation distributions)."""
    op_name = type(rv.owner.op).__name__
    inputs = rv.owner.inputs
    if op_name == "MvNormalRV":
        cov = inputs[3]
        if cov.type.ndim != 2 or rv.type.ndim != 1:
            return False
        if check_only:
            return True
        tau = _precision_of_mvnormal(cov)
        return (tau if form == "precision" else cov).astype("float64")
    if op_name == "ICARRV":
        W, sigma, zero_sum_stdev = inputs[2:5]
        if W.type.ndim != 2:
            return False
        if check_only:
            return True
        # PyMC's ICAR logp: −Σ_{i<j, W_ij = 1} (x_i − x_j)²/(2σ²) − ½ (Σx / (s N))²
        adjacency = pt.eq(pt.tril(W), 1)
        adjacency = (adjacency + adjacency.T).astype("float64")
        n = W.shape[0]
        laplacian = pt.eye(n) * adjacency.sum(0)[None, :] - adjacency
        return laplacian / sigma**2 + 1.0 / (zero_sum_stdev * n) ** 2
    if op_name == "CARRV":
        W, alpha, tau = inputs[3:6]
        if W.type.ndim != 2 or rv.type.ndim != 1:
            return False
        if check_only:
            return True
        # PyMC's CAR: precision τ (D − α W), D = diag(row sums of W)
        n = W.shape[0]
        return (tau * (pt.eye(n) * W.sum(0)[None, :] - alpha * W)).astype("float64")
    if op_name in ("AutoRegressiveRV", "RandomWalkRV"):
        return _markov_precision(rv, check_only=check_only)
    return False


def _markov_precision(rv, *, check_only: bool):
    """Q of x₀ ~ N(m, s²), x_t = c + ρ x_{t−1} + ε_t, ε_t ~ N(0, σ_t²): tridiagonal, with
    Q_tt += 1/σ_t² and Q_{t−1,t−1} += ρ²/σ_t², Q_{t,t−1} = −ρ/σ_t² for t ≥ 1, Q_00 += 1/s².
    pm.AR of order 1 (ρ the coefficient) and pm.GaussianRandomWalk (ρ = 1)."""
    op = rv.owner.op
    if type(op).__name__ == "AutoRegressiveRV":
        if op.ar_order != 1 or rv.type.ndim != 1:
            return False
        rhos, sigma, init = rv.owner.inputs[:3]
        if rhos.type.ndim != 1:
            return False
        rho = rhos[-1]  # [constant, ρ] with a constant term, else [ρ]
        innovation_sd = sigma
    else:
        if rv.type.ndim != 1:
            return False
        init, innovation = rv.owner.inputs[:2]
        if type(getattr(innovation.owner, "op", None)).__name__ != "NormalRV":
            return False
        rho = pt.constant(1.0)
        innovation_sd = innovation.owner.inputs[3]
    if type(getattr(init.owner, "op", None)).__name__ != "NormalRV" or init.type.shape != (1,):
        return False
    if check_only:
        return True
    n = rv.shape[0]
    init_sd = pt.broadcast_to(init.owner.inputs[3], (1,))[0]
    tau = pt.broadcast_to(1.0 / innovation_sd**2, (n - 1,))  # τ_t for t = 1..n−1
    zero = pt.zeros((1,), dtype="float64")
    diagonal = pt.concatenate([tau, zero]) * rho**2 + pt.concatenate([zero, tau])
    diagonal = pt.set_subtensor(diagonal[0], diagonal[0] + 1.0 / init_sd**2)
    off = pt.concatenate([zero, -rho * tau])  # off[j] = Q_{j−1, j}
    Q = pt.eye(n) * diagonal[None, :] + pt.eye(n, k=1) * off[None, :]
    return (Q + pt.eye(n, k=-1) * off[:, None]).astype("float64")
