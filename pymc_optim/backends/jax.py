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

from pymc_optim._logging import announce_compilation
from pymc_optim.backends.fixed_point import FixedPointOp
from pymc_optim.backends.iterations import (
    ANDERSON_MEMORY,
    ARMIJO,
    MAX_BACKTRACKS,
    ROUNDING,
    STEP_TOL,
    chord_final_step,
)
from pymc_optim.backends.newton import NewtonOp, problem_rows
from pymc_optim.backends.packing import Packer
from pymc_optim.graph.failure_ops import (
    CountFailures,
    WarnOnFailure,
    first_failure_code,
    record_failure,
)
from pymc_optim.graph.solver_op import SolverOp, inner_mode
from pymc_optim.graph.status import SolverStatus
from pymc_optim.implicit import implicit_pullback

__all__: list[str] = []


@jax_funcify.register(SolverOp)
def _refuse_callback_solvers(op, node=None, **kwargs):
    raise NotImplementedError(
        f"{op} calls scipy from Python at every iteration and cannot run under the JAX backend. "
        "Use `method='newton'` (graph-native, runs in JAX) for minimize, root, minimize_scalar "
        "and root_scalar, or `method='newton'`/'iteration' for fixed_point."
    )


def _on_failure(callback, success, *operands):
    """A 0-d zero computed by ``callback(success, *operands)`` on the host when some solve
    failed.

    A host callback costs about a millisecond per call on CPU (the Finland marginal: 3.5 → 2.0
    ms per logp), more than the solve it reports on, so a successful solve makes none. It is a
    ``pure_callback`` in a branch, not a ``debug.callback``: an effect, even in a branch not
    taken, costs the whole function its runtime token. XLA removes a pure callback whose result
    nobody uses, so the callers fold the zero into their output.
    """
    # booleans and integer codes; under autodiff tracers all the same
    success, *operands = (jax.lax.stop_gradient(value) for value in (success, *operands))

    def report(*values):
        callback(*values)
        return np.zeros((), np.float64)

    return jax.lax.cond(
        jnp.all(success),
        lambda *values: jnp.zeros((), jnp.float64),
        lambda *values: jax.pure_callback(
            report, jax.ShapeDtypeStruct((), jnp.float64), *values, vmap_method="sequential"
        ),
        success,
        *operands,
    )


@jax_funcify.register(WarnOnFailure)
def _warn_on_failure(op, node=None, **kwargs):
    import warnings

    from pymc_optim._warnings import PymcOptimWarning

    def warn(success):
        if not bool(success):
            warnings.warn(f"{op.message}; using its last iterate.", PymcOptimWarning, stacklevel=2)

    def passthrough(value, success):
        return value + _on_failure(warn, success).astype(value.dtype)

    return passthrough


@jax_funcify.register(CountFailures)
def _count_failures(op, node=None, **kwargs):
    """`success` passed through; a failure is counted in this process, as in `perform` (by the
    reason of the optional `status` input's first nonzero code)."""

    def count(success, status=None):
        if not bool(success):
            record_failure(op.label, 0 if status is None else first_failure_code(status))

    def passthrough(success, *status):
        return success & (_on_failure(count, success, *status) == 0)

    return passthrough


def _jax_function(inputs, outputs):
    """A JAX function of `inputs` computing `outputs`, rewritten as the JAX mode does (and
    `INNER_REWRITES`)."""
    fgraph = FunctionGraph(list(inputs), list(outputs), clone=True)
    inner_mode(JAX).optimizer(fgraph)
    return jax_funcify(fgraph)


def _per_problem(test_fn, A, owner, n_problems):
    """Per problem: its part of A passes a structure's own test of A compiled to JAX
    (`_iterations.per_problem`): one flag per independent part of A, given to the problem owning
    the part's first element."""
    (good,) = test_fn(A)
    bad = (~good).astype(jnp.int32)
    part_owner = owner[:: owner.shape[0] // good.shape[0]]
    return jnp.zeros(n_problems, jnp.int32).at[part_owner].max(bad) == 0


@jax_funcify.register(NewtonOp)
def _newton_jax(op: NewtonOp, node=None, **kwargs):
    announce_compilation("JAX", "a graph-native NewtonOp solve")
    n_controls, n_params = op.n_controls, op.n_params
    structure, tol, max_iter, minimization = (
        op.condition.structure,
        op.tol,
        op.max_iter,
        op.minimization,
    )
    batch_ndim = op.batch_ndim
    built = {}

    def inner_functions(shapes):
        """The system, merit and positive-definiteness functions for inputs of `shapes`. JAX
        traces with concrete shapes: written into the inner graph's types, sizes that follow
        them (a Split of list controls without static shapes) become constants, which JAX's
        split needs. They are built once per shapes, possibly while a solve is being traced:
        built eagerly, so what an Op computes when it is converted (a constant matrix) stays a
        concrete array rather than a value of that trace, which a later trace must not see."""
        if shapes not in built:
            with jax.ensure_compile_time_eval():
                xs, params = op.typed_inner_inputs(node, shapes)
                condition = op.condition.on(xs, params)
                (merit,) = op.inner_on(xs, params, [op.merit])
                jacobian = condition.jacobian()
                A_in = jacobian.type()
                built[shapes] = (
                    _jax_function([*xs, *params], [merit, condition.flat_residual(), jacobian]),
                    _jax_function([*xs, *params], [merit]),
                    _jax_function([A_in], [condition.structure.positive_definite(A_in)]),
                    _jax_function([A_in], [condition.structure.finite(A_in)]),
                )
        return built[shapes]

    def newton(*inputs):
        """`_iterations.newton` as a ``while_loop``: the same per-problem decisions."""
        x0s, params = inputs[:n_controls], inputs[n_controls : n_controls + n_params]
        system_fn, merit_fn, positive_definite_fn, finite_fn = inner_functions(
            tuple(tuple(jnp.shape(v)) for v in inputs[: n_controls + n_params])
        )
        flat = Packer(x0s)
        batch_shape = tuple(jnp.shape(x0s[0])[:batch_ndim])
        rows = problem_rows(flat.sizes, batch_shape)
        n_problems = rows.shape[0]
        owner = np.empty(sum(flat.sizes), dtype=np.int64)
        owner[rows.ravel()] = np.repeat(np.arange(n_problems), rows.shape[1])

        def system(z):
            m, F, A = system_fn(*flat.unpack(z), *params)
            return jnp.reshape(m, -1).astype(jnp.float64), F.astype(jnp.float64), A

        def merit(z):
            (m,) = merit_fn(*flat.unpack(z), *params)
            return jnp.reshape(m, -1).astype(jnp.float64)

        def max_abs(v):
            return jnp.max(jnp.abs(v[rows]), axis=1, initial=0.0)

        def dot(u, v):
            return jnp.sum(u[rows] * v[rows], axis=1)

        def finite(m, F):
            return jnp.isfinite(m) & jnp.all(jnp.isfinite(F[rows]), axis=1)

        def finite_system(m, F, A):
            return finite(m, F) & _per_problem(finite_fn, A, owner, n_problems)

        def stop(state, which, ok, iteration, A, reason=SolverStatus.CONVERGED):
            """End the problems in `which`, successful where `ok` (minimization: and where A
            is positive definite, factorized only when some problem needs it); `reason` is
            the status where `ok` is False."""
            running, success, n_iterations, status = state
            curved = ok
            if minimization:
                curved = ok & jax.lax.cond(
                    jnp.any(which & ok),
                    lambda: _per_problem(positive_definite_fn, A, owner, n_problems),
                    lambda: jnp.ones(n_problems, bool),
                )
            code = jnp.where(ok, int(SolverStatus.NOT_POSITIVE_DEFINITE), int(reason))
            code = jnp.where(curved, int(SolverStatus.CONVERGED), code)
            return (
                running & ~which,
                jnp.where(which, curved, success),
                jnp.where(which, iteration, n_iterations),
                jnp.where(which, code, status),
            )

        def checks(flags, z, m, F, A, iteration, previous):
            """What the numpy loop tests at the top of each iteration, with its final Newton
            step for the problems stopped by max|F| ≤ tol (with the previous iterate's A where
            `chord_final_step` allows it for every running problem); returns the flags, z and
            the step. `previous`: (stepped, max|F|, A) of the full Newton step that led to z."""
            ok = finite(m, F)
            flags = stop(flags, flags[0] & ~ok, ok, iteration, A, SolverStatus.NONFINITE)
            F_max = max_abs(F)
            converged = flags[0] & (F_max <= tol)
            stepped, F_max_previous, A_previous = previous
            fast = converged & stepped & chord_final_step(F_max, F_max_previous, tol)
            chord = jnp.any(converged) & jnp.all(fast | ~flags[0])
            A = jnp.where(chord, A_previous, A)
            d = -structure.solve_array(A, F, jnp)
            flags = stop(flags, converged, ok, iteration, A)
            running, success, n_iterations, status = flags
            # the final Newton step: no evaluation, the error squared
            final = converged & success & jnp.all(jnp.isfinite(d[rows]), axis=1)
            z = jnp.where(final[owner], z + d, z)
            return (running & (iteration < max_iter), success, n_iterations, status), z, d

        def body(state):
            it, z, m, F, A, d, nfev, flags = state
            F_max = max_abs(F)
            running = flags[0]
            if minimization:
                slope = dot(F, d)
                is_newton_step = jnp.isfinite(slope) & (slope < 0)
                d = jnp.where(is_newton_step[owner], d, -F)
                slope = jnp.where(is_newton_step, slope, -dot(F, F))
            else:
                is_newton_step = jnp.all(jnp.isfinite(d[rows]), axis=1)
                singular = running & ~is_newton_step
                flags = stop(flags, singular, is_newton_step, it, A, SolverStatus.SINGULAR)
                slope = -2.0 * m
            # the same rule as _iterations.tiny_step
            tiny = max_abs(d) <= STEP_TOL * (1.0 + max_abs(z))
            tiny = flags[0] & is_newton_step & tiny
            z = jnp.where(tiny[owner], z + d, z)
            flags = stop(flags, tiny, tiny, it + 1, A)
            running = flags[0]

            z_full = jnp.where(running[owner], z + d, z)
            m_full, F_full, A_full = system(z_full)
            nfev = nfev + running
            finite_full = finite_system(m_full, F_full, A_full)
            accepted = running & finite_full & (m_full <= m + ARMIJO * slope)
            if minimization:
                # the same rule as _iterations.unseen_decrease
                unseen = running & is_newton_step & (-slope <= ROUNDING * (1.0 + jnp.abs(m)))
                smaller = finite_full & (max_abs(F_full) < F_max)
                accepted = accepted | (unseen & smaller)
                flags = stop(flags, unseen & ~accepted, jnp.ones(n_problems, bool), it + 1, A)
            backtrack = flags[0] & ~accepted

            def ls_cond(ls):
                k, _, _, searching, *_ = ls
                return (k < MAX_BACKTRACKS - 1) & jnp.any(searching)

            def ls_body(ls):
                k, t, t_try, searching, fresh, nfev, system_new = ls
                t_try = jnp.where(searching, 0.5 * t_try, t_try)
                trial = merit(jnp.where(searching[owner], z + t_try[owner] * d, z))
                nfev = nfev + searching
                found = searching & (trial <= m + ARMIJO * t_try * slope)  # False for NaN
                t = jnp.where(found, t_try, t)
                searching = searching & ~found

                def check():
                    """Every search has found its point: the system there, whose problems
                    where it is not finite (though the merit is) search on."""
                    m_new, F_new, A_new = system(jnp.where(running[owner], z + t[owner] * d, z))
                    rejected = fresh & ~finite_system(m_new, F_new, A_new)
                    return rejected, rejected, nfev + fresh, (m_new, F_new, A_new)

                def search_on():
                    return searching, fresh, nfev, system_new

                searching, fresh, nfev, system_new = jax.lax.cond(
                    jnp.any(searching), search_on, check
                )
                return k + 1, t, t_try, searching, fresh, nfev, system_new

            t0 = jnp.where(accepted, 1.0, 0.0)
            fresh = backtrack  # problems whose point moves since the last system call
            ls = (0, t0, jnp.ones(n_problems), backtrack, fresh, nfev, (m_full, F_full, A_full))
            _, t, _, searching, fresh, nfev, system_new = jax.lax.while_loop(ls_cond, ls_body, ls)
            settled = ~jnp.any(searching)
            failed = jnp.zeros(n_problems, bool)
            flags = stop(flags, searching, failed, it, A, SolverStatus.LINE_SEARCH_FAILED)
            stepped = flags[0] | accepted  # still running: accepted or backtracked
            z_new = jnp.where(stepped[owner], z + t[owner] * d, z)
            z_new = jnp.where(jnp.any(backtrack), z_new, jnp.where(accepted[owner], z_full, z))

            def evaluate():
                # (the system at the point of a search ended early is checked at the next
                # iteration's start, which fails it there)
                return system(z_new)

            previous = (accepted & is_newton_step & ~jnp.any(backtrack), F_max, A)
            m, F, A = jax.lax.cond(jnp.any(backtrack) & ~settled, evaluate, lambda: system_new)
            nfev = nfev + jnp.where(settled, False, fresh & flags[0])
            flags, z_new, d = checks(flags, z_new, m, F, A, it + 1, previous)
            return it + 1, z_new, m, F, A, d, nfev, flags

        z0 = flat.pack(x0s, jnp)
        m0, F0, A0 = system(z0)
        none = jnp.zeros(n_problems, bool)
        flags = (
            ~none,
            none,
            jnp.full(n_problems, max_iter, jnp.int64),
            jnp.full(n_problems, int(SolverStatus.MAX_ITER), jnp.int64),
        )
        flags, z0, d0 = checks(flags, z0, m0, F0, A0, 0, (none, jnp.zeros(n_problems), A0))
        nfev0 = jnp.ones(n_problems, jnp.int64)
        init = (0, z0, m0, F0, A0, d0, nfev0, flags)
        _, z, _, _, _, _, nfev, (_, success, n_iterations, status) = jax.lax.while_loop(
            lambda state: jnp.any(state[-1][0]), body, init
        )
        success, status = _parameter_checks(op, params, batch_shape, success, status)
        return (
            *flat.unpack(z),
            success.reshape(batch_shape),
            n_iterations.astype(jnp.int64).reshape(batch_shape),
            nfev.astype(jnp.int64).reshape(batch_shape),
            status.astype(jnp.int64).reshape(batch_shape),
        )

    return _with_implicit_vjp(op, node, newton)


@jax_funcify.register(FixedPointOp)
def _fixed_point_jax(op: FixedPointOp, node=None, **kwargs):
    announce_compilation("JAX", "a graph-native FixedPointOp solve")
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
        status = _fixed_point_status(success, jnp.isfinite(step))
        success, status = _parameter_checks(op, params, (), success, status)
        it = jnp.asarray(it, jnp.int64)
        return (*flat.unpack(z), success, it, it, status)

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
        status = _fixed_point_status(success, finite)
        success, status = _parameter_checks(op, params, (), success, status)
        return (*flat.unpack(z), success, count, count, status)

    return _with_implicit_vjp(op, node, anderson)


def _fixed_point_status(success, finite):
    """The `SolverStatus` of a fixed-point loop that ended: converged, a non-finite update,
    or the iteration budget spent."""
    code = jnp.where(finite, int(SolverStatus.MAX_ITER), int(SolverStatus.NONFINITE))
    return jnp.where(success, int(SolverStatus.CONVERGED), code).astype(jnp.int64)


def _parameter_checks(op: SolverOp, params, batch_shape: tuple, success, status):
    """`success` and `status` failed with `SolverStatus.INVALID_PARAMETERS` where a condition
    of `SolverOp.parameter_checks` is false (per problem, as `SolverOp.failed_checks`)."""
    if not op.parameter_checks:
        return success, status
    n_problems = int(np.prod(batch_shape, dtype=np.int64))
    failed = jnp.zeros(jnp.shape(success), bool)
    for i in op.parameter_checks:
        condition = jnp.asarray(params[i])
        if batch_shape and condition.shape[: len(batch_shape)] == batch_shape:
            failed = failed | ~jnp.all(condition.reshape(n_problems, -1), axis=1).reshape(
                jnp.shape(success)
            )
        else:
            failed = failed | ~jnp.all(condition)
    invalid = int(SolverStatus.INVALID_PARAMETERS)
    return success & ~failed, jnp.where(failed, invalid, status)


def _with_implicit_vjp(op: SolverOp, node, solver):
    """Make JAX's own autodiff of `solver` use the package's implicit rule, not the loop.

    PyTensor differentiates solver Ops symbolically (``pullback``), but samplers that differentiate
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


# the linear-algebra Ops' implementations register with PyTensor's JAX dispatch on import
from pymc_optim.backends import jax_linalg as _jax_linalg  # noqa: E402, F401
