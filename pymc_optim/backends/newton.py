"""The graph-native damped Newton Op, shared by minimize, root, their scalar forms and fixed_point.

The Op holds the inner graphs of the merit function, F and A = ∂F/∂x (in the structure's compact
form); no scipy. Under the default backend `perform` runs the numpy loop of
:mod:`pymc_optim.backends.iterations` on compiled inner graphs; under JAX the same loop is a
``jax.lax.while_loop`` (:mod:`pymc_optim.backends.jax`). Differentiation is the shared implicit
rule.
"""

from __future__ import annotations

import math

import numpy as np
import pytensor.tensor as pt
from pytensor.graph.basic import Apply
from pytensor.graph.replace import graph_replace

from pymc_optim.backends import iterations as _iterations
from pymc_optim.backends.packing import Packer
from pymc_optim.graph.inner_graph import InnerProblem
from pymc_optim.graph.solver_op import (
    INVALID_PARAMETERS,
    NOT_INVALID_PARAMETERS,
    ProblemUndefined,
    SolverOp,
    graph_call,
)
from pymc_optim.implicit import OptimalityCondition

__all__ = [
    "DEFAULT_MAX_ITER",
    "CANONICAL_BITS",
    "DEFAULT_TOL",
    "NewtonOp",
    "canonical_step",
    "direct_call",
    "extrapolated_start",
    "problem_rows",
    "sequential_solve",
]

#: Stop when max|F| ≤ tol: Newton converges quadratically, so 1e-8 costs one step more than 1e-4.
DEFAULT_TOL = 1e-8
#: Newton needs few steps when it works; 100 leaves room for damped steps far from the solution.
DEFAULT_MAX_ITER = 100


class NewtonOp(SolverOp):
    """Damped Newton on an optimality condition F(x, θ) = 0 with a merit function.

    Parameters
    ----------
    problem : InnerProblem
    condition : OptimalityCondition
        F and the structure of A, on the problem's inner variables.
    merit : TensorVariable
        The objective (``minimization=True``, F its gradient) or ½‖F‖².
    value : TensorVariable
        What :func:`solution_info` reports (objective or residual norm).
    batch_ndim : int, default 0
        The leading dimensions of every control that index independent problems (a native
        batch, :mod:`pymc_optim.backends.vectorize`): the merit then has the batch's shape (one
        value per problem) and `success` and the counters are reported per problem, batch-shaped.
    warm_start : bool, default False
        Start each solve from the last successful solution of this node of a compiled function
        in this thread instead of x0 (see `warm_start_point`), and end every solve with
        `canonical_step` (one more evaluation) so that the result does not depend on that start,
        bit for bit;
        :func:`pymc_optim.marginalize_laplace` turns it on. The numpy loop keeps that state per
        compiled node and thread (`solve_state`), the numba loop in per-thread buffers
        (`backends.numba_runtime`); JAX starts from x0.
    """

    method = "newton"
    #: With `warm_start`: extrapolate along the last two solutions (`warm_start_point`).
    predictor = True
    #: Start each solve with chord steps on the Jacobian of the last successful solve of this
    #: compiled node in this thread (unless the last extra input, "continued", is False), and
    #: return the last evaluated iterate instead of taking the final Newton step
    #: (`iterations.newton`'s `chord` and ``final_step=False``): set on the Ops that
    #: `sequential_solve` makes; numpy and numba loops (JAX takes plain Newton steps).
    sequential = False

    __props__ = (
        "n_extras",
        "minimization",
        "tol",
        "max_iter",
        "batch_ndim",
        "warm_start",
        "predictor",
        "sequential",
    )
    LOOP_OPTIONS = __props__

    # One attribute per option, as the scipy Ops store theirs (backends/scipy/ops.py).
    def __init__(
        self,
        problem: InnerProblem,
        *,
        condition: OptimalityCondition,
        merit,
        value,
        minimization: bool,
        tol: float,
        max_iter: int,
        n_extras: int = 0,
        batch_ndim: int = 0,
        warm_start: bool = False,
    ):
        super().__init__(problem, condition=condition, n_extras=n_extras)
        self.warm_start = warm_start
        self.merit = merit
        self._value = value
        self.minimization = minimization
        self.tol = _iterations.reachable_tolerance(tol, [x.type.dtype for x in problem.inner_xs])
        self.max_iter = max_iter
        self.batch_ndim = batch_ndim

    @classmethod
    def minimizing(
        cls, problem: InnerProblem, condition: OptimalityCondition, objective, **options
    ):
        """Newton on ∇f = 0 (`condition`), with the objective f as merit and reported value."""
        return cls(
            problem,
            condition=condition,
            merit=objective,
            value=objective,
            minimization=True,
            **options,
        )

    @classmethod
    def solving(cls, problem: InnerProblem, condition: OptimalityCondition, value=None, **options):
        """Newton on F = 0 (`condition`), with ½‖F‖² as merit; the reported value is ‖F‖₂ unless
        given."""
        return cls(
            problem,
            condition=condition,
            merit=0.5 * (condition.flat_residual() ** 2).sum(),
            value=condition.residual_norm() if value is None else value,
            minimization=False,
            **options,
        )

    @property
    def value(self):
        return self._value

    def inner_expressions(self):
        return [*super().inner_expressions(), self.merit, self._value]

    def make_node(self, *inputs):
        node = super().make_node(*inputs)
        if not self.batch_ndim:
            return node
        k = self.n_controls
        diagnostics = [
            pt.tensor(dtype=out.type.dtype, shape=node.inputs[0].type.shape[: self.batch_ndim])
            for out in node.outputs[k:]
        ]
        x_stars = [out.type() for out in node.outputs[:k]]
        return Apply(self, node.inputs, [*x_stars, *diagnostics])

    def infer_shape(self, node, input_shapes):
        batch_shape = tuple(input_shapes[0][: self.batch_ndim])
        return [*input_shapes[: self.n_controls], *[batch_shape] * 4]

    def diagnostics_shape(self, x0s) -> tuple:
        return tuple(np.shape(x0s[0])[: self.batch_ndim])

    def numerical_functions(self):
        system = [self.merit, self.condition.flat_residual(), self.condition.jacobian()]
        return {"system": ([], system), "merit": ([], [self.merit])}

    def solve(self, fns, x0s, params, extras, state):
        system_fn, merit_fn = self._direct_call(fns["system"]), self._direct_call(fns["merit"])
        x0 = x0s[0]
        if len(x0s) == 1 and isinstance(x0, np.ndarray) and x0.ndim == 1 and x0.dtype == "f8":
            # one flat float64 control (a Laplace marginal's): z is x, nothing to (un)pack
            z0, unpack = x0, None

            def system(z):
                m, F, A = system_fn(z, *params)
                return (m.reshape(-1) if isinstance(m, np.ndarray) else np.reshape(m, -1)), F, A

            def merit(z):
                return np.reshape(merit_fn(z, *params)[0], -1)
        else:
            packer = Packer(x0s)
            z0, unpack = packer.pack(x0s), packer.unpack

            def system(z):
                m, F, A = system_fn(*unpack(z), *params)
                return np.reshape(m, -1), F, A

            def merit(z):
                return np.reshape(merit_fn(*unpack(z), *params)[0], -1)

        shape = self.diagnostics_shape(x0s) if self.batch_ndim else ()
        rows = None
        if shape:
            rows = problem_rows([np.size(x0) for x0 in x0s], shape)
        sequential = self.sequential and rows is None
        if sequential and not extras[-1]:  # a new sequence: no chord steps on an older one's A
            state.pop("chord", None)
        if sequential:
            evaluate, last_jacobian = system, []

            def system(z):
                m, F, A = evaluate(z)
                last_jacobian[:] = [A]
                return m, F, A

        def run(z0):
            return _iterations.newton(
                system,
                merit,
                z0,
                structure=self.condition.structure,
                minimization=self.minimization,
                tol=self.tol,
                max_iter=self.max_iter,
                rows=rows,
                chord=state.get("chord") if sequential else None,
                final_step=not sequential,
            )

        history = state.setdefault("warm_start", []) if self.warm_start else None
        theta = _theta(params) if self.warm_start else None
        start = self.warm_start_point(history, z0, params, theta) if self.warm_start else None
        if start is None:
            z, success, n_iterations, n_evaluations, status = run(z0)
        else:
            try:
                z, success, n_iterations, n_evaluations, status = run(start)
            except ProblemUndefined:  # raised along the warm path: the cold start decides
                success = n_iterations = n_evaluations = np.zeros(1, dtype=np.int64)
            if not success.all():  # the cold start decides; the counters include both solves
                z, success, more_iterations, more_evaluations, status = run(z0)
                n_iterations = n_iterations + more_iterations
                n_evaluations = n_evaluations + more_evaluations
        if self.warm_start:
            z, more_evaluations = canonical_step(
                system, z, success, structure=self.condition.structure, rows=rows
            )
            n_evaluations = n_evaluations + more_evaluations
        if sequential and success.all():
            state["chord"] = last_jacobian[0]
        if self.warm_start and success.all():
            history.append((theta, np.array(z, dtype="float64", copy=True)))
            del history[:-2]
        diagnostics = (success, n_iterations, n_evaluations, status)
        success, n_iterations, n_evaluations, status = (
            np.asarray(v).reshape(shape) for v in diagnostics
        )
        x_stars = [z] if unpack is None else unpack(z)
        return x_stars, success, n_iterations, n_evaluations, status

    def guarded_functions(self, fns: dict) -> dict:
        # `_direct_call` guards the calls itself: a wrapper here would hide the VM it calls
        return fns

    def _direct_call(self, fn):
        """`direct_call(fn)`, made once per compiled function (it holds fn's storage cells)."""
        if getattr(fn, "vm", None) is None:  # e.g. the trace recorder's wrappers, new per solve
            return graph_call(fn, self.graph_errors)
        cache = self.__dict__.setdefault("_direct", {})
        hit = cache.get(id(fn))
        if hit is None or hit[0] is not fn:
            hit = cache[id(fn)] = (fn, direct_call(fn, self.graph_errors))
        return hit[1]

    def warm_start_point(
        self, history: list, z0: np.ndarray, params=(), theta=None
    ) -> np.ndarray | None:
        """Where a warm solve starts: the last successful solution in `history` (this compiled
        node's in this thread, ``solve_state(node)["warm_start"]``: the last two solves, (θ, x*)
        each), if it has z0's shape and is finite; None (start at z0) otherwise. With two stored
        solutions (and `predictor` on), it is moved along their secant by the projection of the
        step in the parameters on their step: a sampler's trajectory is nearly straight, so
        this follows x*(θ) to first order along it.

        Solutions are stored as copies (the outer graph may work in place on the Op's output
        buffers) and only after a successful solve, so the start is always a converged mode of
        some earlier parameters (or its extrapolation). The solve from there meets the same
        stopping rule as a cold one and ends with `canonical_step`, and a failed warm solve is
        repeated from z0, so the result does not depend on the start. `theta` is
        ``_theta(params)`` when the caller has it.
        """
        if not history:
            return None
        theta_1, start = history[-1]
        if start.shape != np.shape(z0) or not np.isfinite(start).all():
            return None
        if len(history) == 2 and self.predictor:
            theta_0, previous = history[0]
            theta = _theta(params) if theta is None else theta
            if theta.shape == theta_1.shape == theta_0.shape:
                return extrapolated_start(theta, theta_1, theta_0, start, previous)
        return start


def sequential_solve(solution, start, jacobian):
    """The solve of `solution` (x* of a one-control `NewtonOp`) from `start`, for a sequence
    of nearby solves whose order and starts the caller fixes (latent draws along a tour).

    The Op is copied without its warm start and canonical step, with chord steps on the last
    solve's Jacobian (``NewtonOp.sequential``) unless `start` is the Op's own x0 (a cold start
    begins a new sequence, so that a sequence's solves depend on its own starts alone), and it
    returns its last evaluated iterate z: the final Newton step x = z − A(z)⁻¹F(z) is taken here
    in the graph, with A(z) = `jacobian` (a graph of `solution`, compact in the structure) at z,
    the matrix the loop factorized last. A caller that uses that A (a draw from its factor) then
    shares the factorization (the sparse Ops cache the last factor by value), and the next
    solve's chord steps reuse it again: one factorization per solve when the chord steps
    converge. x is exact to rounding as the Op's own x* (Newton's error squared); its last bits
    depend on `start`.

    Returns ``(x, z, A(z), replacements)``, the last mapping `solution`'s node outputs to the
    new node's (success and the counters), or None when `solution` is not such a solve.
    """
    owner = solution.owner
    op = None if owner is None else owner.op
    if not isinstance(op, NewtonOp) or op.n_controls != 1 or op.batch_ndim:
        return None
    # sharing the compiled inner functions; one more extra input, "continued"
    op = op.replace(warm_start=False, sequential=True, n_extras=op.n_extras + 1)
    x0, *inputs = owner.inputs
    start = pt.as_tensor_variable(start).astype(x0.dtype)
    continued = pt.any(pt.neq(start, x0))
    outputs = op.make_node(start, *inputs, continued).outputs
    z = outputs[0]
    (residual,) = op.inner_on([z], inputs[: op.n_params], [op.condition.flat_residual()])
    at_z = graph_replace(jacobian, {solution: z}, strict=False)
    step = op.condition.structure.solve(at_z, residual, transposed=False, symmetric=True)
    return z - step, z, at_z, dict(zip(owner.outputs, outputs, strict=True))


#: `canonical_step` rounds the solution to 2⁻²⁴ of its scale (a power of two ≥ max|z|, at least 1).
CANONICAL_BITS = 24


def canonical_step(system, z, success, *, structure, rows=None):
    """One Newton step from the solution rounded to a fixed grid: the result is then a function
    of the problem and of the grid point alone, not of where the iterations started.

    A converged solve (`iterations.newton` ends with a full Newton step) is exact to rounding,
    but its last bits still depend on the start, and a sampler amplifies any difference: with
    a warm start, ``pm.sample`` with ``cores=1`` (chains in sequence, sharing the Op) would not
    reproduce ``cores=2``. Rounding z to multiples of q = 2^(e − `CANONICAL_BITS`), 2^e ≥
    max(1, max|z|), gives the same grid point r from any two starts unless an element of the
    two solutions straddles a multiple of q, with probability ≈ |Δz|/q ≈ 1e-16/6e-8 per element;
    the Newton step from r, one evaluation of `system`, is exact to ~(q/2)² ≈ 1e-15 (Newton's
    error squared, times the problem's curvature ratio). Problems that failed keep their z; so
    does a problem whose step from r is not finite (then the start is visible again).

    Returns ``(z, n_evaluations)``, the evaluations per problem (shape (B,), as ``success``).
    """
    success = np.reshape(success, -1)
    if not success.any():
        return z, np.zeros(success.shape, dtype=np.int64)
    if rows is None and success.shape == (1,):
        # one problem (a Laplace marginal's): the same arithmetic on a scalar grid step q
        scale = max(1.0, float(np.abs(z).max(initial=0.0)))
        if math.isfinite(scale):
            q = math.ldexp(1.0, math.frexp(scale)[1] - CANONICAL_BITS)
            r = np.round(z / q) * q
            with np.errstate(all="ignore"):
                _, F, A = system(r)
                step = r - _iterations.solve(structure, A, F)
                ok = bool(np.isfinite(step).all())
            return (step if ok else z), np.ones(1, dtype=np.int64)
    if rows is None:
        rows = np.arange(z.size)[None, :]
    owner = np.empty(z.size, dtype=np.int64)
    owner[rows.ravel()] = np.repeat(np.arange(rows.shape[0]), rows.shape[1])
    scale = np.maximum(1.0, np.max(np.abs(z[rows]), axis=1, initial=0.0))
    q = np.ldexp(1.0, np.frexp(scale)[1] - CANONICAL_BITS)[owner]
    r = np.round(z / q) * q  # exact: q is a power of two
    with np.errstate(all="ignore"):
        _, F, A = system(r)
        step = r - _iterations.solve(structure, A, F)
    ok = success & np.isfinite(step[rows]).all(axis=1)
    return np.where(ok[owner], step, z), success.astype(np.int64)


def extrapolated_start(theta, theta_1, theta_0, start, previous):
    """`start` (the solution at θ₁) moved along the secant from `previous` (at θ₀) by the
    projection of θ − θ₁ on θ₁ − θ₀, clipped to [−1, 2]; `start` itself when θ₁ = θ₀ or the
    move is not finite. Plain numpy on arrays: the numba backend compiles this function."""
    step = theta_1 - theta_0
    length = (step * step).sum()
    if length > 0:
        along = ((theta - theta_1) * step).sum() / length
        predicted = start + min(max(along, -1.0), 2.0) * (start - previous)
        if np.isfinite(predicted).all():
            return predicted
    return start


def _theta(params) -> np.ndarray:
    """The continuous parameters as one float64 vector (the warm start's secant works on it),
    their non-finite entries as 0: a log density's constant −inf (pm.NegativeBinomial has one)
    would make the secant's differences inf − inf, and an infinite parameter gives no direction
    to follow."""
    floats = []
    for p in params:
        dtype = getattr(p, "dtype", None)  # (numpy arrays and scalars have one)
        if dtype is None:
            p = np.asarray(p)
            dtype = p.dtype
        if dtype.kind == "f":
            floats.append(np.ravel(p))
    theta = np.concatenate(floats) if floats else np.zeros(0)
    return theta if np.isfinite(theta).all() else np.where(np.isfinite(theta), theta, 0.0)


def direct_call(fn, errors: tuple = INVALID_PARAMETERS):
    """`fn` called through its virtual machine, as pytensor's Scan calls its inner function,
    with `graph_call`'s boundary: the `errors` raised by the graph raise `ProblemUndefined`.

    ``Function.__call__`` costs ~1–2 µs per call on top of the computation even with
    ``trust_input=True`` (its bookkeeping for defaults, updates and profiling), an inner call
    of a Laplace marginal's Newton solve at G = 300 costs ~15 µs in all: the loop puts the
    inputs in the function's storage and runs ``fn.vm()`` itself. The output storage is
    emptied after each call (as ``Function.__call__`` does under garbage collection), so the
    next call allocates fresh outputs and never overwrites arrays the loop still holds.
    Anything that is not a plain compiled function (e.g. the trace recorder's wrappers) is
    called as it is.
    """
    vm = getattr(fn, "vm", None)
    if vm is None or not getattr(fn, "trust_input", False):
        return graph_call(fn, errors)
    inputs = [container.storage for container in fn.input_storage]
    outputs = [container.storage for container in fn.output_storage]

    def call(*args):
        for storage, arg in zip(inputs, args, strict=True):
            storage[0] = arg
        try:
            vm()
        except NOT_INVALID_PARAMETERS:
            raise
        except errors as err:
            raise ProblemUndefined(f"{type(err).__name__}: {err}") from err
        values = [storage[0] for storage in outputs]
        for storage in outputs:
            storage[0] = None
        return values

    return call


def problem_rows(sizes, batch_shape) -> np.ndarray:
    """(B, n) indices into the packed z: row b lists problem b's elements.

    The controls are packed one after the other, each flattened with its batch dimensions
    leading, so control i holds B contiguous runs of ``sizes[i] // B`` elements.
    """
    n_problems = int(np.prod(batch_shape, dtype=np.int64))
    pieces, offset = [], 0
    for size in sizes:
        pieces.append(offset + np.arange(size).reshape(n_problems, -1))
        offset += size
    return np.concatenate(pieces, axis=1) if pieces else np.zeros((n_problems, 0), np.int64)
