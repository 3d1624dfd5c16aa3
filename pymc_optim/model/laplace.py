"""Laplace marginalization of latent fields in a pm.Model (INLA style), and latent recovery."""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence

import numpy as np
import pymc as pm
import pytensor.tensor as pt
from pymc.model.fgraph import ModelPotential, model_from_fgraph
from pytensor.gradient import grad
from pytensor.graph.replace import clone_replace, graph_replace
from pytensor.tensor.variable import TensorVariable

from pymc_optim.backends.newton import NewtonOp
from pymc_optim.implicit import OptimalityCondition
from pymc_optim.linalg.latent_gaussian import LatentGaussianStructure
from pymc_optim.linalg.structure import as_linear_structure
from pymc_optim.model._fgraph import graphs_at_mode, outer_inputs, replace_variables
from pymc_optim.model._idata import require_group
from pymc_optim.model.constraints import (
    constrained_logdet,
    constrained_mode,
    constraint_matrix,
    kkt_mode,
)
from pymc_optim.model.failure import apply_failure_policy, check_on_failure
from pymc_optim.model.laplace_checks import (
    check_draw_shape,
    check_flag,
    check_latents,
    check_mode,
    check_model,
)
from pymc_optim.model.laplace_joint import joint_log_density
from pymc_optim.model.laplace_marker import (
    LaplaceInfo,
    LaplaceMarginal,  # noqa: F401  (imported from here)
    laplace_info,
    laplace_node,
    remove_laplace_marker,  # noqa: F401  (imported from here)
)
from pymc_optim.model.laplace_recovery import (
    initial_mode,
    nearest_neighbour_order,
    outputs_mode_success,
    recover_draws,
    recovery_function,
    store_recovered,
)
from pymc_optim.model.laplace_structure import (
    AUTO_STRUCTURE_MAX_SIZE,  # noqa: F401  (imported from here)
    check_kriged_structure,
    choose_hessian_structure,
    graph_width,
    kriged_structure,
    refuse_what_will_not_fit,
)
from pymc_optim.model.latent_gaussian import latent_gaussian_mode, resolve_gp_latents
from pymc_optim.problems.minimize import minimize

__all__ = ["LaplaceInfo", "laplace_info", "marginalize_laplace", "recover_latent"]

# the recovery's helpers under the names code imports from this module
_initial_mode = initial_mode
_laplace_node = laplace_node
_outputs_mode_success = outputs_mode_success
_recovery_function = recovery_function
# `recover_latent` calls the walk over the draws and the tour of a chain by these names, read
# from this module when it runs (so that they can be replaced here)
_recover = recover_draws
_nearest_neighbour_order = nearest_neighbour_order

#: `recover_latent` walks each chain's tour in runs of at most this many draws, each from the
#: model's initial point (one cold solve per run: ~1 % of a run at N = 10⁴), so that the runs
#: can go to different threads while the draws do not depend on how many there are.
RUN_DRAWS = 250


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
        ``pm.sample_posterior_predictive`` in it returns no draws of them (and a ``KeyError``
        for their names), and :func:`~pymc_optim.sample_posterior_predictive` raises a
        ``NotImplementedError`` showing the recipe (unless `var_names` names variables it has);
        predict and compute pointwise log likelihoods in the original model after
        :func:`recover_latent` (see its Notes).

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
    A term that sees the latent only through a few sums of it (the soft sum-to-zero penalty of
    ``pm.ICAR`` and of ICAR with ``constraint="soft"``) adds a rank-k term to a sparse H: then
    H = S + Jᵀ C J (:class:`pymc_optim.linalg.low_rank.LowRankUpdateStructure`), solved through
    S's sparse factor with a Woodbury correction.

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
    check_model(model, "model", "marginalize_laplace")
    check_on_failure(on_failure)
    check_flag(warm_start, "warm_start", "start every inner solve from the initial point")
    model, latent = resolve_gp_latents(model, latent)  # a GP latent named by its Deterministic
    latent_rvs = check_latents(model, latent)
    initial_point = model.initial_point()  # once: each call compiles a function
    requested = as_linear_structure(hessian_structure, block_size, "hessian_structure")
    # latents whose transform is a linear constraint A x = 0 (a sum-to-zero ICAR or RW):
    # integrated over that subspace by kriging in their N coordinates (model/constraints.py)
    blocks = [constraint_matrix(model.rvs_to_transforms.get(rv)) for rv in latent_rvs]
    kriged = any(block is not None for block in blocks)
    if kriged:  # H's layout is read off ℓ in the N coordinates, below
        check_kriged_structure(requested, latent_rvs, blocks)
    else:
        structure = choose_hessian_structure(
            model, latent_rvs, initial_point, requested, method=method
        )

    density = joint_log_density(model, latent_rvs, blocks, initial_point)
    fgraph, z, x0, joint = density.fgraph, density.z, density.x0, density.joint
    constraint = density.constraint
    if kriged:
        structure = kriged_structure(requested, -joint, z, x0.size)
        refuse_what_will_not_fit(structure, x0.size, width=graph_width(joint, [z], x0.size))
        if method == "newton":  # one Newton loop on the KKT conditions in (z, λ)
            z_star, success = kkt_mode(-joint, z, x0, constraint, structure, optimizer_kwargs)
        else:
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
            -pt.add(*density.likelihood_terms),
            z,
            x0,
            density.latent_fg[0].owner.inputs[0],
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
        # the same solve by a warm-starting Op, in every graph built on it
        solve = z_star.owner
        warm = solve.op.replace(warm_start=True).make_node(*solve.inputs).outputs
        built = [z_star, success, hessian] + ([] if marginal is None else [marginal])
        z_star, success, hessian, *rest = graph_replace(
            built, dict(zip(solve.outputs, warm, strict=True)), strict=False
        )
        marginal = rest[0] if rest else None
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
    deterministics, dependents = density.deterministics, density.dependents
    recovery_outputs = [*density.constrained, *(expression for _, expression in deterministics)]
    recovery_names = [
        *(rv.name for rv in latent_rvs),
        *(name for name, _ in deterministics),
    ]
    # the observed variables leave the model: a Deterministic using one uses its data
    removed_observed = {obs: obs.owner.inputs[1] for obs in dependents}
    # (in two steps: graph_replace cannot replace a variable and one of its ancestors at once)
    recovery_outputs = replace_variables(
        replace_variables(recovery_outputs, removed_observed), density.to_constrained
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

    for obs in [*dependents, *density.latent_fg]:
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
    marginal is not vectorized over draws, whose stacked copy compiles far more slowly.

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
    with it, so ``pm.sample_posterior_predictive`` in the marginal model returns no draws of
    them; :func:`~pymc_optim.sample_posterior_predictive` raises a
    ``NotImplementedError`` that shows this recipe instead. Predict and compare models in the
    *original* model, on the recovered draws::

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
    check_model(marginal_model, "marginal_model", "recover_latent")
    check_flag(mean_correction, "mean_correction", "centre the draws at the mode")
    check_mode(mode)
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
    node = laplace_node(marginal_model)
    rng = np.random.default_rng(random_seed)
    posterior = idata.posterior
    rvs = list(marginal_model.free_RVs)
    missing = [rv.name for rv in rvs if rv.name not in posterior]
    if missing:
        raise ValueError(f"`idata.posterior` lacks the hyperparameters {missing}.")
    n_chains, n_draws = posterior.sizes["chain"], posterior.sizes["draw"]
    for rv in rvs:
        check_draw_shape(rv, posterior[rv.name].shape, n_chains, n_draws)

    compiled = recovery_function(marginal_model, node, mean_correction, compile_mode=mode)
    owner, local = threading.get_ident(), threading.local()

    def solve(draw, point, start, noise):
        fn = getattr(local, "fn", None)
        if fn is None:  # another thread: a copy with its own storage (no compilation)
            fn = local.fn = compiled if threading.get_ident() == owner else compiled.copy()
        return outputs_mode_success(fn(*point, start, noise))

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
    store_recovered(marginal_model, posterior, per_chain)
    return idata
