"""Laplace marginalization of latent fields in a pm.Model (INLA style), and latent recovery."""

from __future__ import annotations

import threading
import warnings
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor, as_completed
from contextlib import nullcontext
from typing import NamedTuple

import numpy as np
import pymc as pm
import pytensor
import pytensor.tensor as pt
from pymc.model.fgraph import (
    ModelDeterministic,
    ModelObservedRV,
    ModelPotential,
    ModelVar,
    fgraph_from_model,
    model_from_fgraph,
)
from pytensor.gradient import disconnected_type, grad
from pytensor.graph.basic import Apply, Constant
from pytensor.graph.op import Op
from pytensor.graph.replace import clone_replace, graph_replace, vectorize_graph
from pytensor.graph.rewriting.basic import node_rewriter
from pytensor.graph.traversal import ancestors
from pytensor.tensor.rewriting.basic import register_canonicalize
from pytensor.tensor.variable import TensorVariable

from pymc_optim._memory import available_memory
from pymc_optim._modes import PYTHON_MODE
from pymc_optim._progress import Progress
from pymc_optim._warnings import PymcOptimWarning
from pymc_optim.backends import newton as _newton
from pymc_optim.backends.newton import NewtonOp
from pymc_optim.backends.packing import Packer
from pymc_optim.graph.inner_graph import static_size
from pymc_optim.implicit import OptimalityCondition
from pymc_optim.linalg import detect
from pymc_optim.linalg.latent_gaussian import LatentGaussianStructure
from pymc_optim.linalg.sparse import SparseStructure
from pymc_optim.linalg.structure import LinearStructure, _finite, as_linear_structure
from pymc_optim.model._fgraph import graphs_at_mode, outer_inputs, replace_variables
from pymc_optim.model._idata import require_group
from pymc_optim.model.constraints import (
    constrained_logdet,
    constrained_mode,
    constraint_matrix,
    krige,
)
from pymc_optim.model.failure import apply_failure_policy, check_on_failure
from pymc_optim.model.latent_gaussian import (
    latent_gaussian_mode,
    latent_gaussian_structure,
    resolve_gp_latents,
)
from pymc_optim.problems.minimize import minimize

__all__ = ["LaplaceInfo", "laplace_info", "marginalize_laplace", "recover_latent"]

#: Largest latent size whose numerical Hessian pattern "auto" computes (see
#: :mod:`pymc_optim.linalg.detect`). Larger latents get the structural reading only.
AUTO_STRUCTURE_MAX_SIZE = detect.NUMERIC_MAX_SIZE
#: (d, d) float64 matrices a dense or latent-Gaussian marginal holds at its peak while compiled
#: and evaluated (logp and gradient): 12–16 measured for a GP and a pm.ICAR latent of 1,500 and
#: 3,000 values (peak resident memory less the model's, over 8 d² bytes).
_DENSE_COPIES = 16
#: The numerical Hessian pattern shows a progress bar from this many compiled calls on (latents
#: of more than 4 · PROBE_CHUNK = 512 elements): below, it takes about a second.
_PROBE_PROGRESS_CALLS = 10
#: Latent priors for which the Laplace approximation is exact given a Gaussian likelihood.
#: By the class name of their Op in PyMC 5.28 (pm.Normal, pm.MvNormal with `cov`, `chol` or `tau`,
#: pm.ZeroSumNormal, pm.CAR, pm.ICAR, pm.MatrixNormal, pm.KroneckerNormal; pm.gp latents are
#: MvNormal). ICAR and CAR are Gaussian Markov random fields (ICAR's precision is singular
#: along the constant vector; its zero-sum constraint is in its log density).
_GAUSSIAN_PRIORS = {
    "NormalRV",
    "MvNormalRV",
    "PrecisionMvNormalRV",
    "ZeroSumNormalRV",
    "CARRV",
    "ICARRV",
    "MatrixNormalRV",
    "KroneckerNormalRV",
    "GMRF",  # pymc_optim.distributions.gmrf (CustomDist class names)
    "ICAR",
    "RW",
}
#: Gaussian when the distributions they are built from are (pm.GaussianRandomWalk is a RandomWalk
#: of Normal innovations; pm.AR's innovations are Normal, its `init_dist` need not be).
_GAUSSIAN_IF_COMPONENTS_ARE = {"RandomWalkRV", "AutoRegressiveRV"}


def marginalize_laplace(
    model: pm.Model,
    latent: str | TensorVariable | Sequence[str | TensorVariable],
    *,
    method: str = "newton",
    hessian_structure: str = "auto",
    block_size: int | None = None,
    on_failure: str = "reject",
    optimizer_kwargs: Mapping | None = None,
    warm_start: bool = True,
) -> pm.Model:
    """A new model in which `latent` is integrated out by a Laplace approximation.

    With ℓ(x, θ) the log density of the latent and of every observed variable that depends on
    it, x* = argmaxₓ ℓ and H = −∇²ₓℓ(x*, θ), the new model carries the potential

        log p(y | θ) ≈ ℓ(x*, θ) + (d/2) log 2π − ½ log det H,

    in the latent's unconstrained space (with its log-Jacobian) when it has a transform. NUTS on
    the new model samples only the hyperparameters θ; gradients flow through the implicit
    derivative of x*(θ). :func:`recover_latent` draws the latent field afterwards.

    Parameters
    ----------
    model : pm.Model
        Left unchanged.
    latent : str, TensorVariable or list of them
        Free, continuous random variables of `model` to integrate out, or a Gaussian process
        by the name given to PyMC's GP ``prior``: a Deterministic f = μ + A v of one free
        Gaussian v (``pm.gp.Latent``, non-centred by default, is integrated out as
        f ~ MvNormal(μ, K); ``pm.gp.HSGP`` through its coefficients v). :func:`recover_latent`
        returns f under its name and dims.
    method : str, default "newton"
        The inner solver of :func:`pymc_optim.minimize` (``"newton"`` is graph-native).
    hessian_structure : {"auto", "dense", "diagonal", "block_diagonal", "sparse"}, default "auto"
        Layout of H. ``"diagonal"`` when each latent element enters the density separately
        (independent random effects with an element-wise likelihood), ``"block_diagonal"`` for
        contiguous groups of `block_size` elements of the flattened latents (several effects
        per group), ``"sparse"`` for a Gaussian Markov random field (ICAR, CAR, random walks,
        a sparse precision: H is factorized by a sparse Cholesky on the pattern read off the
        graph), ``"dense"`` otherwise. ``"auto"`` reads the layout off the model (see
        Notes); the choice is ``pmo.laplace_info(marginal_model).structure``. A wrong explicit
        choice gives a wrong marginal.
    block_size : int, optional
        For ``hessian_structure="block_diagonal"``.
    on_failure : {"reject", "raise", "warn"}, default "reject"
        What a failed inner solve does: ``"reject"`` makes the marginal −inf (NUTS rejects the
        point, which ``pm.sample`` counts as a divergence: ``idata.sample_stats.diverging``);
        ``"raise"`` raises an ``AssertionError`` at that evaluation; ``"warn"`` emits a
        :class:`~pymc_optim.PymcOptimWarning` and evaluates the marginal at the last iterate
        (for exploration, not final inference). Failed evaluations are counted:
        ``pmo.failure_summary(idata)`` reports them after sampling (exactly with
        ``pm.sample(step=pmo.CountingNUTS())``). :func:`recover_latent` records success per
        draw in ``"<latent>_solved"``.
    optimizer_kwargs : dict, optional
        Passed to :func:`pymc_optim.minimize`.
    warm_start : bool, default True
        With ``method="newton"``, each inner solve starts from the mode of the previous
        successful evaluation in the same process and thread (a sampler's next θ is close to its
        last), moved along the secant of the last two, and falls back to the model's initial
        point when that solve fails. The marginal at a given θ does not depend on what was
        evaluated before: every solve ends exact to rounding and with a canonical Newton step
        (see Notes), so ``pm.sample`` draws the same with ``cores=1`` and ``cores=2``. Only the
        default (C) backend warm-starts; under JAX and numba (nutpie) every solve starts cold.
        Pass ``warm_start=False`` when ℓ may have several modes in x.

    Returns
    -------
    marginal_model : pm.Model
        Without the latent variables, the observed variables that depend on them and the
        Deterministics of the latent (:func:`recover_latent` computes those from the latent
        draws); with the potential ``"laplace_marginal"``, whose graph carries what
        :func:`recover_latent` and :func:`laplace_info` need. Other variables, Deterministics
        and coords carry over. The observed variables that depend on the latent are gone:
        ``pm.sample_posterior_predictive`` in it raises a ``NotImplementedError`` showing the
        recipe (unless `var_names` names variables it has); predict and compute pointwise log
        likelihoods in the original model after :func:`recover_latent` (see its Notes).

    Raises
    ------
    ValueError
        Unknown names, observed or discrete latents, latents no observed variable depends on,
        unknown `on_failure`.
    TypeError
        If `model` is not a ``pm.Model``.
    NotImplementedError
        When a free random variable (other than a listed latent) or a Potential depends on a
        latent, or a latent's size depends on ``pm.Data``.

    Warns
    -----
    PymcOptimWarning
        When a latent's prior is not Gaussian: the approximation may then be poor.

    Notes
    -----
    ``hessian_structure="auto"`` evaluates the exact Hessian of the model's log density with
    respect to the (flattened, concatenated, unconstrained) latents at two random points, each
    variable of the model jittered uniformly in (−1, 1) around its initial value in the
    unconstrained space, and keeps the most compact layout holding every nonzero entry of
    either. Structural zeros of the graph are exact zeros in floating point, while an entry
    that depends on the point vanishing at two random points would be a coincidence; the
    hyperparameters are jittered too because a structure can depend on them (a correlation of
    0 at the initial point). If no finite Hessian is found, or the latent has more than
    ``AUTO_STRUCTURE_MAX_SIZE`` elements, the layout is ``"dense"``, which is always correct.
    Before that, a latent of at least ``pymc_optim.linalg.detect.SPARSE_MIN_SIZE`` elements
    whose Hessian pattern, read off the graph without evaluating it, is sparse (at most
    ``SPARSE_MAX_DENSITY`` of a full triangle, and of the dense factorization's flops)
    gets the sparse layout: a GMRF prior (``pmo.distributions`` ICAR with
    ``constraint="corner"``, GMRF, pm.CAR, random walks) under an element-wise likelihood.
    A soft sum-to-zero penalty (``pm.ICAR``, ICAR with ``constraint="soft"``) adds a rank-one
    term that makes H dense, so those stay dense.

    A warm start changes where Newton starts, not what it returns. After max|∇ₓℓ| ≤ `tol`
    (1e-8 unless ``optimizer_kwargs`` says) Newton takes one more step with the Hessian it
    has, so x* is exact to rounding rather than to ≈ tol/λ_min(H) (the log-determinant is not
    stationary in x: a mode off by 1e-9 moved the marginal by ~1e-10 relative, which
    differences of nearby evaluations see); then the mode is rounded to 2⁻²⁴ of its scale and
    one Newton step is taken from there, so the result is a function of θ and of that grid
    point alone, the same bits from any start unless two starts' modes straddle a grid point
    (≈ 1e-8 per element). This assumes one mode of ℓ in x (log-concave likelihoods with a
    Gaussian prior have one); with several, a warm start can settle in another one: pass
    ``warm_start=False``.

    Examples
    --------
    Three group means u with a Gaussian prior around mu and one Gaussian observation each:
    integrating u out is exact here, y_i ~ N(mu, 2), so the marginal's potential equals the
    closed form.

    >>> import numpy as np, pymc as pm
    >>> import pymc_optim as pmo
    >>> y = np.array([0.5, -1.0, 2.0])
    >>> with pm.Model() as model:
    ...     mu = pm.Normal("mu", 0.0, 1.0)
    ...     u = pm.Normal("u", mu, 1.0, shape=3)
    ...     y_obs = pm.Normal("y", u, 1.0, observed=y)
    >>> marginal = pmo.marginalize_laplace(model, "u")
    >>> [rv.name for rv in marginal.free_RVs]
    ['mu']
    >>> laplace = marginal.compile_logp(vars=marginal.potentials)
    >>> exact = pm.logp(pm.Normal.dist(0.3, np.sqrt(2.0)), y).sum().eval()
    >>> bool(np.isclose(laplace({"mu": 0.3}), exact, rtol=1e-10))
    True
    """
    _check_model(model, "model", "marginalize_laplace")
    check_on_failure(on_failure)
    _check_flag(warm_start, "warm_start", "start every inner solve from the initial point")
    model, latent = resolve_gp_latents(model, latent)  # a GP latent named by its Deterministic
    latent_rvs = _check_latents(model, latent)
    initial_point = model.initial_point()  # once: each call compiles a function
    requested = as_linear_structure(hessian_structure, block_size, "hessian_structure")
    # latents whose transform is a linear constraint A x = 0 (a sum-to-zero ICAR or RW):
    # integrated over that subspace by kriging in their N coordinates (model/constraints.py)
    blocks = [constraint_matrix(model.rvs_to_transforms.get(rv)) for rv in latent_rvs]
    kriged = any(block is not None for block in blocks)
    if kriged:
        _check_kriged_structure(requested, latent_rvs, blocks)
    structure = detected = None
    # a kriged latent's structure is read off the graph in its N coordinates, below
    if not kriged and requested == "auto" and method == "newton":
        # a large GMRF latent is best sparse; otherwise H = Q + W where the prior can be read
        if _latent_size(model, latent_rvs, initial_point) >= detect.SPARSE_MIN_SIZE:
            # the graph's readings only: the numerical pattern (n reverse passes, each through
            # the whole prior: ~100 s for a 5,000-point GP) is for latents without a prior to read
            detected = _detect_hessian_structure(
                model, latent_rvs, initial_point, requested, numeric=False
            )
            if isinstance(detected, SparseStructure):
                structure = detected
        if structure is None:
            structure = latent_gaussian_structure(model, latent_rvs)
    if structure is None and not kriged:
        structure = detected or _detect_hessian_structure(
            model, latent_rvs, initial_point, requested
        )
        if requested == "auto" and method == "newton" and structure.kind == "dense":
            # a Normal latent behind a linear predictor (HSGP's coefficients): Q + Bᵀ W B
            structure = latent_gaussian_structure(model, latent_rvs, normal=True) or structure
    if not kriged:  # (a kriged latent's structure is known below)
        _refuse_what_will_not_fit(structure, _latent_size(model, latent_rvs, initial_point))

    fgraph, memo = fgraph_from_model(model, inlined_views=True)
    latent_fg = [memo[rv] for rv in latent_rvs]
    deterministics = _inline_latent_deterministics(fgraph, latent_fg)
    order = {var.name: i for i, var in enumerate(model.deterministics)}
    deterministics.sort(key=lambda item: order[item[0]])  # the user's order
    dependents = _observed_dependents(fgraph, latent_fg, latent_rvs)

    # ℓ(z, θ) on one flat unconstrained control z holding every latent, so that the Hessian's
    # layout is one contiguous vector (and batching over draws stays native). The inner solve
    # starts at the model's initial point, which also fixes the latents' static shapes.
    starts = [
        np.asarray(initial_point[model.rvs_to_values[original].name]) for original in latent_rvs
    ]
    for i, (original, block) in enumerate(zip(latent_rvs, blocks, strict=True)):
        if block is not None:  # the constrained latent's own N values
            transform = model.rvs_to_transforms[original]
            backward = transform.backward(pt.as_tensor(starts[i]))
            starts[i] = np.asarray(pytensor.function([], backward, mode=PYTHON_MODE)())
    x0 = np.concatenate([start.ravel() for start in starts])
    z = pt.tensor(dtype=x0.dtype, shape=x0.shape, name="latent_unconstrained")
    pieces = _split(z, [start.shape for start in starts])
    constrained, log_jacobians = [], []
    for rv, piece, block in zip(latent_fg, pieces, blocks, strict=True):
        transform = rv.owner.op.transform
        if transform is None or block is not None:
            constrained.append(piece)
            log_jacobians.append(pt.constant(0.0))
        else:
            inputs = rv.owner.inputs[0].owner.inputs
            constrained.append(transform.backward(piece, *inputs))
            log_jacobians.append(transform.log_jac_det(piece, *inputs).sum())
    to_constrained = dict(zip(latent_fg, constrained, strict=True))
    terms = []
    for rv, x, log_jac in zip(latent_fg, constrained, log_jacobians, strict=True):
        prior = replace_variables(rv.owner.inputs[0], to_constrained)
        terms.append(_logp(prior, x).sum() + log_jac)
    for obs in dependents:
        obs_rv, data = obs.owner.inputs[0], obs.owner.inputs[1]
        terms.append(_logp(replace_variables(obs_rv, to_constrained), data).sum())
    joint = pt.add(*terms)

    constraint = None
    if kriged:
        constraint = _stacked_constraint(blocks, [start.size for start in starts])
        structure = _kriged_structure(requested, -joint, z, x0.size)
        _refuse_what_will_not_fit(structure, x0.size)
        z_star, success = constrained_mode(
            -joint,
            z,
            x0,
            constraint,
            solve=lambda objective, x, start: minimize(
                objective,
                x,
                x0=start,
                method=method,
                structure=structure,
                optimizer_kwargs=optimizer_kwargs,
            ),
        )
        condition = OptimalityCondition(
            [z], [], [grad(-joint, z)], symmetric=True, structure=structure
        )
        (hessian,) = graphs_at_mode([condition.jacobian()], z, z_star)
        # the Gaussian restricted to {A z = 0}: d − k dimensions, log det(VᵀHV)
        marginal = (
            graph_replace(joint, {z: z_star}, strict=False)
            + 0.5 * (x0.size - constraint.shape[0]) * np.log(2 * np.pi)
            - 0.5 * constrained_logdet(structure, hessian, constraint)
        )
    elif isinstance(structure, LatentGaussianStructure):
        # H = Q + diag(w): Q (or the covariance K) read off the prior, w the likelihood's
        # curvature by one reverse pass (exact: the likelihood's Hessian was found diagonal)
        z_star, success, hessian, marginal = latent_gaussian_mode(
            -joint,
            -pt.add(*terms[len(latent_fg) :]),
            z,
            x0,
            latent_fg[0].owner.inputs[0],
            structure,
            optimizer_kwargs,
        )
    else:
        z_star, success = minimize(
            -joint,
            z,
            x0=x0,
            method=method,
            structure=structure,
            block_size=structure.block_size,
            optimizer_kwargs=optimizer_kwargs,
        )
        condition = OptimalityCondition(
            [z], [], [grad(-joint, z)], symmetric=True, structure=structure
        )
        (hessian,) = graphs_at_mode([condition.jacobian()], z, z_star)
        marginal = None
    if warm_start and isinstance(z_star.owner.op, NewtonOp):
        z_star.owner.op.warm_start = True
    at_mode = {z: z_star}
    d = x0.size
    if marginal is None:  # (a latent-Gaussian covariance form writes its own, without K⁻¹)
        marginal = (
            graph_replace(joint, at_mode, strict=False)
            + 0.5 * d * np.log(2 * np.pi)
            - 0.5 * structure.logdet_positive_definite(hessian)
        )
    marginal = apply_failure_policy(
        marginal, success, on_failure, "the inner solve of the Laplace marginal did not converge"
    )

    # The marginal's value, marked with what recover_latent needs (see LaplaceMarginal): the
    # mode, H and success as inputs, and the map from a latent draw to the latent variables and
    # their Deterministics as an inner graph. In the graph, it survives model transformations.
    recovery_outputs = [*constrained, *(expression for _, expression in deterministics)]
    recovery_names = [
        *(rv.name for rv in latent_rvs),
        *(name for name, _ in deterministics),
    ]
    # the observed variables leave the model: a Deterministic using one uses its data
    removed_observed = {obs: obs.owner.inputs[1] for obs in dependents}
    # (in two steps: graph_replace cannot replace a variable and one of its ancestors at once)
    recovery_outputs = replace_variables(
        replace_variables(recovery_outputs, removed_observed), to_constrained
    )
    params = outer_inputs(recovery_outputs, exclude=[z])
    placeholders = [p.type() for p in params]
    # (clone_replace: a Deterministic and a variable it is computed from may both be params)
    recovery_outputs = clone_replace(recovery_outputs, dict(zip(params, placeholders, strict=True)))
    marker = LaplaceMarginal(
        latent_names=[rv.name for rv in latent_rvs],
        observed_names=[obs.name for obs in dependents],
        output_names=recovery_names,
        dims=[model.named_vars_to_dims.get(name) for name in recovery_names],
        structure=structure,
        recovery_inputs=[z, *placeholders],
        recovery_outputs=recovery_outputs,
        constraint=constraint,
    )
    marked = marker(marginal, z_star, hessian, success, *params)

    for obs in [*dependents, *latent_fg]:
        fgraph.remove_output(fgraph.outputs.index(obs))
    potential = ModelPotential(name="laplace_marginal")(marked)
    fgraph.add_output(potential)
    new_model = model_from_fgraph(fgraph, mutate_fgraph=True)
    # model_from_fgraph orders variables topologically; keep the user's order (it is the order
    # of value variables in compile_dlogp, find_MAP and the sampler's progress output).
    order = {rv.name: i for i, rv in enumerate(model.free_RVs)}
    new_model.free_RVs.sort(key=lambda rv: order[rv.name])
    return new_model


def recover_latent(
    marginal_model: pm.Model,
    idata,
    *,
    random_seed=None,
    progressbar: bool = True,
    mean_correction: bool = True,
    cores: int = 1,
    mode=None,
):
    """Draw the latent field for every posterior draw of the hyperparameters.

    For each draw θ, one draw of the (unconstrained) latent from N(x*(θ) + δ(θ), H(θ)⁻¹), where
    x* is the conditional mode, H the negative Hessian there and δ the first-order correction
    of the mean for the skewness of p(x | θ, y) (see `mean_correction`), mapped to
    the constrained space, added to ``idata.posterior`` under the latent's name and dims, with
    the Deterministics of the latent that :func:`marginalize_laplace` kept out of the marginal
    model (computed from these draws, under their names and dims).

    Each draw's inner solve is its own problem, with its success recorded per draw. A chain's
    draws are visited in a nearest-neighbour tour of their hyperparameters (standardized), and
    each solve starts at the mode of the draw visited before it (a close θ, so a solve takes
    few Newton steps: chord steps on the previous draw's factor of H, then one factorization),
    or at the model's initial point at the first draw of each run of `RUN_DRAWS` draws along
    the tour and after a failed solve; the mode it converges to does not depend on the start
    (to rounding), and each draw keeps its place (and its noise) in the posterior. The runs are
    walked by `cores` threads (the sparse kernels release the GIL); the draws do not depend on
    how many. One function is compiled for a draw: the solve (the
    marginal's own graph for x*(θ) and H), the draw from H's factor and the map to the latent
    variables, kept with the marginal model so that another call on it compiles nothing. The
    marginal is not vectorized over draws, whose stacked copy compiles far more slowly (more
    than 15 minutes for a dense latent of 25).

    Parameters
    ----------
    marginal_model : pm.Model
        A model returned by :func:`marginalize_laplace`, or a transformation of one that keeps
        its potential (e.g. ``pm.model.fgraph.clone_model``).
    idata : xarray.DataTree
        With a ``posterior`` group holding the hyperparameters (what ``pm.sample`` returns).
    random_seed : int or numpy.random.Generator, optional
    progressbar : bool, default True
        Show progress over the draws (of all chains).
    mean_correction : bool, default True
        Centre each draw at x* − H⁻¹ ∇ₓ ½ log det H(x*), the conditional mean to first order
        in the skewness (the mean correction of INLA's simplified Laplace strategy), instead of
        at the mode x*. With count data, the conditional mode of a log rate sits above its mean
        by about 1/(2y) per count y, which over many areas biases the field's summaries; the
        correction removes that first-order term, and is zero where the likelihood is Gaussian.
        It costs one reverse pass through H(x) and one solve per draw. ``False`` draws from
        N(x*, H⁻¹).
    cores : int, default 1
        Threads walking the runs (each with a copy of the compiled function, no second
        compilation). More than one pays with a sparse Hessian, whose factorizations and solves
        run outside the GIL, on cores that nothing else uses (``benchmarks/README.md``,
        ``bench_sparse_laplace.py``); on busy cores the threads only compete.
    mode : str or pytensor.compile.Mode, optional
        The PyTensor backend that compiles the draw function, e.g. ``"NUMBA"`` or ``"JAX"``
        (pass the one the sampling used, e.g. ``"NUMBA"`` after nutpie). Default: PyTensor's
        default mode, the C backend ``pm.sample`` compiles with.

    Returns
    -------
    idata : xarray.DataTree
        The same object, with the latent variables, their Deterministics and
        ``"<latent>_solved"`` (whether the inner solve converged at that draw) added to its
        posterior. Where it is False, the draw is taken around the solver's last iterate.

    Raises
    ------
    TypeError
        If `marginal_model` was not made by :func:`marginalize_laplace`.
    ValueError
        If the posterior lacks a hyperparameter or holds one of the wrong shape.

    Notes
    -----
    The observed variables that depend on the latent are integrated out of the marginal model
    with it, so ``pm.sample_posterior_predictive`` in the marginal model (where PyMC would
    silently return no draws of them) raises a ``NotImplementedError`` that shows this recipe.
    Predict and compare models in the *original* model, on the recovered draws::

        idata = pmo.recover_latent(marginal_model, idata)
        with model:  # the model given to marginalize_laplace
            pm.sample_posterior_predictive(idata, extend_inferencedata=True)
        az.loo(pm.compute_log_likelihood(idata, model=model))

    ``pm.compute_log_likelihood`` gives the pointwise log likelihood of the observed variables
    at the recovered latents (the conditional log likelihood given the latent draw).

    Examples
    --------
    With u_i ~ N(mu, 1) and y_i ~ N(u_i, 1), the conditional of u given y and mu is
    N((mu + y) / 2, 1/2), which the Laplace approximation reproduces exactly: the recovered draws
    (here for 4000 posterior draws of mu, all equal to 0.3) scatter around (0.3 + y) / 2. They
    keep the latent's dims.

    >>> import arviz as az, numpy as np, pymc as pm
    >>> import pymc_optim as pmo
    >>> y = np.array([0.5, -1.0, 2.0])
    >>> with pm.Model(coords={"group": ["a", "b", "c"]}) as model:
    ...     mu = pm.Normal("mu", 0.0, 1.0)
    ...     u = pm.Normal("u", mu, 1.0, dims="group")
    ...     y_obs = pm.Normal("y", u, 1.0, observed=y, dims="group")
    >>> marginal = pmo.marginalize_laplace(model, "u")
    >>> idata = az.from_dict({"posterior": {"mu": np.full((1, 4000), 0.3)}})
    >>> idata = pmo.recover_latent(marginal, idata, random_seed=1, progressbar=False)
    >>> idata.posterior["u"].dims, bool(idata.posterior["u_solved"].all())
    (('chain', 'draw', 'group'), True)
    >>> draws = idata.posterior["u"].values.reshape(-1, 3)
    >>> # 4 standard errors of a mean of 4000 draws with variance 1/2
    >>> bool(np.all(np.abs(draws.mean(axis=0) - (0.3 + y) / 2) < 4 * np.sqrt(0.5 / 4000)))
    True
    """
    _check_model(marginal_model, "marginal_model", "recover_latent")
    _check_flag(mean_correction, "mean_correction", "centre the draws at the mode")
    _check_mode(mode)
    if isinstance(cores, bool) or not isinstance(cores, int | np.integer) or cores < 1:
        raise ValueError(f"`cores` must be a positive integer; got {cores!r}.")
    require_group(
        idata,
        "posterior",
        "recover_latent",
        must_be="an xarray.DataTree with a `posterior` group (what `pm.sample` returns)",
        fix="For a MultiTrace, sample with `return_inferencedata=True`; for a posterior "
        'Dataset `ds`, pass `xr.DataTree.from_dict({"posterior": ds})`.',
    )
    node = _laplace_node(marginal_model)
    rng = np.random.default_rng(random_seed)
    posterior = idata.posterior
    rvs = list(marginal_model.free_RVs)
    missing = [rv.name for rv in rvs if rv.name not in posterior]
    if missing:
        raise ValueError(f"`idata.posterior` lacks the hyperparameters {missing}.")
    n_chains, n_draws = posterior.sizes["chain"], posterior.sizes["draw"]
    for rv in rvs:
        _check_draw_shape(rv, posterior[rv.name].shape, n_chains, n_draws)

    compiled = _recovery_function(marginal_model, node, mean_correction, compile_mode=mode)
    owner, local = threading.get_ident(), threading.local()

    def solve(draw, point, start, noise):
        fn = getattr(local, "fn", None)
        if fn is None:  # another thread: a copy with its own storage (no compilation)
            fn = local.fn = compiled if threading.get_ident() == owner else compiled.copy()
        return _outputs_mode_success(fn(*point, start, noise))

    draws = [np.asarray(posterior[rv.name].values, dtype=rv.type.dtype) for rv in rvs]
    orders = [
        _nearest_neighbour_order(
            np.column_stack([np.reshape(d[c], (n_draws, -1)) for d in draws]).astype(float)
        )
        for c in range(n_chains)
    ]
    per_chain = _recover(
        marginal_model,
        solve,
        draws,
        rng,
        progressbar,
        order=orders,
        run=RUN_DRAWS,
        threads=int(cores),
    )
    _store_recovered(marginal_model, posterior, per_chain)
    return idata


def _recovery_function(marginal_model: pm.Model, node, mean_correction: bool, *, compile_mode=None):
    """The compiled map (hyperparameters, start, standard noise) → (the latent variables and
    their Deterministics at one draw, the mode, success) of `marginal_model`'s Laplace `node`:
    the inner solve from `start`, H at the mode and the draw of N(x* + δ, H⁻¹) in one function,
    so that the draw shares the solve's H and its factorization (the sparse Ops cache the last
    factor by value), and one compilation serves both.

    A Newton solve is `newton.sequential_solve`'s (chord steps on the previous draw's H, the
    final Newton step in this graph): H and δ are taken at its last iterate z, whose H the
    loop factorized, and the draw is centred at x* = z − H(z)⁻¹F(z) + δ. z is within the
    solver's tolerance of x*, so H(z) and δ(z) are H(x*) and δ(x*) to that tolerance.

    Kept per marginal graph, thread, `mean_correction` and `compile_mode` (a compiled function
    holds its own storage, so threads must not share one): a second `recover_latent` on the
    same marginal model compiles nothing.
    """
    rvs = tuple(marginal_model.free_RVs)
    key = (threading.get_ident(), bool(mean_correction), compile_mode, rvs)
    # on the node (not a module-level dict, whose values would keep their keys alive)
    cache = node.tag.__dict__.setdefault("recovery_functions", {})
    if key in cache:
        return cache[key]
    _, mode, hessian, success, *params = node.inputs
    noise = mode.type("noise")
    start = mode.type("start")
    sequential = _newton.sequential_solve(mode, start, hessian)
    if sequential is None:  # another solver: the same solve, started at `start`
        recovered = _recovery_draw(node, mode, hessian, noise, params, mean_correction)
        outputs = _warm_started([*recovered, mode, success], mode, start)
    else:
        x_star, z, at_z, replacements = sequential
        recovered = _recovery_draw(node, z, at_z, noise, params, mean_correction, centre=x_star)
        outputs = graph_replace([*recovered, x_star, success], replacements, strict=False)
    values = [rv.type(name=rv.name) for rv in rvs]
    outputs = replace_variables(outputs, dict(zip(rvs, values, strict=True)))
    cache[key] = pytensor.function(
        [*values, start, noise], outputs, on_unused_input="ignore", mode=compile_mode
    )
    return cache[key]


def _outputs_mode_success(values):
    """(the recovered variables, the mode, success) from `_recovery_function`'s outputs."""
    return values[:-2], values[-2], values[-1]


def _warm_started(outputs, solution, start):
    """`outputs` (graphs of the Laplace mode x* = `solution`) with the inner solve starting at
    `start`.

    The mode does not depend on where Newton starts (up to its tolerance), but the number of
    iterations does: draw after draw, θ moves little, so starting each solve at the previous
    draw's mode takes a few iterations instead of the ~10 from the model's initial point.
    """
    owner = solution.owner
    if owner is None or getattr(owner.op, "n_controls", None) != 1:
        return outputs  # not a one-control solver Op: the start is unused
    x0 = owner.inputs[0]
    # the same Op applied to the new start; its outputs replace the old ones (a constant start
    # cannot itself be replaced)
    restarted = owner.op.make_node(start.astype(x0.dtype), *owner.inputs[1:]).outputs
    return graph_replace(outputs, dict(zip(owner.outputs, restarted, strict=True)), strict=False)


def _recovery_draw(node, mode_in, hessian_in, noise, params, mean_correction, centre=None):
    """Graph of one latent draw of N(c + δ, H⁻¹) at the mode `mode_in` and Hessian `hessian_in`
    of the Laplace `node` (δ as in :func:`_mean_correction`, at `mode_in`; c = `centre`, by
    default `mode_in`), mapped through the recovery graph with the parameters `params`: the
    latent variables and their Deterministics."""
    op = node.op
    _, mode, hessian, *_ = node.inputs
    constraint = op.constraint
    mean = mode_in if centre is None else centre
    if mean_correction:
        mean = mean + _mean_correction(op.structure, mode, hessian, mode_in, hessian_in, constraint)
    draw = op.structure.sample_gaussian(mean, hessian_in, noise)
    if constraint is not None:  # N(x_c + δ, H⁻¹) conditioned on A z = 0
        draw = krige(op.structure, hessian_in, constraint, draw)
    replace = dict(zip(op.recovery_inputs, [draw, *params], strict=True))
    return replace_variables(op.recovery_outputs, replace)


def _nearest_neighbour_order(points: np.ndarray) -> list[int]:
    """A visiting order of the rows of `points` (draws × hyperparameters): a greedy
    nearest-neighbour tour from the first draw in standardized coordinates, so that each inner
    solve starts at the mode of a close θ. O(draws²) arithmetic; past 20,000 draws, the order
    along the draws' main axis instead (as `fit_inla` does)."""
    n = points.shape[0]
    if n < 3:
        return list(range(n))
    spread = points.std(axis=0)
    x = (points - points.mean(axis=0)) / np.where(spread > 0, spread, 1.0)
    if n > 20_000:
        return _main_axis_order(x)
    unvisited = np.ones(n, dtype=bool)
    order, current = [0], 0
    unvisited[0] = False
    for _ in range(n - 1):
        distance = np.where(unvisited, ((x - x[current]) ** 2).sum(axis=1), np.inf)
        current = int(np.argmin(distance))
        unvisited[current] = False
        order.append(current)
    return order


def _main_axis_order(points: np.ndarray) -> list[int]:
    """The rows of `points` (draws × hyperparameters) in order of their position along the
    draws' main axis (first principal component)."""
    centred = points - points.mean(axis=0)
    return list(np.argsort(centred @ np.linalg.svd(centred, full_matrices=False)[2][0]))


def _mean_correction(structure, mode, hessian, at_mode, at_hessian, constraint=None):
    """E[x | θ, y] − x* to first order in the skewness of p(x | θ, y): δ = −H⁻¹ ∇ₓ ½ log det H(x)
    at x* (`at_mode`, with `at_hessian` = H(x*)), a graph of the hyperparameters.

    Writing −log p(x | θ, y) = ½ δᵀHδ + ⅙ T[δ, δ, δ] + …, E[δ_i] = −½ Σ_a (H⁻¹)_ia Σ_bc T_abc
    (H⁻¹)_bc, and Σ_bc T_abc (H⁻¹)_bc = ∂_a log det H(x). For one Poisson count y with a flat
    prior on the log rate this is −1/(2y), the gap between E[log λ] = ψ(y) − log E and the mode
    log(y / E); it is zero where H does not depend on x (a Gaussian likelihood, where the
    Laplace approximation is exact). The mean correction of INLA's simplified Laplace strategy
    (Rue, Martino & Chopin 2009, §3.2.3) is this term. ∇ₓ log det H costs one reverse pass
    through H(x), which the marginal's own gradient also takes; with a sparse H it needs only
    the selected inverse on H's pattern.
    """
    hessian_of_x = graph_replace(hessian, {mode: at_mode}, strict=False)
    if constraint is None:
        logdet = structure.logdet_positive_definite(hessian_of_x)
    else:  # on {A z = 0}: log det(VᵀHV); the draw is kriged afterwards (P_H H⁻¹ = V(VᵀHV)⁻¹Vᵀ)
        logdet = constrained_logdet(structure, hessian_of_x, constraint)
    slope = grad(
        0.5 * logdet,
        at_mode,
        disconnected_inputs="ignore",  # H constant in x: no correction
    )
    shift = -structure.solve(at_hessian, slope, transposed=False, symmetric=True)
    # at a failed solve's last iterate the correction may not exist: draw around the iterate
    return pt.switch(pt.all(_finite(shift)), shift, pt.zeros_like(shift))


#: `recover_latent` walks each chain's tour in runs of at most this many draws, each from the
#: model's initial point (one cold solve per run: ~1 % of a run at N = 10⁴), so that the runs
#: can go to different threads while the draws do not depend on how many there are.
RUN_DRAWS = 250


def _recover(marginal_model, solve, draws, rng, progressbar, *, order=None, run=None, threads=1):
    """Latent draws for the hyperparameter `draws` (one array per free variable, shaped
    (chain, draw, ...)): for each, `solve(draw, point, start, noise)` → (outputs, mode,
    success), the outputs (the latent variables and Deterministics) at one draw of
    N(mode + δ, H⁻¹) from the standard normal `noise`. Each draw is its own solve, started at
    the mode of the previous successful draw in `order` (the draw indices within a chain, the
    same for every chain or one list per chain; by default in sequence); a failed solve
    restarts the next from the model's initial point. With `run`, each chain's visits are cut
    into runs of at most `run` draws, each started at the initial point; with ``threads > 1``
    the runs are walked by that many threads (the numba kernels release the GIL), and `solve`
    must then be safe to call from several threads at once. Returns per chain the list of
    outputs, then success, each stacked over draws."""
    node = _laplace_node(marginal_model)
    x0 = np.asarray(_initial_mode(node))
    n_chains, n_draws = draws[0].shape[:2]
    eps = [rng.standard_normal((n_draws, x0.size)).astype(x0.dtype) for _ in range(n_chains)]
    results = [[None] * n_draws for _ in range(n_chains)]
    runs = []
    for c in range(n_chains):
        visits = order if order is None or np.ndim(order[0]) == 0 else order[c]
        visits = list(range(n_draws) if visits is None else visits)
        size = run or max(len(visits), 1)
        runs += [(c, visits[k : k + size]) for k in range(0, len(visits), size)]

    def walk(c, visits):
        start = x0
        for i in visits:
            point = [d[c, i] for d in draws]
            outputs, mode, success = solve(i, point, start, eps[c][i])
            success = bool(np.all(success))
            results[c][i] = [*outputs, success]
            start = mode if success else x0
            progress.advance()

    threads = min(threads, len(runs))
    with (
        Progress(progressbar, "recovering latent draws", n_chains * n_draws) as progress,
        ThreadPoolExecutor(threads) if threads > 1 else nullcontext() as pool,
    ):
        if pool is None:
            for r in runs:
                walk(*r)
        else:
            for f in as_completed([pool.submit(walk, *r) for r in runs]):
                f.result()
    return [[np.stack([r[k] for r in res]) for k in range(len(res[0]))] for res in results]


def _initial_mode(node):
    """The inner solve's own starting point (the model's initial point of the latent)."""
    owner = node.inputs[1].owner
    x0 = owner.inputs[0] if owner is not None else None
    if isinstance(x0, Constant):
        return x0.data
    return np.zeros(static_size(node.inputs[1]), dtype=node.inputs[1].dtype)


def _store_recovered(marginal_model, posterior, per_chain):
    """Add the recovered variables and ``"<latent>_solved"`` to `posterior` (in place)."""
    op = _laplace_node(marginal_model).op
    n_draws = per_chain[0][-1].shape[0]
    import xarray as xr

    for i, (name, dims) in enumerate(zip(op.output_names, op.dims, strict=True)):
        draws = np.stack([out[i] for out in per_chain])
        dims = list(dims or [])
        dim_names = [
            "chain",
            "draw",
            *(dims or [f"{name}_dim_{k}" for k in range(draws.ndim - 2)]),
        ]
        coords = {
            k: np.asarray(marginal_model.coords[k])
            for k in dims
            if marginal_model.coords.get(k) is not None
        }
        posterior[name] = xr.DataArray(draws, dims=dim_names, coords=coords)
    solved = np.stack([np.broadcast_to(out[-1], (n_draws,)) for out in per_chain])
    posterior[f"{'_'.join(op.latent_names)}_solved"] = xr.DataArray(solved, dims=["chain", "draw"])


class LaplaceInfo(NamedTuple):
    """What :func:`marginalize_laplace` built, read off a marginal model's graph.

    Attributes
    ----------
    names : the marginalized latents.
    deterministics : the Deterministics of the latent that :func:`recover_latent` computes.
    structure : the layout of H (`LinearStructure`), chosen or detected.
    mode : x*(θ), flat and unconstrained, a graph of the model's variables.
    hessian : H(θ) at the mode, in the structure's compact form.
    success : whether the inner solve converged.
    """

    names: list[str]
    deterministics: list[str]
    structure: LinearStructure
    mode: TensorVariable
    hessian: TensorVariable
    success: TensorVariable


def laplace_info(marginal_model: pm.Model) -> LaplaceInfo:
    """The Laplace marginal's latent names, Hessian structure, mode, Hessian and success flag.

    Read from the graph of the model's ``laplace_marginal`` potential, so it survives model
    transformations such as ``pm.model.fgraph.clone_model``.

    Raises
    ------
    TypeError
        If `marginal_model` was not made by :func:`marginalize_laplace`.

    Examples
    --------
    >>> import numpy as np, pymc as pm
    >>> import pymc_optim as pmo
    >>> with pm.Model() as model:
    ...     mu = pm.Normal("mu", 0.0, 1.0)
    ...     u = pm.Normal("u", mu, 1.0, shape=3)
    ...     y = pm.Normal("y", u, 1.0, observed=np.array([0.5, -1.0, 2.0]))
    >>> info = pmo.laplace_info(pmo.marginalize_laplace(model, "u"))
    >>> info.names, info.structure.kind
    (['u'], 'diagonal')
    """
    _check_model(marginal_model, "marginal_model", "laplace_info")
    node = _laplace_node(marginal_model)
    op = node.op
    _, mode, hessian, success, *_ = node.inputs
    n = len(op.latent_names)
    return LaplaceInfo(
        list(op.latent_names), list(op.output_names[n:]), op.structure, mode, hessian, success
    )


class LaplaceMarginal(Op):
    """The Laplace marginal's value (its first input, passed through), marked in the model's
    graph with what :func:`recover_latent` needs.

    `observed_names` are the observed variables integrated out with the latents (for the
    error of ``pm.sample_posterior_predictive`` in the marginal model, see
    :func:`_guard_posterior_predictive`).

    Inputs are ``[marginal, mode, hessian, success, *params]``; the inner graph
    ``recovery_inputs = [z, *placeholders] → recovery_outputs`` maps a flat unconstrained latent
    draw z and the model variables `params` to the latent variables and their Deterministics.
    Carried as a node of the potential's graph, this survives what copies a model's graph
    (``clone_model``, ``do``, ``observe``), where an attribute of the model would not. The
    marker is removed when the graph is compiled (a canonicalization rewrite), so it costs the
    sampler nothing; its gradient is the identity on the marginal.
    """

    view_map = {0: [0]}

    def __init__(
        self,
        *,
        latent_names,
        output_names,
        dims,
        structure,
        recovery_inputs,
        recovery_outputs,
        observed_names=(),
        constraint=None,
    ):
        self.latent_names = tuple(latent_names)
        self.observed_names = tuple(observed_names)  # integrated out with the latents
        self.output_names = tuple(output_names)
        self.dims = tuple(None if d is None else tuple(d) for d in dims)
        self.structure = structure
        self.recovery_inputs = list(recovery_inputs)
        self.recovery_outputs = list(recovery_outputs)
        #: the (k, d) matrix A of the kriging constraint A z = 0 on the flat latent, or None
        self.constraint = constraint

    def make_node(self, marginal, mode, hessian, success, *params):
        inputs = [pt.as_tensor_variable(v) for v in (marginal, mode, hessian, success)]
        inputs += list(params)
        return Apply(self, inputs, [inputs[0].type()])

    def perform(self, node, inputs, output_storage):
        output_storage[0][0] = inputs[0]

    def infer_shape(self, node, shapes):
        return [shapes[0]]

    def pullback(self, inputs, outputs, output_grads):
        return [output_grads[0], *(disconnected_type() for _ in inputs[1:])]

    def connection_pattern(self, node):
        return [[True], *([False] for _ in node.inputs[1:])]

    def __str__(self):
        return f"LaplaceMarginal{{{', '.join(self.latent_names)}}}"


@register_canonicalize
@node_rewriter([LaplaceMarginal])
def remove_laplace_marker(fgraph, node):
    """The compiled log density needs only the marginal's value."""
    return [node.inputs[0]]


def _laplace_node(model: pm.Model):
    for var in model.potentials:
        node = var.owner
        if node is not None and isinstance(node.op, LaplaceMarginal):
            return node
    raise TypeError(
        "`marginal_model` must be a model returned by `pmo.marginalize_laplace` (or a copy of "
        "one, e.g. by `pm.model.fgraph.clone_model`): no potential of the model holds a Laplace "
        f"marginal; its potentials are {[p.name for p in model.potentials]}. If the model was "
        "rebuilt by a transformation that drops potentials, call `pmo.marginalize_laplace` on "
        "the transformed original model instead."
    )


def _check_model(model, argument: str, function: str) -> None:
    if not isinstance(model, pm.Model):
        raise TypeError(
            f"`{argument}` of `{function}` must be a `pm.Model`; got {model!r}. Pass the model "
            "itself (e.g. `with pm.Model() as model: ...`, then `model`); it is not taken from "
            "the model context."
        )


def _check_flag(value, argument: str, what_false_does: str) -> None:
    if not isinstance(value, bool | np.bool_):
        raise TypeError(
            f"`{argument}` must be True or False; got {value!r}. Pass `{argument}=False` to "
            f"{what_false_does}."
        )


def _check_mode(mode) -> None:
    """`recover_latent`'s `mode` names a PyTensor compile mode (or is one)."""
    if mode is None:
        return
    from pytensor.compile.mode import get_mode

    try:
        get_mode(mode)
    except (ValueError, TypeError) as error:
        raise ValueError(
            f"`mode` must be a PyTensor compile mode, e.g. 'NUMBA', 'JAX' or None (the default "
            f"C backend); got {mode!r} ({error})."
        ) from None


def _check_draw_shape(rv, shape, n_chains: int, n_draws: int) -> None:
    expected = rv.type.shape
    got = tuple(shape)[2:]
    if len(got) != len(expected) or any(
        e is not None and e != g for e, g in zip(expected, got, strict=True)
    ):
        expected_text = tuple("?" if e is None else e for e in expected)
        raise ValueError(
            f"`idata.posterior[{rv.name!r}]` must have shape (chain, draw, *{expected_text}) "
            f"(`{rv.name}` in the model has shape {expected_text}); got {tuple(shape)}. Pass the "
            "posterior of this marginal model (from `pm.sample` on it)."
        )


def _inline_latent_deterministics(fgraph, latent_fg):
    """Remove the Deterministics that depend on a latent from `fgraph`, writing their
    expressions in their place (an observed variable may depend on one); return their
    ``(name, expression)`` in topological order, for recover_latent."""
    latent_set = set(latent_fg)
    out = []
    for node in fgraph.toposort():
        if not isinstance(node.op, ModelDeterministic):
            continue
        var, expression = node.outputs[0], node.inputs[0]
        if not latent_set & set(ancestors([expression], blockers=list(latent_set))):
            continue
        index = fgraph.outputs.index(var)
        fgraph.replace(var, expression, import_missing=True)
        fgraph.remove_output(index)
        out.append((var.name, expression))
    return out


def _check_latents(model: pm.Model, latent) -> list[TensorVariable]:
    items = list(latent) if isinstance(latent, list | tuple) else [latent]
    if not items:
        raise ValueError("`latent` must name at least one variable.")
    out = []
    for item in items:
        name = item if isinstance(item, str) else getattr(item, "name", None)
        if name not in model.named_vars:
            raise ValueError(
                f"`latent` {item!r} is not a variable of the model; free variables: "
                f"{[rv.name for rv in model.free_RVs]}.{_gp_marginal_hint(model)}"
            )
        rv = model[name]
        if _imputed_name(model.named_vars, name) is not None:
            raise _missing_values_error(name)
        if rv in model.observed_RVs:
            raise ValueError(
                f"`latent` {name!r} is observed; only free variables can be marginalized."
                f"{_gp_marginal_hint(model)}"
            )
        if rv not in model.free_RVs:
            raise ValueError(f"`latent` {name!r} is not a free random variable of the model.")
        if not rv.type.dtype.startswith("float"):
            raise ValueError(
                f"`latent` {name!r} is discrete ({rv.type.dtype}); the Laplace approximation "
                "needs a continuous latent."
            )
        if rv in out:
            raise ValueError(f"`latent` lists {name!r} twice ({items!r}); name each variable once.")
        _check_static_size(model, rv)
        if not _is_gaussian(rv, model):
            warnings.warn(
                f"The prior of `{name}` ({type(rv.owner.op).__name__}) is not Gaussian: the "
                "Laplace approximation may be poor. Check it against full NUTS.",
                PymcOptimWarning,
                stacklevel=3,
            )
        out.append(rv)
    return out


def _gp_marginal_hint(model: pm.Model) -> str:
    """What to do instead, for a model whose GP is already integrated out (an observed
    MvNormal, as `pm.gp.Marginal.marginal_likelihood` writes it)."""
    if not any(type(rv.owner.op).__name__ == "MvNormalRV" for rv in model.observed_RVs):
        return ""
    return (
        " An observed MvNormal (`pm.gp.Marginal`'s `marginal_likelihood`) is a Gaussian process "
        "integrated out exactly already: sample the model as it is. For a non-Gaussian "
        "likelihood, write the GP with `pm.gp.Latent` or `pm.gp.HSGP` and pass the name given "
        "to its `prior` (e.g. `pmo.marginalize_laplace(model, 'f')`)."
    )


def _is_gaussian(rv, model: pm.Model) -> bool:
    """Whether the prior of `rv` is Gaussian given its parameters: a Gaussian distribution, or a
    random walk / AR whose component distributions (init and innovations, the unregistered
    ``.dist`` inputs) are; the model's own variables among its inputs are parameters (an
    innovation scale ``sigma ~ HalfNormal``), not components."""
    kind = type(rv.owner.op).__name__
    if kind in _GAUSSIAN_PRIORS:
        return True
    if kind in _GAUSSIAN_IF_COMPONENTS_ARE:
        parameters = set(model.basic_RVs)
        components = [
            i
            for i in rv.owner.inputs
            if i.owner is not None and hasattr(i.owner.op, "ndim_supp") and i not in parameters
        ]
        return all(type(c.owner.op).__name__ in _GAUSSIAN_PRIORS for c in components)
    return False


def _check_static_size(model: pm.Model, rv) -> None:
    """A latent's size is fixed when the marginal is built (the inner solve's x0 has it): refuse
    one whose size follows a pm.Data container, which `pm.set_data` may resize. (A dim's length
    is a shared variable too, but resizing a dim is a model change, not new data.)"""
    if None not in rv.type.shape:
        return
    containers = set(model.data_vars)
    # the size input, and containers of one or more dimensions among the parameters (a 0-d one,
    # such as a hyperparameter fixed by pm.do, cannot change the shape)
    size, params = rv.owner.inputs[1], rv.owner.inputs[2:]
    data = [v.name for v in ancestors([size]) if v in containers]
    data += [v.name for v in ancestors(params) if v in containers and v.type.ndim > 0]
    if data:
        size = np.shape(model.initial_point()[model.rvs_to_values[rv].name])
        raise NotImplementedError(
            f"`latent` {rv.name!r} has a shape that depends on the data {sorted(set(data))} "
            f"(now {size}): the marginal fixes the latent's size when it is built, so changing "
            "the data afterwards (`pm.set_data`) would be wrong. Give the latent a fixed shape "
            f"(`shape={size}`, or `dims`) before marginalizing it."
        )


def _latent_size(model: pm.Model, latent_rvs, start: dict) -> int:
    """The number of unconstrained latent values (`start`: the model's initial point)."""
    return sum(int(np.size(start[model.rvs_to_values[rv].name])) for rv in latent_rvs)


def _refuse_what_will_not_fit(structure: LinearStructure, d: int) -> None:
    """A MemoryError, before anything is allocated, when the marginal's (d, d) matrices would
    not fit in the memory this process has left (a dense or latent-Gaussian H; a sparse,
    diagonal or block-diagonal one grows linearly in d)."""
    if structure.kind not in ("dense", "latent_gaussian"):
        return
    need = _DENSE_COPIES * 8 * d * d
    available = available_memory()
    if available is None or need <= available:
        return
    gib = 2.0**30
    raise MemoryError(
        f"`marginalize_laplace`: the latent has {d:,} values and its Hessian is dense "
        f"({structure.kind!r} structure). Compiling and evaluating the marginal holds about "
        f"{_DENSE_COPIES} float64 matrices of {d:,} × {d:,} at once ({need / gib:.1f} GiB), "
        f"more than the {available / gib:.1f} GiB of memory available to this process, so "
        "nothing was built. For a Gaussian Markov random field (ICAR, BYM2, random walks, a "
        "sparse precision) write the latent with `pymc_optim.distributions` (ICAR, GMRF, RW; "
        "extra `sparse`) and pass `hessian_structure='sparse'`; otherwise marginalize fewer "
        "values, or run where more memory is free (each sampling process needs its own)."
    )


def _check_kriged_structure(requested, latent_rvs, blocks) -> None:
    """A constrained latent is kriged on a dense or sparse H (module constraints)."""
    kind = requested if isinstance(requested, str) else requested.kind
    if kind not in ("auto", "dense", "sparse"):
        names = [rv.name for rv, block in zip(latent_rvs, blocks, strict=True) if block is not None]
        raise ValueError(
            f"`hessian_structure` must be 'auto', 'dense' or 'sparse' when a latent carries a "
            f"linear constraint ({names}: a sum-to-zero intrinsic field, integrated over "
            f"{{A x = 0}} by kriging, whose prior couples its values); got {kind!r}. Pass "
            "`hessian_structure='auto'`."
        )


def _stacked_constraint(blocks, sizes) -> np.ndarray:
    """The (k, d) constraint on the flat latent: each latent's A at its offset."""
    rows, offset = [], 0
    for block, size in zip(blocks, sizes, strict=True):
        if block is not None:
            padded = np.zeros((block.shape[0], sum(sizes)))
            padded[:, offset : offset + size] = block
            rows.append(padded)
        offset += size
    return np.vstack(rows)


def _kriged_structure(requested, objective, z, d: int) -> LinearStructure:
    """H's layout for a kriged latent, read off the objective in the N coordinates."""
    kind = requested if isinstance(requested, str) else requested.kind
    if kind == "dense":
        return LinearStructure("dense")
    if kind == "sparse" and isinstance(requested, SparseStructure):
        return requested
    found = detect.sparse_hessian_structure(
        objective, [z], [d], required=kind == "sparse", argument="hessian_structure"
    )
    return LinearStructure("dense") if found is None else found


def _detect_hessian_structure(
    model: pm.Model,
    latent_rvs,
    start: dict,
    structure="auto",
    seed: int = 20261130,
    numeric: bool = True,
) -> LinearStructure | None:
    """The layout of −∇²ℓ in the flat unconstrained latent: detected for ``"auto"``, else the
    explicit `structure` verified (a ValueError if it drops nonzero entries).

    The shared detection of :mod:`pymc_optim.linalg.detect`: the graph's structural reading
    first (no compilation); where it proves nothing, the numerical pattern at random points of
    the model (each variable jittered uniformly in (−1, 1) around its initial value in the
    unconstrained space: a structure can depend on the hyperparameters too). With
    ``numeric=False`` and ``"auto"``, None where the graph's readings prove nothing.
    """
    values = [model.rvs_to_values[rv] for rv in latent_rvs]
    shapes = [np.shape(start[v.name]) for v in values]
    d = sum(int(np.prod(shape, dtype=int)) for shape in shapes)
    z = pt.vector("z", dtype=values[0].dtype, shape=(d,))
    logp = graph_replace(
        model.logp(jacobian=True), dict(zip(values, _split(z, shapes), strict=True)), strict=False
    )
    if structure == detect.SPARSE:
        return detect.sparse_hessian_structure(
            logp, [z], [d], required=True, argument="hessian_structure"
        )
    proved = detect.hessian_structure(logp, [z])
    if structure == "auto" and proved.kind in ("diagonal", "block_diagonal"):
        return proved  # proved from the graph: no numerical pattern needed
    if structure == "auto":
        found = detect.sparse_hessian_structure(logp, [z], [d])
        if found is not None:
            return found
        if not numeric:
            return None

    def pattern():
        if d > detect.NUMERIC_MAX_SIZE:
            return None
        gradient = grad(logp, z)
        direction = z.type("direction")
        directions = pt.matrix("directions", dtype=z.dtype)
        hvp = vectorize_graph(grad((gradient * direction).sum(), z), {direction: directions})
        others = [v for v in model.value_vars if v not in values]
        fn = pytensor.function([z, *others, directions], hvp, on_unused_input="ignore")
        rng = np.random.default_rng(seed)

        def points():
            for _ in range(8):  # two finite points, with a few retries at jitters that fail
                point = {
                    name: value + rng.uniform(-1, 1, np.shape(value)).astype(value.dtype)
                    if np.issubdtype(np.asarray(value).dtype, np.floating)
                    else value
                    for name, value in start.items()
                }
                flat = np.concatenate([np.ravel(point[v.name]) for v in values]).astype(z.dtype)
                yield flat, [point[v.name] for v in others]

        calls = 2 * -(-d // detect.PROBE_CHUNK)  # at two points, when both are finite
        with Progress(
            calls >= _PROBE_PROGRESS_CALLS,
            f"hessian_structure='auto': reading the {d} × {d} Hessian's pattern",
            calls,
        ) as progress:
            return detect.numeric_pattern(
                lambda point, rows: fn(point[0], *point[1], rows.astype(z.dtype)),
                d,
                points(),
                on_chunk=progress.advance,
            )

    if structure != "auto":
        detect.verify_structure(
            structure,
            proved,
            pattern,
            argument="hessian_structure",
            what="the Hessian of the log density in the latent",
        )
        return structure
    if d > detect.NUMERIC_MAX_SIZE:
        warnings.warn(
            f"`hessian_structure='auto'`: the latent has {d} elements, more than "
            f"{detect.NUMERIC_MAX_SIZE}, and the graph alone does not prove a diagonal Hessian; "
            "using 'dense'. Pass `hessian_structure` explicitly.",
            PymcOptimWarning,
            stacklevel=3,
        )
        return LinearStructure("dense")
    found = pattern()
    return LinearStructure("dense") if found is None else detect.structure_of_pattern(found)


def _observed_dependents(fgraph, latent_fg, latent_rvs):
    dependents = []
    latent_set = set(latent_fg)
    for node in fgraph.toposort():
        if not isinstance(node.op, ModelVar):
            continue
        var = node.outputs[0]
        if var in latent_set:
            continue
        depends = bool(latent_set & set(ancestors([node.inputs[0]], blockers=list(latent_set))))
        if not depends:
            continue
        if isinstance(node.op, ModelObservedRV):
            dependents.append(var)
        elif _imputed_name({out.name for out in fgraph.outputs}, var.name) is not None:
            raise _missing_values_error(var.name)
        else:
            raise NotImplementedError(
                f"`{var.name}` ({type(node.op).__name__}) depends on a marginalized latent; only "
                "observed variables and Deterministics may depend on it. Marginalize it too or "
                "drop it."
            )
    for rv, rv_fg in zip(latent_rvs, latent_fg, strict=True):
        if not any(rv_fg in ancestors([d.owner.inputs[0]]) for d in dependents):
            raise ValueError(
                f"`latent` {rv.name!r}: no observed variable depends on it, so there is nothing "
                "to marginalize against."
            )
    return dependents


def _imputed_name(names, name: str | None) -> str | None:
    """The observed variable whose missing values the free variable `name` holds (PyMC splits an
    observed `y` with NaNs into an observed `y_observed` and a free `y_unobserved`), else None;
    `names` are the model's variable names."""
    if not (name or "").endswith("_unobserved"):
        return None
    base = name[: -len("_unobserved")]
    return base if f"{base}_observed" in names else None


def _missing_values_error(imputed: str) -> NotImplementedError:
    observed = imputed[: -len("_unobserved")]
    return NotImplementedError(
        f"`{observed}` has missing values: PyMC imputes them as the free variable `{imputed}`, "
        "which depends on the marginalized latent, and a Laplace marginal needs everything that "
        f"depends on the latent observed. Drop the missing entries of `{observed}` (and the "
        "matching rows of its indices or covariates) before marginalizing, then predict them "
        "from the recovered latent (e.g. pm.sample_posterior_predictive on a model over all rows)."
    )


def _logp(rv, value):
    """``pm.logp(rv, value)`` where `rv`'s inputs may be model variables of the fgraph.

    Deriving some log densities (e.g. GaussianRandomWalk's) clones the graph above the variable,
    which would duplicate the model's variables; the density is derived on stand-ins for them
    and written back on them.
    """
    # only the outermost model variables: standing in for one inside another (a Deterministic's
    # input) would cut the graph between them
    model_vars = [
        v
        for v in ancestors([rv, value], blockers=None)
        if v.owner is not None and isinstance(v.owner.op, ModelVar)
    ]
    inner = set(ancestors([i for v in model_vars for i in v.owner.inputs]))
    model_vars = [v for v in model_vars if v not in inner]
    standins = {v: v.type() for v in model_vars}
    derived = pm.logp(*graph_replace([rv, value], standins, strict=False))
    return graph_replace(derived, {s: v for v, s in standins.items()}, strict=False)


def _split(flat, shapes):
    """Consecutive pieces of the vector `flat`, reshaped to `shapes`."""
    return Packer.from_shapes(shapes, flat.dtype).unpack(flat)


def _laplace_marker(model: pm.Model):
    """The LaplaceMarginal Op of `model`'s potentials, or None."""
    for var in model.potentials:
        if var.owner is not None and isinstance(var.owner.op, LaplaceMarginal):
            return var.owner.op
    return None


def _check_posterior_predictive(model: pm.Model, var_names) -> None:
    """Refuse ``pm.sample_posterior_predictive`` in a Laplace marginal model where PyMC would
    silently leave out the observed variables (they were integrated out with the latent)."""
    op = _laplace_marker(model)
    if op is None:
        return
    removed = [*op.observed_names, *op.output_names]  # observed, latents, their Deterministics
    if var_names is not None:
        asked = [var_names] if isinstance(var_names, str) else list(var_names)
        gone = [name for name in asked if name in removed or name not in model.named_vars]
        if not gone:
            return  # variables of the marginal model: PyMC predicts them
        what = f"`var_names` {gone} are not variables of the marginal model"
    else:
        what = (
            "with `var_names=None` PyMC predicts the model's observed variables, and the "
            f"observed variables {list(op.observed_names)} were integrated out with the latent "
            f"{list(op.latent_names)}: it would silently return no draws of them"
        )
    raise NotImplementedError(
        "`pm.sample_posterior_predictive` in a model returned by `pmo.marginalize_laplace`: "
        f"{what}. Predict in the original model from recovered latent draws:\n\n"
        "    idata = pmo.recover_latent(marginal_model, idata)\n"
        "    with model:  # the model given to pmo.marginalize_laplace\n"
        "        pm.sample_posterior_predictive(idata, extend_inferencedata=True)\n\n"
        "and compare models the same way: `az.loo(pm.compute_log_likelihood(idata, "
        "model=model))`. To predict variables of the marginal model only, name them in "
        "`var_names`."
    )


def _guard_posterior_predictive() -> None:
    """Make ``pm.sample_posterior_predictive`` raise the recipe in a Laplace marginal model.

    PyMC 6.4's ``sample_posterior_predictive`` picks ``model.observed_RVs`` (and the
    Deterministics depending on them) when `var_names` and `sample_vars` are None, and returns
    an empty result, touching no variable, when there are none. Every model attribute it reads
    before that is read by ``pm.sample`` too, and a stand-in observed variable in the marginal
    model would enter ``observed_data``, the log likelihood (``az.loo`` would run on it) and prior
    predictive draws. So the check is a wrapper of the function, which calls PyMC's unchanged
    for every other model, installed once where PyMC exposes it (``pm``, ``pymc.sampling``,
    ``pymc.sampling.forward``).
    """
    import functools
    import inspect
    import sys

    import pymc.sampling.forward as forward

    original = forward.sample_posterior_predictive
    if getattr(original, "_pymc_optim_laplace_guard", False):
        return
    signature = inspect.signature(original)

    @functools.wraps(original)
    def sample_posterior_predictive(*args, **kwargs):
        bound = signature.bind(*args, **kwargs)
        model = pm.modelcontext(bound.arguments.get("model"))
        # var_names defaults to sample_vars when that is given
        var_names = bound.arguments.get("var_names")
        if var_names is None:
            var_names = bound.arguments.get("sample_vars")
        _check_posterior_predictive(model, var_names)
        return original(*args, **kwargs)

    sample_posterior_predictive._pymc_optim_laplace_guard = True
    for name in ("pymc.sampling.forward", "pymc.sampling", "pymc"):
        module = sys.modules.get(name)
        if getattr(module, "sample_posterior_predictive", None) is original:
            module.sample_posterior_predictive = sample_posterior_predictive


_guard_posterior_predictive()
