"""Numba backend: the graph-native loops compiled with numba, no object mode.

Imported by the package only when numba is installed; registers numba implementations of
`NewtonOp` and `FixedPointOp` (methods ``"iteration"`` and ``"anderson"``) so that
``pytensor.function(..., mode="NUMBA")`` and nutpie, which compiles PyMC models with numba, run
the graph-native solvers natively instead of calling ``perform`` in numba's object mode. The
scipy-backed Ops keep pytensor's object-mode fallback.

The loops are those of :mod:`pymc_optim.backends.iterations` line for line (same constants, stopping
rules, success and counters), on the flat float64 vector z, and they call the Op's inner graphs
compiled by pytensor's numba backend: ``system(z) -> (merit, F, A)`` and ``merit(z)`` for
Newton, ``update(z) -> T(z)`` for fixed points.

* Controls are packed into z and unpacked with the runtime shapes of the initial guesses; the
  parameters are passed through untouched. The adapters are generated as source for the Op's
  numbers of controls, parameters and extras (as pytensor does for Scan and OpFromGraph).
* Newton directions: ``diagonal`` divides element-wise after an explicit test for a zero entry;
  ``dense`` and ``block_diagonal`` run pytensor's numba ``Solve`` (LAPACK getrf + getrs, one
  per block), which returns NaN when getrf reports an exactly zero pivot. That is the criterion
  under which ``numpy.linalg.solve`` raises ``LinAlgError`` (gesv = getrf + getrs), so a
  singular system takes the same branch as in the numpy loop: for minimization the step falls
  back to −F, for root finding the solve stops with ``success=False``.
* Nothing raises out of the loop. As in ``SolverOp.perform``, an exception from the inner graphs
  (e.g. PyMC's parameter checks) is caught and reported as NaN solutions with
  ``success=False`` and counters −1.
"""

from __future__ import annotations

import functools
import inspect
from hashlib import sha256
from pathlib import Path

import numpy as np
import pytensor.tensor as pt
from pytensor.compile.function.types import add_supervisor_to_fgraph, insert_deepcopy
from pytensor.compile.io import In, Out
from pytensor.compile.mode import NUMBA
from pytensor.graph.fg import FunctionGraph
from pytensor.link.numba.cache import compile_numba_function_src
from pytensor.link.numba.dispatch.basic import (
    numba_funcify_and_cache_key,
    numba_njit,
    register_funcify_and_cache_key,
)

from pymc_optim.backends import iterations as _iterations
from pymc_optim.backends.fixed_point import FixedPointOp
from pymc_optim.backends.iterations import ARMIJO, MAX_BACKTRACKS, ROUNDING, STEP_TOL
from pymc_optim.backends.newton import NewtonOp
from pymc_optim.graph.solver_op import SolverOp
from pymc_optim.linalg.structure import LinearStructure

__all__: list[str] = []

#: The loops compare floats exactly as numpy does: no fast-math reassociation in them.
_njit = functools.partial(numba_njit, fastmath=False)

#: Anderson's memory, the default of the numpy loop.
_ANDERSON_MEMORY = inspect.signature(_iterations.anderson).parameters["memory"].default

#: Part of every cache key: a change to this module invalidates numba's on-disk cache.
_SOURCE_KEY = sha256(Path(__file__).read_bytes()).hexdigest()


# --- inner graphs ------------------------------------------------------------------------------
def _numba_function(inputs, outputs):
    """A numba function of `inputs` returning the tuple of `outputs`, and its cache key.

    Rewritten and protected exactly as pytensor compiles an OpFromGraph's inner graph.
    """
    fgraph = FunctionGraph(list(inputs), list(outputs), clone=True)
    input_specs = [In(x, borrow=True, mutable=False) for x in fgraph.inputs]
    add_supervisor_to_fgraph(fgraph=fgraph, input_specs=input_specs, accept_inplace=True)
    NUMBA.optimizer(fgraph)
    output_specs = [Out(o, borrow=False) for o in fgraph.outputs]
    insert_deepcopy(fgraph, wrapped_inputs=input_specs, wrapped_outputs=output_specs)
    return numba_funcify_and_cache_key(fgraph, squeeze_output=False, fgraph_name="pymc_optim_inner")


@functools.cache
def _solve_function(structure: LinearStructure):
    """d = A⁻¹ F with A compact in `structure`, NaN where LAPACK finds A singular.

    One per structure and process: numba compiles it once for all the Ops that use it.
    """
    if structure.kind == "diagonal":
        return _solve_diagonal, "diagonal"
    ndim = {"dense": 2, "block_diagonal": 3}[structure.kind]
    A = pt.tensor("A", dtype="float64", shape=(None,) * ndim)
    F = pt.vector("F", dtype="float64")
    d = structure.solve(A, F, transposed=False, symmetric=False)
    solve_fn, key = _numba_function([A, F], [d])

    @_njit
    def solve(A, F):
        return solve_fn(A, F)[0]

    return solve, key


# --- numerical helpers (same arithmetic as the numpy loops) ---------------------------------------
@_njit
def _max_abs(v):
    """``np.max(np.abs(v), initial=0.0)``, NaN if v holds a NaN."""
    out = 0.0
    for i in range(v.size):
        a = abs(v[i])
        if np.isnan(a):
            return np.nan
        if a > out:
            out = a
    return out


@_njit
def _all_finite(v):
    for i in range(v.size):
        if not np.isfinite(v[i]):
            return False
    return True


@_njit
def _solve_diagonal(A, F):
    """F / A, or NaN when a diagonal entry is zero (where the numpy loop raises)."""
    for i in range(A.size):
        if A[i] == 0.0:
            return np.full(F.size, np.nan)
    return F / A


@_njit
def _newton_step_is_negligible(d, z, slope, m, minimization):
    """`_iterations.newton_step_is_negligible`."""
    tiny_step = _max_abs(d) <= STEP_TOL * (1.0 + _max_abs(z))
    unseen_decrease = minimization and -slope <= ROUNDING * (1.0 + abs(m))
    return tiny_step or unseen_decrease


# --- the loops of `_iterations`, closed over the problem's compiled functions ---------------------
def _newton_loop(system, merit, solve, *, minimization: bool, tol: float, max_iter: int):
    @_njit
    def newton(z, args):
        m, F, A = system(z, args)
        n_evaluations = 1
        for iteration in range(max_iter + 1):
            if not (np.isfinite(m) and _all_finite(F)):
                return z, False, iteration, n_evaluations
            if _max_abs(F) <= tol:
                return z, True, iteration, n_evaluations
            if iteration == max_iter:
                break
            d = -solve(A, F)  # NaN when A is singular
            if minimization:
                slope = np.dot(F, d)
                is_newton_step = np.isfinite(slope) and slope < 0
                if not is_newton_step:
                    d = -F
                    slope = -np.dot(F, F)
            elif not _all_finite(d):
                return z, False, iteration, n_evaluations
            else:
                slope = -2.0 * m
                is_newton_step = True
            if is_newton_step and _newton_step_is_negligible(d, z, slope, m, minimization):
                return z + d, True, iteration + 1, n_evaluations
            t = 1.0
            accepted = False
            for _ in range(MAX_BACKTRACKS):
                trial = merit(z + t * d, args)
                n_evaluations += 1
                if trial <= m + ARMIJO * t * slope:  # False for NaN: keep halving
                    accepted = True
                    break
                t *= 0.5
            if not accepted:
                return z, False, iteration, n_evaluations
            z = z + t * d
            m, F, A = system(z, args)
            n_evaluations += 1
        return z, False, max_iter, n_evaluations

    return newton


def _fixed_point_loop(update, *, tol: float, max_iter: int):
    @_njit
    def fixed_point_iteration(z, args):
        for iteration in range(1, max_iter + 1):
            z_new = update(z, args)
            if not _all_finite(z_new):
                return z, False, iteration, iteration
            if _max_abs(z_new - z) <= tol:
                return z_new, True, iteration, iteration
            z = z_new
        return z, False, max_iter, max_iter

    return fixed_point_iteration


def _anderson_loop(update, *, tol: float, max_iter: int, memory: int = _ANDERSON_MEMORY):
    eps = np.finfo(np.float64).eps

    @_njit
    def anderson(z, args):
        n = z.size
        g = update(z, args) - z
        # the last `memory` differences as columns, oldest first (the numpy loop's lists)
        dZ = np.empty((n, memory))
        dG = np.empty((n, memory))
        k = 0
        for iteration in range(1, max_iter + 1):
            if not _all_finite(g):
                return z, False, iteration, iteration
            if _max_abs(g) <= tol:
                return z + g, True, iteration, iteration
            if k > 0:
                G = np.ascontiguousarray(dG[:, :k])
                Z = np.ascontiguousarray(dZ[:, :k])
                rcond = eps * max(n, k)  # numpy's rcond=None
                gamma = np.linalg.lstsq(G, g, rcond)[0]
                z_new = z + g - np.dot(Z + G, gamma)
            else:
                z_new = z + g
            g_new = update(z_new, args) - z_new
            if k == memory:
                dZ[:, :-1] = dZ[:, 1:].copy()
                dG[:, :-1] = dG[:, 1:].copy()
                k -= 1
            dZ[:, k] = z_new - z
            dG[:, k] = g_new - g
            k += 1
            z, g = z_new, g_new
        return z, False, max_iter, max_iter

    return anderson


# --- generated adapters: any number of controls, parameters and extras -------------------------
def _dtype(var) -> str:
    return f"np.{np.dtype(var.type.dtype).name}"


def _as_float64(expr: str, var) -> str:
    return expr if var.type.dtype == "float64" else f"{expr}.astype(np.float64)"


def _adapter_source(op: SolverOp, node, inner_outputs: dict) -> str:
    """Source of ``pack``, the inner-function adapters of ``(z, args)``, and ``solver``.

    ``solver(x0_0, ..., p_0, ..., e_0, ...)`` is the Op's numba function: it packs the initial
    guesses into z, runs ``loop(z, args)`` with ``args = (*x0s, *params)`` (the x0s give the
    controls' shapes back), and unpacks the solution. With two controls and one parameter::

        def system(z, args):
            x0 = args[0]; x1 = args[1]; p0 = args[2]
            u0 = np.empty(x0.shape, dtype=np.float64)
            for i in range(x0.size): u0.flat[i] = z[0 + i]
            u1 = ...  # from z[x0.size + i]
            r = system_fn(u0, u1, p0)
            return float(r[0].item()), r[1], r[2]

    Copies go element by element through ``.flat`` (any layout, 0-d included).
    """
    k, n_args = op.n_controls, op.n_controls + op.n_params
    xs = [f"x{i}" for i in range(k)]
    args = [*xs, *(f"p{i}" for i in range(op.n_params))]
    extras = [f"e{i}" for i in range(op.n_extras)]
    offsets = ["0"] + [" + ".join(f"{x}.size" for x in xs[: i + 1]) for i in range(k)]
    get_args = [f"    {name} = args[{i}]" for i, name in enumerate(args)]

    def unpack(dtypes):
        lines = []
        for i, (x, dtype) in enumerate(zip(xs, dtypes, strict=True)):
            lines += [
                f"    u{i} = np.empty({x}.shape, dtype={dtype})",
                f"    for i in range({x}.size):",
                f"        u{i}.flat[i] = z[{offsets[i]} + i]",
            ]
        return lines

    lines = ["def pack(args):", *get_args[:k], f"    z = np.empty({offsets[k]}, dtype=np.float64)"]
    for i, x in enumerate(xs):
        lines += [f"    for i, v in enumerate({x}.flat):", f"        z[{offsets[i]} + i] = v"]
    lines.append("    return z")

    call = f"({', '.join([*(f'u{i}' for i in range(k)), *args[k:n_args]])})"
    control_dtypes = [_dtype(x) for x in node.inputs[:k]]
    for name, outputs in inner_outputs.items():
        lines += [f"def {name}(z, args):", *get_args, *unpack(control_dtypes)]
        lines.append(f"    r = {name}_fn{call}")
        if name == "system":
            F, A = (_as_float64(f"r[{i}]", out) for i, out in [(1, outputs[1]), (2, outputs[2])])
            lines.append(f"    return float(r[0].item()), {F}, {A}")
        elif name == "merit":
            lines.append("    return float(r[0].item())")
        else:
            lines.append(f"    return {_as_float64('r[0]', outputs[0])}")

    out_dtypes = [_dtype(x) for x in node.outputs[:k]]
    failed = [f"np.full({x}.shape, np.nan, dtype={d})" for x, d in zip(xs, out_dtypes, strict=True)]
    solutions = [f"u{i}" for i in range(k)]
    lines += [
        f"def solver({', '.join([*args, *extras])}):",
        f"    args = ({', '.join(args)},)",
        "    try:",
        "        z, success, n_iterations, n_evaluations = loop(pack(args), args)",
        "    except Exception:  # as SolverOp.perform: invalid parameters fail the solve",
        f"        return ({', '.join(failed)}, np.asarray(False), "
        "np.asarray(np.int64(-1)), np.asarray(np.int64(-1)))",
        *unpack(out_dtypes),
        f"    return ({', '.join(solutions)}, np.asarray(success), "
        "np.asarray(np.int64(n_iterations)), np.asarray(np.int64(n_evaluations)))",
    ]
    return "\n".join(lines) + "\n"


def _adapters(op: SolverOp, node, inputs, inner_outputs: dict):
    """Compile the inner graphs of `inputs` and the generated adapters around them.

    Returns the adapters' namespace (``pack`` and one function per inner graph, njitted), their
    source and the inner graphs' cache keys.
    """
    env = {"np": np}
    keys = []
    for name, outputs in inner_outputs.items():
        env[f"{name}_fn"], key = _numba_function(inputs, outputs)
        keys.append(key)
    src = _adapter_source(op, node, inner_outputs)
    for name in ["pack", *inner_outputs]:
        env[name] = _njit(compile_numba_function_src(src, name, env))
    return env, src, keys


def _solver(op: SolverOp, env: dict, src: str, loop, keys: list, options: tuple):
    """The Op's numba function running `loop`, and its cache key (None if a part has none)."""
    env["loop"] = loop
    solver = _njit(compile_numba_function_src(src, "solver", env))
    if any(key is None for key in keys):
        return solver, None
    constants = (ARMIJO, MAX_BACKTRACKS, ROUNDING, STEP_TOL, _ANDERSON_MEMORY)
    parts = (type(op).__name__, _SOURCE_KEY, src, tuple(keys), constants, options)
    return solver, sha256(str(parts).encode()).hexdigest()


@register_funcify_and_cache_key(NewtonOp)
def _newton_numba(op: NewtonOp, node=None, **kwargs):
    xs, params = op.typed_inner_inputs(node)
    condition = op.condition.on(xs, params)
    (merit,) = op.inner_on(xs, params, [op.merit])
    F, A = condition.flat_residual(), condition.jacobian()
    env, src, keys = _adapters(
        op, node, [*xs, *params], {"system": [merit, F, A], "merit": [merit]}
    )
    structure = condition.structure
    solve, solve_key = _solve_function(structure)
    loop = _newton_loop(
        env["system"],
        env["merit"],
        solve,
        minimization=bool(op.minimization),
        tol=float(op.tol),
        max_iter=int(op.max_iter),
    )
    options = (op.minimization, op.tol, op.max_iter, structure.kind, structure.block_size)
    return _solver(op, env, src, loop, [*keys, solve_key], options)


@register_funcify_and_cache_key(FixedPointOp)
def _fixed_point_numba(op: FixedPointOp, node=None, **kwargs):
    xs, params = op.typed_inner_inputs(node)
    (update,) = op.inner_on(xs, params, [op.flat_update])
    env, src, keys = _adapters(op, node, [*xs, *params], {"update": [update]})
    make_loop = _anderson_loop if op.method == "anderson" else _fixed_point_loop
    loop = make_loop(env["update"], tol=float(op.tol), max_iter=int(op.max_iter))
    return _solver(op, env, src, loop, keys, (op.method, op.tol, op.max_iter))
