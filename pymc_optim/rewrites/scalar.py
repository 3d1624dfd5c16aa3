"""Graph rewrites of the solver Ops: a problem in one unknown is solved by scalar Newton.

`minimize` and `root` call scipy's n-dimensional solvers (BFGS, hybr, ...) whatever the size of
`x`. When `x` has exactly one element (a 0-d variable, or a static shape such as ``(1,)``) and the
Op already uses the objective's (or the equation's) exact derivatives, the rewrite
``pymc_optim_scalar`` replaces it, when the graph is compiled, by the Op that
``minimize_scalar(..., method="newton")`` / ``root_scalar(..., method="newton")`` build: damped
Newton on f'(x) = 0 (resp. F(x) = 0) with exact first and second derivatives, an Armijo line
search on f (resp. ½F²) and a scalar division for the Newton step (diagonal structure, exact for
one unknown). It starts from the same x0, and is at least as accurate: it stops at |f'| ≤ tol
(1e-8 unless `tol`/`gtol` say otherwise), where BFGS stops at scipy's gtol of 1e-5. Both are
local methods: on an objective with several minima they normally reach the same one from the same
x0, but nothing guarantees it; compare with the rewrite excluded (below) when in doubt.

The gain (``benchmarks/bench_rewrites.py``): about 3× per call for `minimize` (BFGS) under the
default backend; for `root`, MINPACK's hybr is already cheap in one dimension and the two are on
par; under numba the scalar Newton runs compiled while the scipy Ops fall back to object mode
(15–40×); under JAX a one-unknown `minimize`/`root` now runs at all.

When it fires
-------------
Only when the result is the same problem solved by a method that uses the derivatives the user
already allowed, and the user's `optimizer_kwargs` carry over: ``tol`` and ``options={"gtol",
"maxiter", "disp"}`` for `minimize` (the gradient tolerance and iteration budget mean the same
for Newton), nothing for `root` (scipy's root tolerances are method-specific). It never fires
for derivative-free methods (a deliberate choice, often because the gradient cannot be built),
for ``jac=False``, with a solver trace or callback (the user asked to see scipy's iterations),
for a control whose static size is unknown, or for a subclass of the two Ops. Nothing is ever
rewritten the other way, from a scalar Op to an n-dimensional one.

The implicit gradient is unaffected: it is built from the optimality condition when ``pt.grad``
is called, before compilation, and evaluated at whichever x* the compiled graph computes.

Vectorized solves (``Blockwise`` of the Op) are rewritten core by core: the loop over the batch
stays, each problem keeps its own `success`. (Stacking the batch into one Newton problem, as
:mod:`pymc_optim.backends.vectorize` does for graph-native solves, would share one stopping test
and one `success` across the batch: a different answer to "which problems failed", so it is left
alone.)

Turn the rewrite off for one function with
``pytensor.function(..., mode=pytensor.compile.get_default_mode().excluding("pymc_optim_scalar"))``.
``pmo.disable_rewrites()`` leaves it on: it matches only pymc_optim's own `MinimizeOp` and
`RootOp`, so a graph without them compiles as without the package
(``tests/test_side_effects.py``).
"""

from __future__ import annotations

import dataclasses
import weakref

from pytensor.graph.rewriting.basic import node_rewriter
from pytensor.tensor.blockwise import Blockwise
from pytensor.tensor.rewriting.basic import register_specialize

from pymc_optim.backends.newton import DEFAULT_MAX_ITER, DEFAULT_TOL, NewtonOp
from pymc_optim.backends.scipy.ops import MinimizeOp, RootOp
from pymc_optim.graph.inner_graph import static_size
from pymc_optim.graph.solver_op import SolverOp
from pymc_optim.linalg.structure import LinearStructure

__all__ = ["SCALAR_REWRITE", "scalar_specialization"]

#: The rewrite's name and tag (exclude it from a mode to keep scipy's n-dimensional solvers).
SCALAR_REWRITE = "pymc_optim_scalar"

#: Keys of `minimize`'s optimizer_kwargs["options"] that Newton honours (gtol, maxiter) or that
#: change nothing about the answer (disp).
_CARRIED_MINIMIZE_OPTIONS = {"gtol", "maxiter", "disp"}

#: The scalar Op built for each rewritten Op, so that compiling the same graph again reuses it
#: (and its compiled inner functions). None records "does not apply".
_SPECIALIZED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()

#: Building the Newton step's second derivative can fail like any gradient (an Op without one).
_GRADIENT_ERRORS = (NotImplementedError, TypeError, ValueError)


def scalar_specialization(op: SolverOp) -> NewtonOp | None:
    """The scalar Newton Op that solves `op`'s problem, or None when the rewrite must not fire.

    See the module docstring for when it applies.
    """
    if op in _SPECIALIZED:
        return _SPECIALIZED[op]
    newton = _build_scalar_newton(op)
    _SPECIALIZED[op] = newton
    return newton


@node_rewriter([MinimizeOp, RootOp, Blockwise])
def _scalar_solver(fgraph, node):
    op = node.op
    core_op = op.core_op if isinstance(op, Blockwise) else op
    if type(core_op) not in (MinimizeOp, RootOp):
        return None
    newton = scalar_specialization(core_op)
    if newton is None:
        return None
    if isinstance(op, Blockwise):
        new_node = Blockwise(newton, signature=op.signature).make_node(*node.inputs)
    else:
        new_node = newton.make_node(*node.inputs)
    for old, new in zip(node.outputs, new_node.outputs, strict=True):
        new.name = old.name
    return new_node.outputs


register_specialize(_scalar_solver, name=SCALAR_REWRITE)


def _build_scalar_newton(op: SolverOp) -> NewtonOp | None:
    if type(op) not in (MinimizeOp, RootOp) or not op.jac or op.n_extras:
        return None
    if op.n_controls != 1 or static_size(op.problem.inner_xs[0]) != 1:
        return None
    options = _newton_options(op)
    if options is None:
        return None
    condition = dataclasses.replace(op.condition, structure=LinearStructure("diagonal"))
    try:
        condition.jacobian()  # the Newton step's derivative: built here so a failure keeps `op`
    except _GRADIENT_ERRORS:
        return None
    if isinstance(op, MinimizeOp):
        return NewtonOp.minimizing(op.problem, condition, op.value, **options)
    return NewtonOp.solving(op.problem, condition, value=op.value, **options)


def _newton_options(op: SolverOp) -> dict | None:
    """Newton's tol and max_iter from the Op's scipy options, or None if they do not carry over."""
    options = dict(op.options)
    if isinstance(op, RootOp):
        return {"tol": DEFAULT_TOL, "max_iter": DEFAULT_MAX_ITER} if not options else None
    inner = dict(options.pop("options", None) or {})
    tol = options.pop("tol", None)
    if options or set(inner) - _CARRIED_MINIMIZE_OPTIONS:
        return None  # e.g. a callback or a trace: the user wants scipy's own iterations
    tolerances = [t for t in (tol, inner.get("gtol")) if t is not None]
    tol = float(min(tolerances)) if tolerances else DEFAULT_TOL
    max_iter = int(inner.get("maxiter", DEFAULT_MAX_ITER))
    if not tol > 0 or max_iter < 1:
        return None  # scipy would take these; Newton's own validation would refuse them
    return {"tol": tol, "max_iter": max_iter}
