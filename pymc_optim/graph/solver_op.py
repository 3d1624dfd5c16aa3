"""The base solver Op: inner graph, node construction, pickling, the shared implicit gradient."""

from __future__ import annotations

import copy
import threading
from collections.abc import Sequence

import numpy as np
import pytensor
import pytensor.tensor as pt
from pytensor.compile.mode import Mode, get_mode
from pytensor.gradient import DisconnectedType, NullTypeGradError
from pytensor.graph.basic import Apply, Variable, equal_computations
from pytensor.graph.fg import FunctionGraph
from pytensor.graph.op import HasInnerGraph, Op
from pytensor.graph.replace import graph_replace
from pytensor.raise_op import CheckAndRaise
from pytensor.tensor.type import TensorType
from pytensor.tensor.variable import TensorVariable

from pymc_optim.graph import trace as _trace
from pymc_optim.graph.inner_graph import InnerProblem
from pymc_optim.graph.status import SolverStatus
from pymc_optim.implicit import OptimalityCondition, differentiated_elsewhere, implicit_pullback

__all__ = [
    "INNER_REWRITES",
    "INVALID_PARAMETERS",
    "NOT_INVALID_PARAMETERS",
    "ProblemUndefined",
    "SolverOp",
    "solve_state",
    "graph_call",
    "inner_mode",
    "make_solution",
]

#: What evaluating a problem's graph raises where the problem is undefined at the inputs it was
#: given: PyMC's parameter checks (ParameterValueError, a ValueError) and PyTensor's `Assert`
#: (AssertionError), a singular or indefinite matrix of the user's linear algebra (LinAlgError),
#: floating-point errors, and sizes known only at run time that disagree (numpy's and PyTensor's
#: shape checks raise ValueError). The classes of the graph's own `CheckAndRaise` Ops are added
#: per Op (`SolverOp.graph_errors`). Only an error raised *by the graph* counts (`graph_call`):
#: the same classes raised by the solver's own code, and any other class, propagate as bugs.
INVALID_PARAMETERS = (ValueError, AssertionError, ArithmeticError, np.linalg.LinAlgError)
#: ... except these, which say that an Op was misused rather than that the inputs are invalid
#: (numpy's AxisError is a ValueError and an IndexError).
NOT_INVALID_PARAMETERS = (np.exceptions.AxisError,)


class ProblemUndefined(Exception):
    """The problem's graph raised one of its `SolverOp.graph_errors` (the original error is the
    ``__cause__``), or its sizes disagree at run time: there is no solution at these inputs, and
    the solve fails with status `SolverStatus.INVALID_PARAMETERS` instead of raising."""


def graph_call(fn, errors: tuple = INVALID_PARAMETERS):
    """`fn` (a compiled inner function) whose `errors` raise as `ProblemUndefined`: the one
    boundary at which an exception is known to come from the problem's graph."""

    def call(*args):
        try:
            return fn(*args)
        except NOT_INVALID_PARAMETERS:
            raise
        except errors as err:
            raise ProblemUndefined(f"{type(err).__name__}: {err}") from err

    return call


#: Rewrites every backend applies to a solver's inner graphs on top of its own mode: PyMC's
#: parameter checks in a log density (``CheckParameterValue``: `sigma > 0`, `mu > 0`) give −inf
#: instead of raising, as PyMC compiles a model's logp. A Newton trial step into exp(u) = 0 made
#: pm.NegativeBinomial's `mu > 0` check raise, which ended the whole solve as invalid (and, at a
#: point pm.sample had accepted from another start, crashed sampling with "Bad initial
#: energy"); as −inf it is a rejected step, and the line search backtracks.
INNER_REWRITES = ("local_check_parameter_to_ninf_switch",)


def inner_mode(mode=None) -> Mode:
    """`mode` (default: PyTensor's default mode) with `INNER_REWRITES`."""
    return get_mode(mode).including(*INNER_REWRITES)


class SolverOp(Op, HasInnerGraph):
    """A numerical solve whose solution is differentiated by the shared implicit rule.

    Inputs are ``[*x0s, *params, *extras]``: initial guesses (one per control), the parameters
    found in the user's graph (the inner graph's inputs besides x), and solver-only inputs such as
    a bracket, which the solution does not depend on locally. Outputs are
    ``[*x_stars, success, n_iterations, n_evaluations, status]``, `status` a `SolverStatus` code.

    Subclasses say *what is solved* (`condition`, `value`, the compiled functions they need) and
    implement `solve` with a numerical backend.

    PyTensor's Op contract: an Op is immutable once built. Two Ops are equal when they are of
    one type, their `__props__` (the options, by value) are equal and their inner graphs compute
    the same thing (`equal_computations` on `inner_expressions`, inner inputs matched by
    position), so equal applications merge and `clone` is equal to its original. What a solve
    keeps for the next one (a warm start, chord steps) is held per compiled node and thread
    (`solve_state`), never on the Op; the compiled inner functions are a cache of the Op's own
    graphs (as PyTensor's optimize Ops keep theirs), shared by every node of it.
    """

    #: The options that define the solve besides its inner graph, compared by value; each
    #: subclass lists its own (and keeps this class's equality, `__init_subclass__`).
    __props__ = ("n_extras",)
    #: Attributes that cache what the inner graph determines (compiled on first use, read off
    #: the graph): never pickled, and the only attributes that change after ``__init__``.
    CACHES = ("_compiled", "_fgraph", "_graph_errors", "_parameter_checks", "_connected", "_direct")
    #: The props that change how the solve runs, not the inner functions it compiles.
    LOOP_OPTIONS: tuple[str, ...] = ("n_extras",)

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        if "__props__" in cls.__dict__:
            # PyTensor's MetaType wrote props-only methods, blind to the inner graph
            cls.__eq__, cls.__hash__ = SolverOp.__eq__, SolverOp.__hash__
            cls.__str__ = SolverOp.__str__

    def __init__(
        self,
        problem: InnerProblem,
        *,
        condition: OptimalityCondition | None = None,
        n_extras: int = 0,
    ):
        self.problem = problem
        self._condition = condition
        self.n_controls = len(problem.inner_xs)
        self.n_params = len(problem.inner_params)
        self.n_extras = n_extras
        self._compiled: dict[int, dict] = {}

    # --- what is solved (subclasses) -------------------------------------------------------
    @property
    def condition(self) -> OptimalityCondition:
        """F(x, θ) = 0 at the solution, on the inner variables (given to ``__init__``, or
        built by a subclass that overrides this property)."""
        if self._condition is None:
            raise NotImplementedError(f"{type(self).__name__} defines no optimality condition.")
        return self._condition

    @property
    def value(self) -> TensorVariable:
        """The scalar reported as ``solution_info(x_star).value``, on the inner variables: the
        residual norm ‖F‖₂ unless a subclass reports something else (an objective)."""
        return self.condition.residual_norm()

    def numerical_functions(self) -> dict[str, tuple[list, list[TensorVariable]]]:
        """Named ``(more_inputs, outputs)`` pairs of inner expressions the backend evaluates.

        Each is compiled once, lazily, into a function of ``(*xs, *more_inputs, *params)``.
        """
        raise NotImplementedError

    def solve(self, fns: dict, x0s: list[np.ndarray], params: list, extras: list, state: dict):
        """Return ``(x_stars, success, n_iterations, n_evaluations, status)``, `status` a
        `SolverStatus` code; never raise on failure. `state` is what the solves of this
        compiled node keep for each other in this thread (`solve_state`).

        `fns` are the compiled inner functions through `guarded_functions`: an error raised by
        the problem's graph arrives as `ProblemUndefined`, which `perform` reports as a failed
        solve; anything else a solver raises propagates."""
        raise NotImplementedError

    # --- inner graph (PyTensor's HasInnerGraph: dprint and graph tools see it) ------------------
    @property
    def inner_inputs(self) -> list[Variable]:
        """The inner controls, then the inner parameters (matching the node's first inputs)."""
        return [*self.problem.inner_xs, *self.problem.inner_params]

    @property
    def inner_outputs(self) -> list[Variable]:
        """The user's expressions on the inner variables (objective, equations or update)."""
        return list(self.problem.inner_outputs)

    @property
    def fgraph(self) -> FunctionGraph:
        """The inner graph as a FunctionGraph (built on first use; not pickled)."""
        fgraph = self.__dict__.get("_fgraph")
        if fgraph is None:
            fgraph = FunctionGraph(self.inner_inputs, self.inner_outputs, clone=False)
            self.__dict__["_fgraph"] = fgraph
        return fgraph

    @property
    def fn(self):
        """A compiled inner function of this thread (the first of `numerical_functions`)."""
        return next(iter(self._compiled_functions().values()))

    def inner_expressions(self) -> list[Variable]:
        """Every inner expression the solve evaluates, on `inner_inputs`: what equality
        compares. The user's outputs and the optimality condition; subclasses add theirs."""
        found = list(self.problem.inner_outputs)
        if self._condition is not None:
            found += [*self._condition.residual, *self._condition.parts]
        return found

    def __eq__(self, other):
        if self is other:
            return True
        if type(self) is not type(other) or not _same(self._props(), other._props()):
            return False
        layouts = [
            None if c is None else (c.structure, c.symmetric)
            for c in (self._condition, other._condition)
        ]
        if layouts[0] != layouts[1]:
            return False
        return equal_computations(
            self.inner_expressions(),
            other.inner_expressions(),
            self.inner_inputs,
            other.inner_inputs,
        )

    def __hash__(self):
        # (options that do not hash, a scipy `options` dict, are left to __eq__)
        props = tuple(_hashable(value) for value in self._props())
        return hash((type(self), props, tuple(var.type for var in self.inner_inputs)))

    def clone(self) -> SolverOp:
        """A copy of this Op with its own inner graph (fresh variables throughout), equal to it.

        PyTensor shares inner-graph Ops when it clones a graph; this is for callers that want a
        copy they own. The copy starts without compiled functions or traces."""
        twin = object.__new__(type(self))
        twin.__dict__.update(copy.deepcopy(self.__getstate__()))
        return twin

    def replace(self, **options) -> SolverOp:
        """This Op with other values of some of its `__props__`: a new Op sharing this one's
        inner graph (this one is unchanged), and its compiled inner functions when only
        `LOOP_OPTIONS` change."""
        unknown = sorted(set(options) - set(self.__props__))
        if unknown:
            raise ValueError(
                f"`replace` takes options of {type(self).__name__} ({', '.join(self.__props__)}"
                f"); got {', '.join(unknown)}."
            )
        # (not copy.copy, which goes through __getstate__ and so drops the caches)
        twin = object.__new__(type(self))
        twin.__dict__.update(self.__dict__)
        if not set(options) <= set(self.LOOP_OPTIONS):
            twin.__dict__.pop("_direct", None)
            twin._compiled = {}
        twin.__dict__.update(options)
        return twin

    # --- Op interface ------------------------------------------------------------------------
    def make_node(self, *inputs) -> Apply:
        expected = self.n_controls + self.n_params + self.n_extras
        if len(inputs) != expected:
            raise TypeError(f"{type(self).__name__} expects {expected} inputs, got {len(inputs)}.")
        x0s = [
            _compatible(inner, pt.as_tensor_variable(x0))
            for inner, x0 in zip(self.problem.inner_xs, inputs[: self.n_controls], strict=True)
        ]
        # Parameters keep their own types (PyMC graphs have boolean scalars, not only tensors).
        params = [
            _compatible(inner, p)
            for inner, p in zip(
                self.problem.inner_params,
                inputs[self.n_controls : self.n_controls + self.n_params],
                strict=True,
            )
        ]
        extras = [pt.as_tensor_variable(e) for e in inputs[self.n_controls + self.n_params :]]
        # x* takes x0's type: static shapes known outside stay known (JAX needs them).
        outputs = [x0.type() for x0 in x0s] + [
            pt.scalar(dtype="bool"),
            pt.scalar(dtype="int64"),
            pt.scalar(dtype="int64"),
            pt.scalar(dtype="int64"),  # status
        ]
        return Apply(self, [*x0s, *params, *extras], outputs)

    def infer_shape(self, node, input_shapes):
        return [*input_shapes[: self.n_controls], (), (), (), ()]

    def typed_inner_inputs(self, node: Apply, shapes=None) -> tuple[list[Variable], list[Variable]]:
        """Stand-ins for the inner controls and parameters with the static types of `node`'s inputs.

        Shapes known outside (e.g. the size of x, which a dense Jacobian's identity matrix needs)
        then become constants of the inner graphs, as the JAX and numba backends require.
        `shapes` (one per input, e.g. those JAX traces with) fills in what the types leave
        unknown.
        """
        n_inner = self.n_controls + self.n_params
        types = [outer.type for outer in node.inputs[:n_inner]]
        if shapes is not None:
            types = [
                t.clone(shape=shape) if isinstance(t, TensorType) else t
                for t, shape in zip(types, shapes, strict=True)
            ]
        typed = [t() for t in types]
        return typed[: self.n_controls], typed[self.n_controls :]

    def inner_on(self, xs, params, outputs) -> list[Variable]:
        """`outputs` of the inner graph written on the stand-ins `xs` and `params`."""
        inner = [*self.problem.inner_xs, *self.problem.inner_params]
        replace = dict(zip(inner, [*xs, *params], strict=True))
        return graph_replace(list(outputs), replace, strict=False)

    def _compiled_functions(self) -> dict:
        """The inner functions, one set per thread (a PyTensor function holds its own input
        and output storage, so threads, e.g. nutpie's chains, must not share one): compiled in
        the first thread, copies (`Function.copy`, own storage, no compilation) in the others."""
        compiled = self._compiled.get(threading.get_ident())
        if compiled is None and self._compiled:
            first = list(self._compiled.values())[0]
            compiled = {name: _thread_copy(fn) for name, fn in first.items()}
            self._compiled[threading.get_ident()] = compiled
        if compiled is None:
            compiled = {
                name: pytensor.function(
                    [*self.problem.inner_xs, *more_inputs, *self.problem.inner_params],
                    outs,
                    mode=inner_mode(),
                    on_unused_input="ignore",
                    trust_input=True,
                )
                for name, (more_inputs, outs) in self.numerical_functions().items()
            }
            self._compiled[threading.get_ident()] = compiled
        return compiled

    @property
    def graph_errors(self) -> tuple[type[Exception], ...]:
        """What evaluating this problem's graph may raise where the problem is undefined:
        `INVALID_PARAMETERS` and the classes of the graph's `CheckAndRaise` Ops."""
        found = self.__dict__.get("_graph_errors")
        if found is None:
            raised = {node.op.exc_type for node in _raising_nodes(self.inner_outputs)}
            found = (*INVALID_PARAMETERS, *sorted(raised - set(INVALID_PARAMETERS), key=str))
            self.__dict__["_graph_errors"] = found
        return found

    @property
    def parameter_checks(self) -> list[int]:
        """The inner parameters that are conditions of PyMC's parameter checks in the graph
        (those `INNER_REWRITES` make −inf): where one is false, the problem is undefined at
        every x, and every backend reports the solve as failed with status
        `SolverStatus.INVALID_PARAMETERS`, whatever its loop found."""
        found = self.__dict__.get("_parameter_checks")
        if found is None:
            index = {var: i for i, var in enumerate(self.problem.inner_params)}
            found = sorted(
                {
                    index[condition]
                    for node in _raising_nodes(self.inner_outputs)
                    if getattr(node.op, "can_be_replaced_by_ninf", False)
                    for condition in node.inputs[1:]
                    if condition in index
                }
            )
            self.__dict__["_parameter_checks"] = found
        return found

    def failed_checks(self, params, shape: tuple) -> np.ndarray | None:
        """Per problem (`shape`, as `success`): whether a `parameter_checks` condition is
        false in `params`; None where the graph has no such check."""
        if not self.parameter_checks:
            return None
        failed = np.zeros(shape, dtype=bool)
        for i in self.parameter_checks:
            condition = np.asarray(params[i])
            if shape and condition.shape[: len(shape)] == shape:  # one per problem
                failed |= ~condition.reshape(*shape, -1).all(axis=-1)
            else:
                failed |= not condition.all()
        return failed

    def guarded_functions(self, fns: dict) -> dict:
        """`fns` as `solve` calls them: each through `graph_call`. An Op whose `solve` makes
        the calls through a boundary of its own (`NewtonOp`'s `direct_call`) returns `fns`."""
        errors = self.graph_errors
        return {name: graph_call(fn, errors) for name, fn in fns.items()}

    @property
    def trace_limit(self) -> int:
        """How many solves to record (0: none), from ``optimizer_kwargs["trace"]``."""
        return _trace.trace_limit(getattr(self, "options", None))

    def perform(self, node, inputs, output_storage):
        x0s = inputs[: self.n_controls]
        params = inputs[self.n_controls : self.n_controls + self.n_params]
        extras = inputs[self.n_controls + self.n_params :]
        fns = self.guarded_functions(self._compiled_functions())
        recorder = _trace.Recorder(fns, self.n_controls) if self.trace_limit else None
        try:
            x_stars, success, n_iterations, n_evaluations, status = self.solve(
                fns if recorder is None else recorder.fns,
                list(x0s),
                list(params),
                list(extras),
                solve_state(node),
            )
        except ProblemUndefined as err:
            # e.g. a size known only at run time that disagrees, or a raising Op of the user's
            # graph (PyMC's parameter checks are −inf, `INNER_REWRITES`): the problem has no
            # solution at these parameters, which is data, not a crash. Errors of the solver's
            # own code are not caught: they are bugs.
            x_stars = [np.full(np.shape(x0), np.nan) for x0 in x0s]
            success, n_iterations, n_evaluations = False, -1, -1
            status = SolverStatus.INVALID_PARAMETERS
            _trace.note(str(err))
        shape = self.diagnostics_shape(x0s)
        failed = self.failed_checks(params, shape)
        if failed is not None and failed.any():
            success = np.asarray(success, dtype=bool) & ~failed
            status = np.where(failed, SolverStatus.INVALID_PARAMETERS, status).astype("int64")
        if recorder is not None:
            solve = recorder.finish(
                params, x0s, x_stars, success, n_iterations, n_evaluations, status
            )
            _trace.trace_store(self, self.trace_limit).append(solve)
        for storage, x, inner in zip(output_storage, x_stars, self.problem.inner_xs, strict=False):
            storage[0] = np.asarray(x, dtype=inner.type.dtype).reshape(np.shape(x))
        diagnostics = [(success, "bool"), (n_iterations, "int64"), (n_evaluations, "int64")]
        for i, (value, dtype) in enumerate([*diagnostics, (status, "int64")]):
            ready = isinstance(value, np.ndarray) and value.dtype == dtype
            if not (ready and value.shape == shape):
                # (the Newton solves return them ready: fresh arrays, stored as they are)
                value = np.asarray(value, dtype="bool") if i == 0 else _count(value)
                value = np.array(np.broadcast_to(value, shape))
            output_storage[self.n_controls + i][0] = value

    def diagnostics_shape(self, x0s) -> tuple:
        """The shape of `success` and the counters: () (one problem); batch-shaped for an Op
        that solves a stack of problems and reports per problem."""
        return ()

    def connection_pattern(self, node):
        # x* depends on the continuous parameters only (not on x0 or a bracket: the solution is
        # locally constant in them); success and the counters are piecewise constant.
        n_out = self.n_controls + 4
        return [
            [self._is_differentiable_param(i, var) and j < self.n_controls for j in range(n_out)]
            for i, var in enumerate(node.inputs)
        ]

    def _is_differentiable_param(self, index: int, var: Variable) -> bool:
        is_param = self.n_controls <= index < self.n_controls + self.n_params
        return (
            is_param
            and var.type.dtype.startswith("float")
            and self._residual_connected()[index - self.n_controls]
        )

    def _residual_connected(self) -> list[bool]:
        """Per inner parameter: False where the implicit rule sends it no gradient
        (`pymc_optim.implicit.differentiated_elsewhere`), True elsewhere (exact zeros where F
        does not depend on it)."""
        found = self.__dict__.get("_connected")
        if found is None:
            found = [not e for e in differentiated_elsewhere(self.condition)]
            if len(found) != self.n_params:  # (a condition on other parameters: assume all)
                found = [True] * self.n_params
            self.__dict__["_connected"] = found
        return found

    def pullback(self, inputs, outputs, output_grads):
        x_stars = outputs[: self.n_controls]
        params = inputs[self.n_controls : self.n_controls + self.n_params]
        disconnected = [DisconnectedType()() for _ in range(self.n_controls)]
        extras = [DisconnectedType()() for _ in range(self.n_extras)]
        x_grads = output_grads[: self.n_controls]
        if all(isinstance(g.type, DisconnectedType) for g in x_grads):
            return [*disconnected, *(DisconnectedType()() for _ in params), *extras]
        try:
            param_grads = implicit_pullback(
                self.condition, x_stars, params, x_grads, disconnected=True
            )
        except NullTypeGradError as err:  # e.g. pt.prod, whose gradient PyTensor cannot derive
            raise NotImplementedError(
                "The gradient of this solution with respect to its parameters solves with the "
                "Jacobian of its optimality condition (the objective's Hessian for `minimize`), "
                f"which cannot be built: {err}. Keep this solution out of gradients (e.g. sample "
                "with a gradient-free step such as `pm.Slice`), or write the problem with "
                "twice-differentiable operations (pt.exp(pt.log(x).sum()) for a product of "
                "positive x)."
            ) from err
        param_grads = [
            g if self._is_differentiable_param(self.n_controls + i, p) else DisconnectedType()()
            for i, (g, p) in enumerate(zip(param_grads, params, strict=True))
        ]
        return [*disconnected, *param_grads, *extras]

    def __getstate__(self):
        state = {k: v for k, v in self.__dict__.items() if k not in self.CACHES}
        state["_compiled"] = {}  # compiled functions do not pickle; recompiled on first use
        return state

    def __str__(self):
        return f"{type(self).__name__}{{method={getattr(self, 'method', '?')}}}"


def solve_state(node: Apply) -> dict:
    """What the solves of `node` (an Apply of a compiled function: PyTensor clones a graph it
    compiles, so each compiled function has its own) keep for each other in the calling thread.
    Starts empty; a copy of the function (``Function.copy``) shares it, by thread as well, and a
    pickled one starts empty."""
    states = node.tag.__dict__.get("solve_state")
    if states is None:
        states = node.tag.__dict__.setdefault("solve_state", _SolveStates())
    return states.setdefault(threading.get_ident(), {})


class _SolveStates(dict):
    """Thread id → `solve_state`; pickled empty (the states belong to this process)."""

    def __reduce__(self):
        return (_SolveStates, ())


def _same(a, b) -> bool:
    """a == b for option values, arrays and containers of them included."""
    if type(a) is not type(b):
        return False
    if isinstance(a, tuple | list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, np.ndarray):
        return a.shape == b.shape and a.dtype == b.dtype and bool(np.all(a == b))
    return bool(a == b)


def _hashable(value):
    """`value`, or None where it does not hash."""
    try:
        hash(value)
    except TypeError:
        return None
    return value


def _raising_nodes(outputs):
    """The `CheckAndRaise` nodes of the graph of `outputs`, inner graphs (OpFromGraph, Scan)
    included."""
    pending, seen = list(outputs), set()
    while pending:
        var = pending.pop()
        node = getattr(var, "owner", None)
        if node is None or node in seen:
            continue
        seen.add(node)
        if isinstance(node.op, CheckAndRaise):
            yield node
        if isinstance(node.op, HasInnerGraph):
            pending.extend(node.op.inner_outputs)
        pending.extend(node.inputs)


def _thread_copy(fn):
    """`fn.copy()` (own storage, no compilation) for another thread, with `fn`'s
    ``trust_input``, which `Function.copy` does not carry over (`direct_call` needs it)."""
    copied = fn.copy()
    copied.trust_input = fn.trust_input
    return copied


def _count(n) -> np.ndarray:
    """An iteration or evaluation count as int64; -1 where the solver gives none (scipy's
    root_scalar reports NaN iterations when the equation is NaN at a bracket end)."""
    n = np.asarray(n, dtype="float64")
    return np.where(np.isfinite(n), n, -1).astype("int64")


def _compatible(inner: Variable, outer: Variable) -> Variable:
    """`outer`, converted to `inner`'s type only if needed (keeping a more precise static shape)."""
    if inner.type.is_super(outer.type):
        return outer
    return inner.type.filter_variable(outer, allow_convert=True)


def make_solution(
    op: SolverOp,
    x0s: Sequence[Variable],
    extras: Sequence[Variable],
    is_list: bool,
):
    """Apply `op` and return ``(x_star, success)`` shaped like the user's `x`."""
    outs = op(*x0s, *op.problem.outer_params, *extras)
    x_stars = list(outs[: op.n_controls])
    success = outs[op.n_controls]
    for x_star, inner in zip(x_stars, op.problem.inner_xs, strict=True):
        if inner.name:
            x_star.name = f"{inner.name}_star"
    return (x_stars if is_list else x_stars[0]), success
