"""JAX backend: the graph-native loops as ``jax.lax.while_loop``; scipy-backed Ops refuse clearly.

Imported by the package only when JAX is installed; registers `jax_funcify` implementations so
that ``pytensor.function(..., mode="JAX")`` (and PyMC's numpyro/blackjax samplers) compile
graphs that contain solver Ops.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from pytensor.compile.mode import JAX
from pytensor.graph.fg import FunctionGraph
from pytensor.link.jax.dispatch import jax_funcify

from pymc_optim.backends.fixed_point import FixedPointOp
from pymc_optim.backends.iterations import (
    ANDERSON_MEMORY,
    ARMIJO,
    MAX_BACKTRACKS,
    ROUNDING,
    STEP_TOL,
)
from pymc_optim.backends.newton import NewtonOp
from pymc_optim.backends.packing import Packer
from pymc_optim.graph.solver_op import SolverOp
from pymc_optim.implicit import implicit_pullback
from pymc_optim.model.failure import WarnOnFailure

__all__: list[str] = []


@jax_funcify.register(SolverOp)
def _refuse_callback_solvers(op, node=None, **kwargs):
    raise NotImplementedError(
        f"{op} calls scipy from Python at every iteration and cannot run under the JAX backend. "
        "Use `method='newton'` (graph-native, runs in JAX) for minimize, root, minimize_scalar "
        "and root_scalar, or `method='newton'`/'iteration' for fixed_point."
    )


@jax_funcify.register(WarnOnFailure)
def _warn_on_failure(op, node=None, **kwargs):
    import warnings

    from pymc_optim._warnings import PymcOptimWarning

    def warn(success):
        if not bool(success):
            warnings.warn(f"{op.message}; using its last iterate.", PymcOptimWarning, stacklevel=2)

    def passthrough(value, success):
        jax.debug.callback(warn, success)
        return value

    return passthrough


def _jax_function(inputs, outputs):
    """A JAX function of `inputs` computing `outputs`, rewritten as the JAX mode does."""
    fgraph = FunctionGraph(list(inputs), list(outputs), clone=True)
    JAX.optimizer(fgraph)
    return jax_funcify(fgraph)


@jax_funcify.register(NewtonOp)
def _newton_jax(op: NewtonOp, node=None, **kwargs):
    xs, params = op.typed_inner_inputs(node)
    condition = op.condition.on(xs, params)
    (merit,) = op.inner_on(xs, params, [op.merit])
    system_fn = _jax_function(
        [*xs, *params], [merit, condition.flat_residual(), condition.jacobian()]
    )
    merit_fn = _jax_function([*xs, *params], [merit])
    n_controls, n_params = op.n_controls, op.n_params
    structure, tol, max_iter, minimization = (
        condition.structure,
        op.tol,
        op.max_iter,
        op.minimization,
    )

    def newton(*inputs):
        x0s, params = inputs[:n_controls], inputs[n_controls : n_controls + n_params]
        flat = Packer(x0s)

        def system(z):
            m, F, A = system_fn(*flat.unpack(z), *params)
            return m.astype(jnp.float64), F.astype(jnp.float64), A

        def merit(z):
            (m,) = merit_fn(*flat.unpack(z), *params)
            return m.astype(jnp.float64)

        def converged(F):
            return jnp.max(jnp.abs(F), initial=0.0) <= tol

        def finite(m, F):
            return jnp.isfinite(m) & jnp.all(jnp.isfinite(F))

        def cond(state):
            it, _, m, F, _, _, stalled, negligible = state
            return (it < max_iter) & finite(m, F) & ~converged(F) & ~stalled & ~negligible

        def body(state):
            it, z, m, F, A, nfev, _, _ = state
            d = -structure.solve_array(A, F, jnp)
            if minimization:
                slope = F @ d
                is_newton_step = jnp.isfinite(slope) & (slope < 0)
                d = jnp.where(is_newton_step, d, -F)
                slope = jnp.where(is_newton_step, slope, -(F @ F))
            else:
                slope, is_newton_step = -2.0 * m, jnp.all(jnp.isfinite(d))
            # the same rules as _iterations.newton_step_is_negligible
            negligible = jnp.max(jnp.abs(d), initial=0.0) <= STEP_TOL * (
                1.0 + jnp.max(jnp.abs(z), initial=0.0)
            )
            if minimization:
                negligible = negligible | (-slope <= ROUNDING * (1.0 + jnp.abs(m)))
            negligible = is_newton_step & negligible

            def ls_cond(ls):
                k, t, accepted = ls
                return (k < MAX_BACKTRACKS) & ~accepted & ~negligible

            def ls_body(ls):
                k, t, _ = ls
                accepted = merit(z + t * d) <= m + ARMIJO * t * slope
                return k + 1, jnp.where(accepted, t, 0.5 * t), accepted

            k, t, accepted = jax.lax.while_loop(ls_cond, ls_body, (0, 1.0, False))
            accepted = accepted | negligible
            z_new = jnp.where(accepted, z + t * d, z)
            m_new, F_new, A_new = system(z_new)
            return it + 1, z_new, m_new, F_new, A_new, nfev + k + 1, ~accepted, negligible

        z0 = flat.pack(x0s, jnp)
        m0, F0, A0 = system(z0)
        init = (0, z0, m0, F0, A0, 1, False, False)
        it, z, m, F, _, nfev, _, negligible = jax.lax.while_loop(cond, body, init)
        success = finite(m, F) & (converged(F) | negligible)
        return (
            *flat.unpack(z),
            success,
            jnp.asarray(it, jnp.int64),
            jnp.asarray(nfev, jnp.int64),
        )

    return _with_implicit_vjp(op, node, newton)


@jax_funcify.register(FixedPointOp)
def _fixed_point_jax(op: FixedPointOp, node=None, **kwargs):
    if op.method == "anderson":
        return _anderson_jax(op, node)
    xs, params = op.typed_inner_inputs(node)
    update_fn = _jax_function([*xs, *params], op.inner_on(xs, params, [op.flat_update]))
    n_controls, n_params, tol, max_iter = op.n_controls, op.n_params, op.tol, op.max_iter

    def fixed_point(*inputs):
        x0s, params = inputs[:n_controls], inputs[n_controls : n_controls + n_params]
        flat = Packer(x0s)

        def update(z):
            return update_fn(*flat.unpack(z), *params)[0].astype(jnp.float64)

        def cond(state):
            it, _, step = state
            return (it < max_iter) & (step > tol)  # False for NaN

        def body(state):
            it, z, _ = state
            z_new = update(z)
            step = jnp.max(jnp.abs(z_new - z), initial=0.0)  # NaN stops the loop (cond)
            # as in _iterations: a non-finite update leaves the last finite iterate
            return it + 1, jnp.where(jnp.all(jnp.isfinite(z_new)), z_new, z), step

        it, z, step = jax.lax.while_loop(cond, body, (0, flat.pack(x0s, jnp), jnp.inf))
        success = jnp.isfinite(step) & (step <= tol)
        it = jnp.asarray(it, jnp.int64)
        return (*flat.unpack(z), success, it, it)

    return _with_implicit_vjp(op, node, fixed_point)


def _anderson_jax(op: FixedPointOp, node):
    """`_iterations.anderson` as a while_loop: the last `memory` differences live in fixed-size
    arrays whose unused columns are zero (the minimum-norm least-squares γ is 0 there)."""
    xs, params = op.typed_inner_inputs(node)
    update_fn = _jax_function([*xs, *params], op.inner_on(xs, params, [op.flat_update]))
    n_controls, n_params, tol, max_iter = op.n_controls, op.n_params, op.tol, op.max_iter
    memory = ANDERSON_MEMORY

    def anderson(*inputs):
        x0s, params = inputs[:n_controls], inputs[n_controls : n_controls + n_params]
        flat = Packer(x0s)

        def residual(z):
            return update_fn(*flat.unpack(z), *params)[0].astype(jnp.float64) - z

        def converged(g):
            return jnp.max(jnp.abs(g), initial=0.0) <= tol

        def cond(state):
            it, _, g, *_ = state
            return (it < max_iter) & jnp.all(jnp.isfinite(g)) & ~converged(g)

        def body(state):
            it, z, g, dZ, dG = state
            gamma = jnp.linalg.lstsq(dG, g)[0]
            z_new = z + g - (dZ + dG) @ gamma
            g_new = residual(z_new)
            slot = it % memory
            dZ = dZ.at[:, slot].set(z_new - z)
            dG = dG.at[:, slot].set(g_new - g)
            return it + 1, z_new, g_new, dZ, dG

        z0 = flat.pack(x0s, jnp)
        history = jnp.zeros((z0.shape[0], memory))
        init = (0, z0, residual(z0), history, history)
        it, z, g, _, _ = jax.lax.while_loop(cond, body, init)
        finite = jnp.all(jnp.isfinite(g))
        success = (it < max_iter) & finite & converged(g)
        z = jnp.where(success, z + g, z)
        count = jnp.asarray(jnp.where(it < max_iter, it + 1, max_iter), jnp.int64)
        return (*flat.unpack(z), success, count, count)

    return _with_implicit_vjp(op, node, anderson)


def _with_implicit_vjp(op: SolverOp, node, solver):
    """Make JAX's own autodiff of `solver` use the package's implicit rule, not the loop.

    PyTensor differentiates solver Ops symbolically (``L_op``), but samplers that differentiate
    the jaxified log density with JAX (numpyro, blackjax) would try to reverse the
    ``while_loop``, which JAX refuses. The custom VJP's backward pass is the shared pullback
    graph of :func:`pymc_optim.implicit.implicit_pullback`, jaxified: no second copy of the rule.
    """
    x_stars = [out.type() for out in node.outputs[: op.n_controls]]
    params = [inp.type() for inp in node.inputs[op.n_controls : op.n_controls + op.n_params]]
    g_bars = [x.type() for x in x_stars]
    param_grads = implicit_pullback(op.condition, x_stars, params, g_bars)
    differentiable = [g is not None for g in param_grads]
    pullback = _jax_function(
        [*x_stars, *params, *g_bars], [g for g in param_grads if g is not None]
    )
    n_controls, n_params = op.n_controls, op.n_params

    @jax.custom_vjp
    def solve(*inputs):
        return solver(*inputs)

    def forward(*inputs):
        outputs = solver(*inputs)
        return outputs, (outputs[:n_controls], inputs)

    def backward(residuals, cotangents):
        x_star_values, inputs = residuals
        param_values = inputs[n_controls : n_controls + n_params]
        grads = iter(pullback(*x_star_values, *param_values, *cotangents[:n_controls]))
        return tuple(
            next(grads) if is_param and differentiable[i - n_controls] else _zero_cotangent(value)
            for i, value in enumerate(inputs)
            for is_param in [n_controls <= i < n_controls + n_params]
        )

    solve.defvjp(forward, backward)
    return solve


def _zero_cotangent(value):
    value = jnp.asarray(value)
    if jnp.issubdtype(value.dtype, jnp.inexact):
        return jnp.zeros_like(value)
    return np.zeros(value.shape, dtype=jax.dtypes.float0)  # integer/boolean inputs
