"""Latent Gaussian models in `marginalize_laplace`: the prior's Q (or K) read off the model.

When the single latent's prior is a Gaussian whose precision or covariance we can read
(MvNormal with ``cov``, ``chol`` or ``tau`` — GP latents included —, ICAR, CAR, AR(1),
GaussianRandomWalk) and the likelihood's curvature in the latent is diagonal (checked by two
Hessian-vector products at random points), the Newton system and the marginal's Hessian are
H = Q + diag(w) (:class:`pymc_optim.linalg.latent_gaussian.LatentGaussianStructure`): Q or K
computed once per evaluation outside the solver, w by one reverse pass inside each Newton step,
instead of the n reverse passes of a general dense Hessian. Covariance-form priors keep K (never
inverted): Rasmussen & Williams' B = I + W^½ K W^½.

A likelihood that is element-wise in a linear predictor η = c + A x of the latent (a basis
expansion such as `pm.gp.HSGP`'s f = Φ (√S ⊙ β), a design matrix) has curvature Aᵀ diag(w) A
in x: H = Q + Aᵀ diag(w) A, w by one reverse pass in η (``LatentGaussianStructure(basis=True)``;
Q = diag(1/σ²) for a Normal latent). And `resolve_gp_latents` lets a latent be named by a
Deterministic f = μ + A v of a Gaussian v, as PyMC's GP API writes one: `pm.gp.Latent`'s
default f = μ + cholesky(K) v with v ~ N(0, I) is f ~ MvNormal(μ, K), marginalized in the
covariance form (K never inverted); any other such f (HSGP) marginalizes v in the basis form.
"""

from __future__ import annotations

import numpy as np
import pymc as pm
import pytensor
import pytensor.scalar as ps
import pytensor.tensor as pt
from pymc.model.fgraph import fgraph_from_model, model_free_rv, model_from_fgraph
from pymc.pytensorf import rewrite_pregrad
from pytensor.compile.builders import OpFromGraph
from pytensor.compile.ops import DeepCopyOp, ViewOp
from pytensor.compile.rewriting import inline_ofg_node
from pytensor.gradient import grad
from pytensor.graph.basic import Constant
from pytensor.graph.replace import graph_replace
from pytensor.graph.traversal import ancestors, graph_inputs, io_toposort
from pytensor.tensor.basic import NotScalarConstantError, get_underlying_scalar_constant_value
from pytensor.tensor.blockwise import Blockwise
from pytensor.tensor.elemwise import DimShuffle, Elemwise
from pytensor.tensor.linalg import Cholesky, MatrixInverse
from pytensor.tensor.math import Dot
from pytensor.tensor.shape import Reshape, SpecifyShape

from pymc_optim._modes import PYTHON_MODE
from pymc_optim.backends.newton import NewtonOp
from pymc_optim.graph.inner_graph import static_size
from pymc_optim.graph.solver_op import make_solution
from pymc_optim.implicit import OptimalityCondition
from pymc_optim.linalg.latent_gaussian import (
    CovarianceConditionStructure,
    LatentGaussianStructure,
    logdet_b,
)
from pymc_optim.model._fgraph import graphs_at_mode
from pymc_optim.problems._arguments import check_optimizer_kwargs, newton_options, split_problem

__all__ = ["latent_gaussian_mode", "latent_gaussian_structure", "resolve_gp_latents"]

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
#: Passes of PyMC's pre-gradient rewrites `_pregrad_form` makes at most: after two, the graphs
#: of Poisson, binomial and negative binomial likelihoods' curvatures no longer changed.
PREGRAD_PASSES = 4


def latent_gaussian_structure(
    model: pm.Model, latent_rvs, seed: int = 20261201, *, normal: bool = False
):
    """`LatentGaussianStructure` when the latent's prior is a Gaussian read here and the
    likelihood's curvature in it is diagonal (at two random points), or (``basis=True``, a
    precision-form or Normal prior) diagonal in a linear predictor η = c + B x that every path
    from the latent to the likelihood passes through; else None.

    The check costs two Hessian-vector products: nothing of size d × d is built. The covariance
    form also needs w ≥ 0 there (B = I + W^½ K W^½). A Normal latent (independent elements) is
    considered only with `normal` (the caller found its Hessian dense: a diagonal or block one
    is cheaper than Q + Bᵀ W B), and only for the basis form.
    """
    if len(latent_rvs) != 1:
        return None
    (rv,) = latent_rvs
    kind = type(rv.owner.op).__name__
    if normal != (kind == "NormalRV"):
        return None
    form = "precision" if normal else PRIOR_FORMS.get(kind)
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
    others = [v for v in model.value_vars if v is not value]
    if not normal and _diagonal_curvature(-likelihood, z, z, start, value, others, form, seed):
        return LatentGaussianStructure(form=form)
    if form != "precision":
        return None
    predictor = linear_predictor(-likelihood, z)
    if predictor is None:
        return None
    eta, _ = predictor
    if _diagonal_curvature(-likelihood, z, eta, start, value, others, form, seed):
        return LatentGaussianStructure(form=form, basis=True)
    return None


def linear_predictor(negative_likelihood, z):
    """(η, B): the most downstream variable η of `negative_likelihood`'s graph through which
    every path from `z` passes and that is an affine map η = c + B z with a matrix B (see
    `linear_map`), or None."""
    memo: dict = {}
    d = z.size
    nodes = io_toposort([z], [negative_likelihood])
    for node in reversed(nodes):
        for var in node.outputs:
            part = _linear(var, z, d, memo)
            if part is None or part is _CONSTANT or part[0] != "matrix":
                continue
            if z not in ancestors([negative_likelihood], blockers=[var]):
                return var, part[1]
    return None


def _diagonal_curvature(negative_likelihood, z, x, start, value, others, form, seed) -> bool:
    """Whether the Hessian of `negative_likelihood` in `x` (z itself, or a linear predictor of
    it) is diagonal at two random points of the model: H v against w ⊙ v."""
    n = static_size(x)
    if n is None:
        return False
    stand_in = pt.vector("x", dtype=x.dtype, shape=(n,))
    if x is z:
        in_x = negative_likelihood
    else:
        in_x = graph_replace(negative_likelihood, {x: stand_in.reshape(x.type.shape)}, strict=False)
        if z in ancestors([in_x]):
            return False
    at = stand_in if x is not z else z
    curvature = likelihood_curvature(in_x, at)
    direction = at.type("direction")
    hvp = grad((grad(in_x, at) * direction).sum(), at)
    outputs = [hvp, curvature]
    if x is not z:
        outputs = graph_replace(outputs, {stand_in: x.ravel()}, strict=False)
    fn = pytensor.function(
        [z, *others, direction], outputs, on_unused_input="ignore", mode=PYTHON_MODE
    )
    rng = np.random.default_rng(seed)
    found = 0
    for _ in range(8):  # two finite points, retrying jitters that fail (as the pattern probe)
        point = {
            name: np.asarray(val + rng.uniform(-1, 1, np.shape(val))).astype(np.asarray(val).dtype)
            if np.issubdtype(np.asarray(val).dtype, np.floating)
            else val
            for name, val in start.items()
        }
        v = rng.standard_normal(n).astype(z.dtype)
        Hv, w = fn(point[value.name].ravel(), *[point[o.name] for o in others], v)
        if not (np.all(np.isfinite(Hv)) and np.all(np.isfinite(w))):
            continue
        scale = np.max(np.abs(w * v), initial=0.0)
        if not np.allclose(Hv, w * v, rtol=DIAGONAL_RTOL, atol=DIAGONAL_RTOL * scale):
            return False
        if form == "covariance" and np.any(w < 0):
            return False  # B = I + W^½ K W^½ needs w ≥ 0 (a log-concave likelihood)
        found += 1
        if found == 2:
            return True
    return False


def latent_gaussian_mode(objective, negative_likelihood, z, x0, prior, structure, kwargs):
    """x* = argmin `objective` by graph-native Newton with A built from parts, and H at x* in
    the structure's compact form: ``(z_star, success, hessian, marginal)``.

    `prior` is the latent's random variable (its parameters are the model's); Q (or K) enters
    the solver as one more parameter, computed once per evaluation outside it; w is one reverse
    pass of the likelihood inside each Newton step.

    The covariance form never factorizes K. Newton solves G(z) = (z − μ) + K ∇(−log p(y | z))
    = 0, K times the objective's gradient (Rasmussen & Williams 2006, Alg. 3.1), whose Jacobian
    I + K W needs only B = I + W^½ K W^½ (`CovarianceConditionStructure`), with ½‖G‖² as merit;
    `solution_info` reports −log p(y | z) − ½ (z − μ)ᵀ∇(−log p(y | z)), which at the mode is the
    objective less its z-free terms, −log p(y | z) + ½ (z − μ)ᵀK⁻¹(z − μ).

    `marginal` is ℓ(x*) + (d/2) log 2π − ½ log det H written for the form, or None (the caller
    writes it from the joint density). For the covariance form it is Rasmussen & Williams'
    log p(y | x*) − ½ (x* − μ)ᵀK⁻¹(x* − μ) − ½ log det B (the prior's log det K and that of H
    cancel), with K⁻¹(x* − μ) = −∇(−log p(y | x*)) at the mode: as functions of the
    hyperparameters the two forms are equal, so their gradients are too, and this one has no
    solve with K. The log-determinant's B factor (`logdet_b`) is the one the implicit pullback
    solves with.
    """
    matrix = prior_matrix(prior, structure.form, size=z.type.shape[0])
    curvature = basis_curvature if structure.basis else likelihood_curvature
    options = newton_options(check_optimizer_kwargs(kwargs, reserved={}))
    if structure.form == "covariance":
        return _covariance_mode(negative_likelihood, z, x0, prior, matrix, options)
    problem = split_problem([objective, negative_likelihood], [z])
    problem, (inner_matrix,) = problem.with_parameters([matrix])
    inner_objective, inner_negative_likelihood = problem.inner_outputs
    (inner_z,) = problem.inner_xs
    condition = OptimalityCondition(
        problem.inner_xs,
        problem.inner_params,
        [grad(inner_objective, inner_z)],
        symmetric=True,
        structure=structure,
        parts=_pregrad_form([inner_matrix, curvature(inner_negative_likelihood, inner_z)]),
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
    # H at x* as the implicit pullback builds A (`jacobian_at`): the same nodes twice, merged at
    # compile time, so the log-determinant and the pullback's solve share one factorization
    hessian = condition.jacobian_at([z_star], problem.outer_params)
    return z_star, success, hessian, None


def _covariance_mode(negative_likelihood, z, x0, prior, K, options):
    """`latent_gaussian_mode` for a prior z ~ N(μ, K): Newton on G(z) = (z − μ) + K ∇(−log
    p(y | z)) = 0, K never factorized (see there)."""
    # z has x0's static shape (a symbolic shape of z would tie the mean to z)
    mean = pt.broadcast_to(prior.owner.inputs[2], z.type.shape).astype("float64")
    likelihood_gradient = grad(negative_likelihood, z)  # ∇(−log p(y | z))
    centred = z - mean
    # at the mode K⁻¹(z − μ) = −∇(−log p(y | z)): the objective less its z-free terms
    value = negative_likelihood - 0.5 * (centred * likelihood_gradient).sum()
    problem = split_problem([value, negative_likelihood, centred + K @ likelihood_gradient], [z])
    problem, (inner_K,) = problem.with_parameters([K])
    inner_value, inner_negative_likelihood, residual = problem.inner_outputs
    (inner_z,) = problem.inner_xs
    condition = OptimalityCondition(
        problem.inner_xs,
        problem.inner_params,
        [residual],
        symmetric=False,
        structure=CovarianceConditionStructure(),
        parts=_pregrad_form([inner_K, likelihood_curvature(inner_negative_likelihood, inner_z)]),
    )
    # ½‖G‖² as merit: the Newton direction descends it (slope −‖G‖²); G is not a gradient
    op = NewtonOp(
        problem,
        condition=condition,
        merit=0.5 * (residual**2).sum(),
        value=inner_value,
        minimization=False,
        **options,
    )
    z_star, success = make_solution(op, [pt.as_tensor_variable(x0)], [], False)
    # [K; w*ᵀ]: the pullback's A = I + K W* and H = K⁻¹ + W* have the same parts, built by
    # the same nodes (`jacobian_at`), so the log-determinant shares the pullback's B factor
    hessian = condition.jacobian_at([z_star], problem.outer_params)
    K_star, w_star = LatentGaussianStructure(form="covariance").compact_parts(hessian)
    # (the gradient apart from PyMC's pre-gradient rewrites: `graphs_at_mode`)
    negative_likelihood_star, gradient_star = graphs_at_mode(
        [negative_likelihood, likelihood_gradient], z, z_star
    )
    marginal = (
        -negative_likelihood_star
        + 0.5 * ((z_star - mean) * gradient_star).sum()
        - 0.5 * logdet_b(K_star, w_star)
    )
    return z_star, success, hessian, marginal


def _pregrad_form(parts) -> tuple:
    """`parts` (the condition's prior matrix and curvature) in a form PyMC's pre-gradient
    rewrites (`rewrite_pregrad`) leave as it is: their OpFromGraph rewritten as PyMC rewrites
    it, until a pass changes nothing (at most `PREGRAD_PASSES` passes).

    A at the solution reaches the marginal and the implicit pullback through one OpFromGraph of
    the parts (`OptimalityCondition.jacobian_at`). PyMC rewrites the inner graph of every
    OpFromGraph in a log density before differentiating it, which makes a new Op of one whose
    graph changes; the pullback, built after, applies the condition's own Op, and A was then
    formed and factorized once for each. Parts in this form keep one Op, whose applications
    merge.
    """
    inputs = [v for v in graph_inputs(parts) if not isinstance(v, Constant)]
    op = OpFromGraph(inputs, list(parts), on_unused_input="ignore")
    for _ in range(PREGRAD_PASSES):
        inner = op.fgraph.unfreeze()
        rewrite_pregrad(inner)
        rewritten = op.clone_with_inner_graph(inner)
        if rewritten == op:
            break
        op = rewritten
    return tuple(inline_ofg_node(op.make_node(*inputs)))


def resolve_gp_latents(model: pm.Model, latent):
    """`model` and `latent` with each latent named by a Deterministic f = μ + A v, v a free
    Gaussian variable and μ, A free of it (PyMC's GP API: `pm.gp.Latent`, `pm.gp.HSGP`), made
    something `marginalize_laplace` integrates out.

    * f = μ + cholesky(K) v with v ~ N(0, I) (``pm.gp.Latent(...).prior("f", X)``, non-centred
      by default) and nothing else using v: f ~ MvNormal(μ, K). The model is rewritten with
      that MvNormal in place of v and f, so f is marginalized in the covariance form (K never
      inverted) and recovered under its own name and dims.
    * any other such f (HSGP's f = μ + Φ (√S ⊙ β)): v itself is marginalized (in the basis
      form H = Q + Aᵀ W A) and f is recovered as its Deterministic.

    Other names are returned unchanged. The user's model is never changed.
    """
    items = list(latent) if isinstance(latent, list | tuple) else [latent]
    out = []
    for item in items:
        name = item if isinstance(item, str) else getattr(item, "name", None)
        var = model.named_vars.get(name)
        if var is None or var not in model.deterministics:
            out.append(item)
            continue
        source, (kind, matrix) = _gaussian_source(model, var)
        others = [x for x in [*model.deterministics, *model.observed_RVs, *model.potentials]]
        used_elsewhere = any(
            x is not var and source in ancestors([x], blockers=[var]) for x in others
        )
        if (
            len(items) == 1
            and kind == "matrix"
            and var.type.ndim == 1
            and source.type.ndim == 1
            and _cholesky_input(matrix) is not None
            and _is_standard_normal(source)
            and not used_elsewhere
        ):
            model = _as_multivariate_normal(model, var, source)
            out.append(name)
        else:
            out.append(source.name)
    return model, (out if isinstance(latent, list | tuple) else out[0])


def _gaussian_source(model: pm.Model, var):
    """(v, linear part) of a Deterministic f = μ + A v with v a free variable (the only one f is
    affine in, A a matrix: a rescaling 2 v is not a GP); ValueError or NotImplementedError
    saying what works otherwise."""
    found = []
    for rv in model.free_RVs:
        if rv in ancestors([var]):
            part = linear_map(var, rv)
            if part is not None and part is not _CONSTANT and part[0] == "matrix":
                found.append((rv, part))
    if len(found) != 1:
        what = (
            "no free variable"
            if not found
            else f"several free variables ({', '.join(rv.name for rv, _ in found)})"
        )
        raise ValueError(
            f"`latent` {var.name!r} is not a free random variable of the model but a "
            "Deterministic, and only a Deterministic f = mu + A @ v, A a matrix and v one free "
            "Gaussian variable, can be marginalized (as `pm.gp.Latent(...).prior` and "
            "`pm.gp.HSGP(...).prior` write a GP); it is such a map of "
            f"{what}. Pass the free variables to integrate out instead (free variables: "
            f"{[rv.name for rv in model.free_RVs]})."
        )
    rv, part = found[0]
    kind = type(rv.owner.op).__name__
    if kind != "NormalRV" and kind not in PRIOR_FORMS:
        raise NotImplementedError(
            f"`latent` {var.name!r} is a Deterministic of `{rv.name}`, whose prior ({kind}) is "
            "not Gaussian: the Laplace marginal integrates out a Gaussian latent (a Student-t "
            "process, `pm.gp.TP`, is not supported). Write the GP with `pm.gp.Latent` or "
            "`pm.gp.HSGP`, or give the latent a Gaussian prior."
        )
    return rv, part


def _as_multivariate_normal(model: pm.Model, f, v):
    """A copy of `model` in which the Deterministic f = μ + cholesky(K) v (v ~ N(0, I)) is the
    free variable f ~ MvNormal(μ, K), with f's name and dims, and v is gone."""
    fgraph, memo = fgraph_from_model(model, inlined_views=True)
    f_fg, v_fg = memo[f], memo[v]
    expression = f_fg.owner.inputs[0]
    _, matrix = linear_map(expression, v_fg)
    rv = pm.MvNormal.dist(mu=_offset(expression, v_fg, matrix), cov=_cholesky_input(matrix))
    new = model_free_rv(rv, rv.type(name=f.name), None, f.name, *f_fg.owner.op.dims)
    fgraph.replace(f_fg, new, import_missing=True)
    fgraph.remove_output(fgraph.outputs.index(v_fg))
    new_model = model_from_fgraph(fgraph, mutate_fgraph=True)
    # the user's order of free variables (f in v's place), as marginalize_laplace keeps it
    order = {rv.name: i for i, rv in enumerate(model.free_RVs)}
    order[f.name] = order[v.name]
    new_model.free_RVs.sort(key=lambda rv: order[rv.name])
    return new_model


def likelihood_curvature(negative_likelihood, z):
    """diag of ∇²(−log p(y | z)) by one reverse pass: (∇² f)ᵀ 1 is the diagonal when ∇² f is."""
    return grad(grad(negative_likelihood, z).sum(), z)


def basis_curvature(negative_likelihood, z):
    """Bᵀ diag(w) B: the Hessian of a likelihood element-wise in its linear predictor
    η = c + B z (`linear_predictor`), w by one reverse pass in η."""
    predictor = linear_predictor(negative_likelihood, z)
    if predictor is None:
        raise RuntimeError(
            "The solver's likelihood has no linear predictor, but its structure was chosen for "
            "one (basis=True); please report this with the model."
        )
    eta, B = predictor
    stand_in = eta.type()
    in_eta = graph_replace(negative_likelihood, {eta: stand_in}, strict=False)
    w = graph_replace(likelihood_curvature(in_eta, stand_in), {stand_in: eta}, strict=False)
    w = w.ravel().astype("float64")
    B = B.astype("float64")
    return B.T @ (w[:, None] * B)


def _precision_of_mvnormal(cov):
    """tau when PyMC built `cov` as matrix_inverse(tau) (``MvNormal(tau=...)``), else None."""
    op = getattr(cov.owner, "op", None)
    core = getattr(op, "core_op", op)
    return cov.owner.inputs[0] if isinstance(core, MatrixInverse) else None


def prior_matrix(rv, form: str, *, size: int | None = None, check_only: bool = False):
    """The prior's precision Q (``form="precision"``) or covariance K, (d, d) float64, as a graph
    of the prior's parameters (d = `size` where rv's shape is not static). With `check_only`,
    whether this prior's parameters are of a kind read here (not batched, AR of order 1, Normal
    initial and innovation distributions)."""
    op_name = type(rv.owner.op).__name__
    inputs = rv.owner.inputs
    if op_name == "NormalRV":  # independent elements (the basis form): Q = diag(1/σ²)
        if check_only:
            return True
        precision = pt.broadcast_to(
            1.0 / inputs[3].astype("float64") ** 2, _shape(rv, size)
        ).ravel()
        return pt.eye(precision.shape[0], dtype="float64") * precision[None, :]
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
        return _markov_precision(rv, size=size, check_only=check_only)
    return False


def _shape(rv, size):
    """rv's shape, never as a graph of rv itself: rv's node holds its random generator, which
    must not reach a log density (nutpie refuses a shared generator input). `size`, the number
    of rv's elements, stands in for a vector's unknown length."""
    if None not in rv.type.shape:
        return tuple(rv.type.shape)
    if rv.type.ndim == 1 and size is not None:
        return (size,)
    return rv.shape


def _markov_precision(rv, *, size: int | None, check_only: bool):
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
    n = _shape(rv, size)[0]
    init_sd = pt.broadcast_to(init.owner.inputs[3], (1,))[0]
    tau = pt.broadcast_to(1.0 / innovation_sd**2, (n - 1,))  # τ_t for t = 1..n−1
    zero = pt.zeros((1,), dtype="float64")
    diagonal = pt.concatenate([tau, zero]) * rho**2 + pt.concatenate([zero, tau])
    diagonal = pt.set_subtensor(diagonal[0], diagonal[0] + 1.0 / init_sd**2)
    off = pt.concatenate([zero, -rho * tau])  # off[j] = Q_{j−1, j}
    Q = pt.eye(n) * diagonal[None, :] + pt.eye(n, k=1) * off[None, :]
    return (Q + pt.eye(n, k=-1) * off[:, None]).astype("float64")


# --- linear maps read off a graph ---------------------------------------------------------------
#: Ops that keep the elements of their first input in C order (reshapes, views, broadcastable
#: dims added or dropped are checked in `_order_keeping`).
_PASS_THROUGH = (Reshape, SpecifyShape, ViewOp, DeepCopyOp)
_CONSTANT = "constant"


def linear_map(expression, source):
    """A with flat(`expression`) = c + A flat(`source`), c free of `source`, read off the graph:
    ``("matrix", A)`` ((n, d)), ``("scale", s)`` when A = diag(s) (s a scalar or a (d,)
    vector), or None when the graph is not affine in `source` by these rules: reshapes and
    order-keeping dim shuffles, sums and differences, products and quotients by
    `source`-free factors, and matrix products with a `source`-free matrix (PyMC's
    ``cholesky(K).dot(v)`` and ``phi @ (beta * sqrt_psd)``). Other variables of the graph are
    parameters of A and c."""
    memo: dict = {}
    d = pt.as_tensor_variable(source).size
    return _linear(expression, source, d, memo)


def _linear(var, source, d, memo):
    if var in memo:
        return memo[var]
    memo[var] = out = _linear_step(var, source, d, memo)
    return out


def _linear_step(var, source, d, memo):
    if var is source:
        return ("scale", None)  # the identity
    owner = var.owner
    if owner is None:
        return _CONSTANT
    parts = [_linear(i, source, d, memo) for i in owner.inputs]
    if all(p is _CONSTANT for p in parts):
        return _CONSTANT
    if any(p is None for p in parts):
        return None
    op = owner.op
    linear = [i for i, p in enumerate(parts) if p is not _CONSTANT]
    if isinstance(op, _PASS_THROUGH):
        return parts[0] if linear == [0] else None
    if isinstance(op, DimShuffle):
        return parts[0] if _order_keeping(op, owner.inputs[0]) else None
    core = op.core_op if isinstance(op, Blockwise) else op
    if isinstance(core, Dot):
        return _matrix_product(owner, parts, linear, d)
    if not isinstance(op, Elemwise):
        return None
    # element-wise: a linear input must not be broadcast (it has the output's elements)
    if any(owner.inputs[i].type.broadcastable != var.type.broadcastable for i in linear):
        return None
    scalar = op.scalar_op
    if isinstance(scalar, ps.Add):
        return _sum([parts[i] for i in linear], d)
    if isinstance(scalar, ps.Sub):
        signed = [parts[i] if i == 0 else _scaled(parts[i], pt.constant(-1.0)) for i in linear]
        return _sum(signed, d)
    if isinstance(scalar, ps.Neg):
        return _scaled(parts[0], pt.constant(-1.0))
    if isinstance(scalar, ps.Mul) and len(linear) == 1:
        (i,) = linear
        factors = [x for j, x in enumerate(owner.inputs) if j != i]
        return _scaled(parts[i], _flat_factor(pt.mul(*factors), var))
    if isinstance(scalar, ps.TrueDiv) and linear == [0]:
        return _scaled(parts[0], _flat_factor(1.0 / owner.inputs[1], var))
    return None


def _order_keeping(op, x):
    """Whether a DimShuffle keeps x's elements in C order (it adds or drops length-1 dims, or
    moves them, but not two dims of other lengths past each other)."""
    kept = [i for i in op.new_order if i != "x" and not x.type.broadcastable[i]]
    return kept == sorted(kept)


def _flat_factor(factor, like):
    """A factor broadcast against `like`, as a scalar or a flat vector over like's elements."""
    if all(factor.type.broadcastable):
        return factor.squeeze() if factor.type.ndim else factor
    # like's static shape where known: its symbolic shape would tie A to the latent
    shape = like.type.shape if None not in like.type.shape else like.shape
    return pt.broadcast_to(factor, shape).ravel()


def _scaled(part, factor):
    """diag(factor) ∘ part, `factor` a scalar or a vector over part's output elements."""
    kind, a = part
    if kind == "scale":
        return ("scale", factor if a is None else factor * a)
    return ("matrix", (factor if factor.type.ndim == 0 else factor[:, None]) * a)


def _as_matrix(part, d):
    kind, a = part
    if kind == "matrix":
        return a
    return _times_scale(pt.eye(d), a)


def _times_scale(matrix, a):
    """matrix @ diag(a) (a None for the identity, a scalar, or a vector)."""
    if a is None:
        return matrix
    return matrix * (a if a.type.ndim == 0 else a[None, :])


def _sum(parts, d):
    if len(parts) == 1:
        return parts[0]
    if all(kind == "scale" for kind, _ in parts):
        return ("scale", pt.add(*(pt.constant(1.0) if a is None else a for _, a in parts)))
    return ("matrix", pt.add(*(_as_matrix(p, d) for p in parts)))


def _matrix_product(owner, parts, linear, d):
    """B @ x or x @ B with B a free matrix and x linear, a vector, a column (B @ x) or a row
    (x @ B): flat(out) = B flat(x), or Bᵀ flat(x)."""
    if len(linear) != 1:
        return None
    (i,) = linear
    B, x = owner.inputs[1 - i], owner.inputs[i]
    if B.type.ndim != 2 or x.type.ndim not in (1, 2):
        return None
    if x.type.ndim == 2 and not x.type.broadcastable[1 if i == 1 else 0]:
        return None  # a matrix of several columns (rows): not one vector
    left = B if i == 1 else B.T
    kind, a = parts[i]
    if kind == "scale":
        return ("matrix", _times_scale(left, a))
    return ("matrix", left @ a)


def _offset(expression, source, matrix):
    """c of flat(expression) = c + A flat(source) (A = `matrix`, a vector source): the
    expression at source = 0 (zeros_like(source) would keep source in the graph)."""
    zeros = pt.zeros(matrix.shape[1], dtype=source.dtype)
    return graph_replace(expression, {source: zeros}, strict=False).ravel()


def _cholesky_input(matrix):
    """K when `matrix` is ``cholesky(K)`` (lower), else None."""
    op = getattr(matrix.owner, "op", None)
    core = op.core_op if isinstance(op, Blockwise) else op
    if isinstance(core, Cholesky) and core.lower:
        return matrix.owner.inputs[0]
    return None


def _is_standard_normal(rv) -> bool:
    if type(rv.owner.op).__name__ != "NormalRV":
        return False
    try:
        mu, sigma = (get_underlying_scalar_constant_value(x) for x in rv.owner.inputs[2:4])
    except NotScalarConstantError:
        return False
    return mu == 0 and sigma == 1
