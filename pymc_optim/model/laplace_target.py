"""A Laplace marginal model as a numpy target over its hyperparameters θ, for integration."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np
import pymc as pm
import pytensor
import pytensor.tensor as pt
from pytensor.conditional.op import ifelse
from pytensor.gradient import grad
from pytensor.graph.replace import graph_replace, vectorize_graph
from pytensor.graph.traversal import ancestors

from pymc_optim._modes import PYTHON_MODE
from pymc_optim.model.laplace_marker import LaplaceMarginal
from pymc_optim.model.laplace_recovery import (
    initial_mode,
    main_axis_order,
    recover_draws,
    recovery_draw,
    store_recovered,
    warm_started,
)

__all__ = ["Evaluation", "LaplaceTarget"]


@dataclass
class LaplaceTarget:
    """log p(θ, y) of a model made by :func:`pymc_optim.marginalize_laplace`, as a numpy function
    of its flat hyperparameters θ, with the inner mode x*(θ), H(θ) and latent draws.

    θ is the marginal model's value variables (PyMC's unconstrained space), flattened and
    concatenated in the model's order; the log density includes the transforms'
    log-Jacobians. One compiled function serves every method: the marginal, its gradient (the
    implicit derivative of x*(θ), in a lazy branch taken only when asked for), the inner mode,
    H and success (part of the marginal's graph), and one latent draw of N(x*(θ) + δ, H⁻¹) from
    a given standard noise (a lazy branch too). Each inner solve starts at the mode of the
    last successful call, or at the model's initial point of the latent after a failed one;
    the mode it converges to does not depend on the start (to the solver's tolerance).

    Build it with :meth:`from_model`.

    Attributes
    ----------
    start : numpy.ndarray
        θ at the marginal model's initial point.
    labels : list of str
        One per entry of θ: the value variable's name, with ``[i,j]`` for an array's entries.
    constrained_names, constrained_shapes, constrained_labels : list
        The hyperparameters and the Deterministics of θ in the constrained space (what
        :meth:`constrained` returns), their shapes and one label per entry.
    n_evaluations : int
        Calls of the compiled function so far.
    progress : optional
        Advanced once per point by :meth:`log_density` (``progress.advance()``), or None.
    x0 : numpy.ndarray
        Where the next inner solve starts.
    """

    fn: object
    to_constrained: object
    marginal_model: pm.Model
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
    compiled: dict = field(default_factory=dict)

    @classmethod
    def from_model(cls, marginal_model: pm.Model, mean_correction: bool = True) -> LaplaceTarget:
        """The target of `marginal_model`, compiled once.

        Parameters
        ----------
        marginal_model : pm.Model
            Returned by :func:`pymc_optim.marginalize_laplace` (or a copy of one).
        mean_correction : bool, default True
            Centre the latent draws at the conditional mean to first order in the skewness of
            p(x | θ, y) rather than at the mode (as in :func:`pymc_optim.recover_latent`).

        Raises
        ------
        ValueError
            When the model has no free variable, or a discrete one.
        """
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
        # One compiled function serves every method: log p(θ, y), its gradient, the inner mode,
        # H and success (already part of the marginal's graph), and one latent draw of
        # N(x*(θ) + δ, H⁻¹) from a standard `noise`, with the inner solve started at `start`.
        # The draw's mean correction shares its reverse pass through H(x) with the marginal's
        # gradient.
        (marker,) = [
            v.owner
            for v in ancestors([logp])
            if v.owner is not None and isinstance(v.owner.op, LaplaceMarginal)
        ]
        start_var = marker.inputs[1].type("start")
        noise = marker.inputs[1].type("noise")
        _, solution, solution_hessian, _, *params = marker.inputs
        recovered = recovery_draw(
            marker, solution, solution_hessian, noise, params, mean_correction
        )
        logp, mode, hessian, success, *recovered = warm_started(
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
        # a handful of calls on large batches: numpy's perform, no C module to compile
        to_constrained = pytensor.function(
            [thetas], batched, on_unused_input="ignore", mode=PYTHON_MODE
        )
        names = [v.name for v in marginal_model.unobserved_value_vars if v.name in wanted]
        constrained = to_constrained(start[None])
        constrained_shapes = [np.shape(c)[1:] for c in constrained]
        return cls(
            fn=fn,
            to_constrained=to_constrained,
            marginal_model=marginal_model,
            value_names=[v.name for v in values],
            shapes=shapes,
            labels=_labels([v.name for v in values], shapes),
            constrained_labels=_labels(names, constrained_shapes),
            constrained_names=names,
            constrained_shapes=constrained_shapes,
            start=start,
            cold_start=initial_mode(marker),
            x0=initial_mode(marker),
        )

    @property
    def size(self) -> int:
        """The number of entries of θ."""
        return self.start.size

    def compiled_once(self, key, build):
        """`build()` the first time `key` is asked for, the same function after: helpers
        compiled from this target's graph (a function of θ and the latent) serve every fit
        that reuses the target."""
        if key not in self.compiled:
            self.compiled[key] = build()
        return self.compiled[key]

    def evaluate(self, theta, with_gradient: bool = True) -> Evaluation:
        """log p(θ, y), its gradient (zeros unless `with_gradient`), the inner mode x*(θ),
        H(θ) in its structure's compact form, and whether the inner solve converged."""
        return Evaluation(*self._call(theta, with_gradient, None)[:5])

    def value_and_grad(self, theta) -> tuple[float, np.ndarray]:
        """log p(θ, y) and its gradient."""
        log_density, gradient, *_ = self.evaluate(theta)
        return log_density, gradient

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

    def draw(self, theta, noise, start=None):
        """One draw of the latent at θ from the standard normal `noise` (one value per entry
        of the flat unconstrained latent), with the inner solve started at `start` (by default
        where the last call left it).

        Returns
        -------
        outputs : list of numpy.ndarray
            The latent variables and their Deterministics at the draw, in the order of the
            marker's ``output_names``.
        mode : numpy.ndarray
            x*(θ), flat and unconstrained.
        success : numpy.ndarray
            Whether the inner solve converged.
        """
        if start is not None:
            self.x0 = start
        _, _, mode, _, success, *outputs = self._call(theta, False, noise)
        return outputs, mode, success

    def recover(self, thetas: np.ndarray, posterior, rng, progressbar: bool = True) -> None:
        """Add one latent draw per row of `thetas` (one chain, in that order) to `posterior`,
        as :func:`pymc_optim.recover_latent` does, with ``"<latent>_solved"``.

        The draws are solved along the rows' main axis, each from the mode of the draw solved
        before it, so that each inner solve starts near its mode; each keeps its place (and
        its noise) in the posterior.
        """
        order = main_axis_order(thetas)

        def solve(draw, point, start, noise):
            return self.draw(thetas[draw], noise, start=start)

        per_chain = recover_draws(
            self.marginal_model, solve, [thetas[None]], rng, progressbar, order=order
        )
        store_recovered(self.marginal_model, posterior, per_chain)

    def constrained(self, points) -> list[np.ndarray]:
        """The values named by `constrained_names` at each row of `points` (rows first)."""
        return [np.asarray(c) for c in self.to_constrained(np.atleast_2d(points))]

    def _call(self, theta, with_gradient, noise):
        self.n_evaluations += 1
        with_draw = noise is not None
        outputs = self.fn(
            np.asarray(theta, dtype="float64"),
            self.x0,
            with_gradient,
            with_draw,
            self.cold_start if noise is None else noise,
        )
        log_density, gradient, mode, _, success = outputs[:5]
        self.x0 = mode if np.all(success) else self.cold_start
        return float(log_density), np.asarray(gradient), *outputs[2:]


class Evaluation(NamedTuple):
    """What :meth:`LaplaceTarget.evaluate` returns at θ."""

    log_density: float  # log p(θ, y), up to a constant
    gradient: np.ndarray  # its gradient in θ (zeros when not asked for)
    mode: np.ndarray  # x*(θ), flat and unconstrained
    hessian: np.ndarray  # H(θ) = −∇²ₓℓ at the mode, in its structure's compact form
    success: np.ndarray  # whether the inner solve converged


def _split(flat, shapes, dtypes):
    """Consecutive pieces of the vector `flat`, reshaped to `shapes` and cast to `dtypes`."""
    pieces, start = [], 0
    for shape, dtype in zip(shapes, dtypes, strict=True):
        size = int(np.prod(shape, dtype=int))
        pieces.append(flat[start : start + size].reshape(shape).astype(dtype))
        start += size
    return pieces


def _labels(names, shapes) -> list[str]:
    """One label per entry: the name, with ``[i,j]`` for the entries of an array."""
    labels = []
    for name, shape in zip(names, shapes, strict=True):
        if len(shape) == 0:
            labels.append(name)
        else:
            labels.extend(f"{name}[{','.join(map(str, index))}]" for index in np.ndindex(*shape))
    return labels
