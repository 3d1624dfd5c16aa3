"""Laplace marginalization of latent fields in a pm.Model (INLA style), and latent recovery."""

from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import pymc as pm
import pytensor
import pytensor.tensor as pt
from pymc.model.fgraph import (
    ModelObservedRV,
    ModelPotential,
    ModelVar,
    fgraph_from_model,
    model_from_fgraph,
)
from pytensor.gradient import grad
from pytensor.graph.replace import graph_replace, vectorize_graph
from pytensor.graph.traversal import ancestors
from pytensor.tensor.variable import TensorVariable

from pymc_optim._failure import apply_failure_policy, check_on_failure
from pymc_optim._implicit import OptimalityCondition
from pymc_optim._linear import LinearStructure, as_linear_structure, structure_from_pattern
from pymc_optim._warnings import PymcOptimWarning
from pymc_optim.minimize import minimize

__all__ = ["marginalize_laplace", "recover_latent"]

#: Largest latent size whose Hessian pattern "auto" computes (the pattern is a dense boolean
#: (d, d) array: 10⁸ bytes at this size). Larger latents need an explicit `hessian_structure`.
AUTO_STRUCTURE_MAX_SIZE = 10_000
#: Hessian-vector products per compiled call when probing the pattern (bounds the memory).
_PROBE_CHUNK = 128
#: Latent priors for which the Laplace approximation is exact given a Gaussian likelihood.
_GAUSSIAN_PRIORS = {"NormalRV", "MvNormalRV", "ZeroSumNormalRV", "AutoRegressiveRV", "RandomWalkRV"}
_GAUSSIAN_PRIORS |= {"GMRF", "ICAR"}  # pymc_optim.distributions.gmrf (CustomDist class names)


def marginalize_laplace(
    model: pm.Model,
    latent: str | TensorVariable | Sequence[str | TensorVariable],
    *,
    method: str = "newton",
    hessian_structure: str = "auto",
    block_size: int | None = None,
    on_failure: str = "reject",
    optimizer_kwargs: Mapping | None = None,
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
        Free, continuous random variables of `model` to integrate out.
    method : str, default "newton"
        The inner solver of :func:`pymc_optim.minimize` (``"newton"`` is graph-native).
    hessian_structure : {"auto", "dense", "diagonal", "block_diagonal"}, default "auto"
        Layout of H. ``"diagonal"`` when each latent element enters the density separately
        (independent random effects with an element-wise likelihood), ``"block_diagonal"`` for
        contiguous groups of `block_size` elements of the flattened latents (several effects
        per group), ``"dense"`` otherwise. ``"auto"`` reads the layout off the model (see
        Notes); the choice is kept in ``marginal_model._pmo_laplace.structure``. A wrong explicit
        choice gives a wrong marginal.
    block_size : int, optional
        For ``hessian_structure="block_diagonal"``.
    on_failure : {"reject", "raise", "warn"}, default "reject"
        What a failed inner solve does: ``"reject"`` makes the marginal −inf (NUTS rejects the
        point, which ``pm.sample`` counts as a divergence: ``idata.sample_stats.diverging``);
        ``"raise"`` raises an ``AssertionError`` at that evaluation; ``"warn"`` emits a
        :class:`~pymc_optim.PymcOptimWarning` and evaluates the marginal at the last iterate
        (for exploration, not final inference). :func:`recover_latent` records success per
        draw in ``"<latent>_solved"``.
    optimizer_kwargs : dict, optional
        Passed to :func:`pymc_optim.minimize`.

    Returns
    -------
    marginal_model : pm.Model
        Without the latent variables and the observed variables that depend on them; with the
        potential ``"laplace_marginal"``. Other variables, deterministics, coords carry over.

    Raises
    ------
    ValueError
        Unknown names, observed or discrete latents, latents no observed variable depends on,
        unknown `on_failure`.
    NotImplementedError
        When a free random variable (other than a listed latent) or a Deterministic depends on
        a latent.

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
    """
    check_on_failure(on_failure)
    latent_rvs = _check_latents(model, latent)
    if hessian_structure == "auto":
        if block_size is not None:
            raise ValueError("`block_size` is only used with `hessian_structure='block_diagonal'`.")
        structure = _detect_hessian_structure(model, latent_rvs)
    else:
        structure = as_linear_structure(hessian_structure, block_size, "hessian_structure")

    fgraph, memo = fgraph_from_model(model, inlined_views=True)
    latent_fg = [memo[rv] for rv in latent_rvs]
    dependents = _observed_dependents(fgraph, latent_fg, latent_rvs)

    # ℓ(z, θ) on one flat unconstrained control z holding every latent, so that the Hessian's
    # layout is one contiguous vector (and batching over draws stays native). The inner solve
    # starts at the model's initial point, which also fixes the latents' static shapes.
    initial_point = model.initial_point()
    starts = [
        np.asarray(initial_point[model.rvs_to_values[original].name]) for original in latent_rvs
    ]
    x0 = np.concatenate([start.ravel() for start in starts])
    z = pt.tensor(dtype=x0.dtype, shape=x0.shape, name="latent_unconstrained")
    pieces = _split(z, [start.shape for start in starts])
    constrained, log_jacobians = [], []
    for rv, piece in zip(latent_fg, pieces, strict=True):
        transform = rv.owner.op.transform
        if transform is None:
            constrained.append(piece)
            log_jacobians.append(pt.constant(0.0))
        else:
            inputs = rv.owner.inputs[0].owner.inputs
            constrained.append(transform.backward(piece, *inputs))
            log_jacobians.append(transform.log_jac_det(piece, *inputs).sum())
    to_constrained = dict(zip(latent_fg, constrained, strict=True))
    terms = []
    for rv, x, log_jac in zip(latent_fg, constrained, log_jacobians, strict=True):
        prior = graph_replace(rv.owner.inputs[0], to_constrained, strict=False)
        terms.append(_logp(prior, x).sum() + log_jac)
    for obs in dependents:
        obs_rv, data = obs.owner.inputs[0], obs.owner.inputs[1]
        terms.append(_logp(graph_replace(obs_rv, to_constrained, strict=False), data).sum())
    joint = pt.add(*terms)

    z_star, success = minimize(
        -joint,
        z,
        x0=x0,
        method=method,
        structure=structure,
        block_size=structure.block_size,
        optimizer_kwargs=optimizer_kwargs,
    )
    z_stars = _split(z_star, [start.shape for start in starts])
    condition = OptimalityCondition([z], [], [grad(-joint, z)], symmetric=True, structure=structure)
    at_mode = {z: z_star}
    hessian = graph_replace(condition.jacobian(), at_mode, strict=False)
    d = x0.size
    marginal = (
        graph_replace(joint, at_mode, strict=False)
        + 0.5 * d * np.log(2 * np.pi)
        - 0.5 * structure.logdet_positive_definite(hessian)
    )
    marginal = apply_failure_policy(
        marginal, success, on_failure, "the inner solve of the Laplace marginal did not converge"
    )

    for obs in [*dependents, *latent_fg]:
        fgraph.remove_output(fgraph.outputs.index(obs))
    potential = ModelPotential()(marginal)
    potential.name = "laplace_marginal"
    fgraph.add_output(potential)
    # Carried through model_from_fgraph (which swaps the ModelVar dummies for the new model's
    # variables) so that recover_latent finds the mode and Hessian in the new model's terms.
    prior_inputs = [list(rv.owner.inputs[0].owner.inputs) for rv in latent_fg]
    n_inputs = [len(inputs) for inputs in prior_inputs]
    carried = [*z_stars, hessian, success, *(i for inputs in prior_inputs for i in inputs)]
    for var in carried:
        fgraph.add_output(var)
    new_model = model_from_fgraph(fgraph, mutate_fgraph=True)
    # model_from_fgraph orders variables topologically; keep the user's order (it is the order
    # of value variables in compile_dlogp, find_MAP and the sampler's progress output).
    order = {rv.name: i for i, rv in enumerate(model.free_RVs)}
    new_model.free_RVs.sort(key=lambda rv: order[rv.name])
    new = fgraph.outputs[-len(carried) :]
    new_z_stars, (new_hessian, new_success) = (
        new[: len(z_stars)],
        new[len(z_stars) : len(z_stars) + 2],
    )
    flat_inputs = iter(new[len(z_stars) + 2 :])
    new_prior_inputs = [[next(flat_inputs) for _ in range(n)] for n in n_inputs]
    new_model._pmo_laplace = _LaplaceInfo(
        names=[rv.name for rv in latent_rvs],
        dims=[model.named_vars_to_dims.get(rv.name) for rv in latent_rvs],
        transforms=[rv.owner.op.transform for rv in latent_fg],
        prior_inputs=new_prior_inputs,
        modes=new_z_stars,
        hessian=new_hessian,
        success=new_success,
        structure=structure,
    )
    return new_model


def recover_latent(
    marginal_model: pm.Model,
    idata,
    *,
    random_seed=None,
    progressbar: bool = True,
):
    """Draw the latent field for every posterior draw of the hyperparameters.

    For each draw θ, one draw of the (unconstrained) latent from N(x*(θ), H(θ)⁻¹), mapped to
    the constrained space, added to ``idata.posterior`` under the latent's name and dims.

    Parameters
    ----------
    marginal_model : pm.Model
        A model returned by :func:`marginalize_laplace`.
    idata : arviz.InferenceData
        With a ``posterior`` group holding the hyperparameters.
    random_seed : int or numpy.random.Generator, optional
    progressbar : bool, default True
        Show progress over chains.

    Returns
    -------
    idata : arviz.InferenceData
        The same object, with the latent variables and ``"<latent>_solved"`` (whether the inner
        solve converged at that draw) added to its posterior.

    Raises
    ------
    TypeError
        If `marginal_model` was not made by :func:`marginalize_laplace`.
    """
    info = getattr(marginal_model, "_pmo_laplace", None)
    if info is None:
        raise TypeError(
            "`marginal_model` must be a model returned by `pmo.marginalize_laplace`; "
            f"got {marginal_model!r}."
        )
    rng = np.random.default_rng(random_seed)
    posterior = idata.posterior
    rvs = list(marginal_model.free_RVs)
    missing = [rv.name for rv in rvs if rv.name not in posterior]
    if missing:
        raise ValueError(f"`idata.posterior` lacks the hyperparameters {missing}.")

    # One draw as a graph of the hyperparameters' (constrained) values and standard noise ...
    mode = pt.concatenate([z.ravel() for z in info.modes])
    noise = mode.type("noise")
    draw = info.structure.sample_gaussian(mode, info.hessian, noise)
    latent_draws, start = [], 0
    for z_star, transform, inputs in zip(
        info.modes, info.transforms, info.prior_inputs, strict=True
    ):
        size = _static_size(z_star)
        z = draw[start : start + size].reshape(z_star.shape)
        start += size
        latent_draws.append(z if transform is None else transform.backward(z, *inputs))
    values = [rv.type(name=rv.name) for rv in rvs]
    outputs = graph_replace(
        [*latent_draws, info.success], dict(zip(rvs, values, strict=True)), strict=False
    )
    # ... vectorized over the draws of a chain (graph-native solvers batch natively).
    batched_values = [pt.tensor(dtype=v.dtype, shape=(None, *v.type.shape)) for v in values]
    batched_noise = pt.matrix("noise", dtype=noise.dtype)
    batched = vectorize_graph(
        outputs, dict(zip([*values, noise], [*batched_values, batched_noise], strict=True))
    )
    fn = pytensor.function([*batched_values, batched_noise], batched, on_unused_input="ignore")

    n_chains, n_draws = posterior.sizes["chain"], posterior.sizes["draw"]
    chains = range(n_chains)
    if progressbar:
        from rich.progress import track

        chains = track(chains, description="recovering latent draws")
    per_chain = []
    for c in chains:
        point = [np.asarray(posterior[rv.name].values[c], dtype=rv.type.dtype) for rv in rvs]
        eps = rng.standard_normal((n_draws, _static_size(mode))).astype(mode.dtype)
        per_chain.append(fn(*point, eps))

    import xarray as xr

    for i, (name, dims) in enumerate(zip(info.names, info.dims, strict=True)):
        draws = np.stack([out[i] for out in per_chain])
        dim_names = ["chain", "draw", *(dims or [f"{name}_dim_{k}" for k in range(draws.ndim - 2)])]
        coords = {
            k: np.asarray(marginal_model.coords[k])
            for k in (dims or [])
            if k in marginal_model.coords
        }
        posterior[name] = xr.DataArray(draws, dims=dim_names, coords=coords)
    solved = np.stack([np.broadcast_to(out[-1], (n_draws,)) for out in per_chain])
    posterior[f"{'_'.join(info.names)}_solved"] = xr.DataArray(solved, dims=["chain", "draw"])
    return idata


@dataclass
class _LaplaceInfo:
    names: list[str]
    dims: list
    transforms: list
    prior_inputs: list
    modes: list
    hessian: TensorVariable
    success: TensorVariable
    structure: LinearStructure


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
                f"{[rv.name for rv in model.free_RVs]}."
            )
        rv = model[name]
        if rv in model.observed_RVs:
            raise ValueError(
                f"`latent` {name!r} is observed; only free variables can be marginalized."
            )
        if rv not in model.free_RVs:
            raise ValueError(f"`latent` {name!r} is not a free random variable of the model.")
        if not rv.type.dtype.startswith("float"):
            raise ValueError(
                f"`latent` {name!r} is discrete ({rv.type.dtype}); the Laplace approximation "
                "needs a continuous latent."
            )
        if type(rv.owner.op).__name__ not in _GAUSSIAN_PRIORS:
            warnings.warn(
                f"The prior of `{name}` ({type(rv.owner.op).__name__}) is not Gaussian: the "
                "Laplace approximation may be poor. Check it against full NUTS.",
                PymcOptimWarning,
                stacklevel=3,
            )
        out.append(rv)
    return out


def _detect_hessian_structure(model: pm.Model, latent_rvs, seed: int = 20261130):
    """The layout of −∇²ℓ in the flat unconstrained latent, read off two random points."""
    values = [model.rvs_to_values[rv] for rv in latent_rvs]
    start = model.initial_point()
    shapes = [np.shape(start[v.name]) for v in values]
    d = sum(int(np.prod(shape, dtype=int)) for shape in shapes)
    if d > AUTO_STRUCTURE_MAX_SIZE:
        warnings.warn(
            f"`hessian_structure='auto'`: the latent has {d} elements, more than "
            f"{AUTO_STRUCTURE_MAX_SIZE}; using 'dense'. Pass `hessian_structure` explicitly.",
            PymcOptimWarning,
            stacklevel=3,
        )
        return LinearStructure("dense")
    z = pt.vector("z", dtype=values[0].dtype, shape=(d,))
    logp = graph_replace(
        model.logp(jacobian=True), dict(zip(values, _split(z, shapes), strict=True)), strict=False
    )
    gradient = grad(logp, z)
    direction = z.type("direction")
    directions = pt.matrix("directions", dtype=z.dtype)
    hvp = vectorize_graph(grad((gradient * direction).sum(), z), {direction: directions})
    others = [v for v in model.value_vars if v not in values]
    fn = pytensor.function([z, *others, directions], hvp, on_unused_input="ignore")

    rng = np.random.default_rng(seed)
    pattern, found = np.zeros((d, d), dtype=bool), 0
    for _ in range(8):  # two finite points, with a few retries at jitters that fail
        point = {
            name: value + rng.uniform(-1, 1, np.shape(value)).astype(value.dtype)
            if np.issubdtype(np.asarray(value).dtype, np.floating)
            else value
            for name, value in start.items()
        }
        flat = np.concatenate([np.ravel(point[v.name]) for v in values]).astype(z.dtype)
        rest = [point[v.name] for v in others]
        hessian = np.concatenate(
            [
                fn(flat, *rest, np.eye(d, dtype=z.dtype)[i : i + _PROBE_CHUNK])
                for i in range(0, d, _PROBE_CHUNK)
            ]
        )
        if not np.all(np.isfinite(hessian)):
            continue
        pattern |= hessian != 0
        found += 1
        if found == 2:
            return structure_from_pattern(pattern | pattern.T)
    return LinearStructure("dense")


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
        else:
            raise NotImplementedError(
                f"`{var.name}` ({type(node.op).__name__}) depends on a marginalized latent; only "
                "observed variables may depend on it. Marginalize it too or drop it."
            )
    for rv, rv_fg in zip(latent_rvs, latent_fg, strict=True):
        if not any(rv_fg in ancestors([d.owner.inputs[0]]) for d in dependents):
            raise ValueError(
                f"`latent` {rv.name!r}: no observed variable depends on it, so there is nothing "
                "to marginalize against."
            )
    return dependents


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
    pieces, start = [], 0
    for shape in shapes:
        size = int(np.prod(shape, dtype=int))
        pieces.append(flat[start : start + size].reshape(shape))
        start += size
    return pieces


def _static_shape(var) -> tuple[int, ...]:
    if None in var.type.shape:
        raise NotImplementedError(
            f"`{var.name}` needs a static shape to be marginalized (give it `shape=` or `dims=`)."
        )
    return var.type.shape


def _static_size(var) -> int:
    return int(np.prod(_static_shape(var), dtype=int))
