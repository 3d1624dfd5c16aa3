"""Graph-native Newton benchmark: the mode of Poisson random intercepts, solved and differentiated.

Run ``python benchmarks/bench_graph_native.py`` (full: 20-30 minutes on 2 cores, almost all of it
scipy's BFGS at G = 3000, a few minutes per call) or add ``--quick`` for a smoke run (fewer,
shorter repeats, one timed call of BFGS at G = 3000: still ~10 minutes; add ``--sizes 30 300``
for a one-minute run). ``--profile`` adds a cProfile of the Newton path at the largest G in each
mode (opaque for NUMBA and JAX, whose loops are compiled: see table 5 instead). This is a script,
not a test: it prints markdown tables and PASS/FAIL lines for the targets, and exits 0 whatever
the timings (1 only if a correctness check fails).

The problem
-----------
G latent intercepts u with 5 Poisson counts each, simulated once with a fixed seed
(mu = 0.5, sigma = 0.7). The inner problem is the mode of u given (mu, sigma),

    u*(mu, sigma) = argminᵤ −ℓ(u),
    ℓ(u) = Σ_g log N(u_g | 0, sigma) + Σ_i log Poisson(y_i | exp(mu + u_{group_i}))

with ℓ built from real PyMC log-density graphs (``pm.logp(pm.Normal.dist(0, sigma), u).sum() +
pm.logp(pm.Poisson.dist(pt.exp(mu + u[group])), y).sum()``). Its Hessian is diagonal,
h_g = 1/sigma² + Σ_{i in g} exp(mu + u_g). The timed function is one call of a compiled
``pytensor.function([mu, sigma], ...)`` returning the Laplace-style value

    L = ℓ(u*) − ½ Σ_g log h_g(u*)

and ``pt.grad(L, [mu, sigma])`` (through the implicit gradient of u*), at (mu, sigma) = (0.4, 0.6),
always from x0 = zeros. Besides L and its gradient the function returns u*, ``success`` and the
solver's iteration and evaluation counts, which the graph computes anyway, for the checks.

Contenders, all ``pmo.minimize`` on the same objective:

- **newton**: ``method="newton", structure="diagonal"``, graph-native damped Newton (tol 1e-8 on
  max|∇|), under the default C backend, ``mode="NUMBA"`` and ``mode="JAX"``. Each mode is also
  timed forward only (u* without the gradient) to split the solve from the gradient.
- **BFGS dense**: ``method="BFGS"`` with the default dense implicit solve (C backend).
- **BFGS diag**: ``method="BFGS", structure="diagonal"`` (C backend).

BFGS runs with ``gtol = 1e-9``. Whether scipy's BFGS gets there depends on G: its line search
may stop on "precision loss" (``success=False``) at max|∇| ~ 1e-7..1e-6, where the objective
(~1e2..1e4) no longer changes measurably along smaller steps. The check table reports success,
iterations and max|∇| for every G; where BFGS stops, u* still gives L and ∇L within the stated
tolerance of the reference.

Checks (before any timing)
--------------------------
An independent numpy reference: a tight (max|∇| ≤ 1e-12) Newton solve of the closed-form
gradient, L from ``scipy.stats`` log densities, and ∇L from the closed-form implicit derivative
(du*/dθ = −h⁻¹ ∂F/∂θ, elementwise). Stated tolerances, relative on (L, ∂L/∂mu, ∂L/∂sigma):
Newton in every mode 1e-9 against the reference and against Newton under C, whose u* it matches
within 2·tol·sigma² (each stops within tol / min h ≤ tol·sigma² of the exact mode); BFGS 1e-6
against the reference. Newton must report success and max|∇ₓ(−ℓ)(u*)| ≤ 1e-8;
BFGS's success flag and max|∇| are reported, not required. The modes may differ by an
iteration: near the solution the Armijo test compares merit values equal to rounding, which
each backend rounds its own way.

How it is timed
---------------
As in ``bench_foundation.py``: one BLAS thread (threadpoolctl), garbage collector off, batches of
``--batch`` seconds interleaved across *all* contenders and all G in one run (order alternating
between repeats), tables of median absolute times and medians of *paired* per-repeat ratios
(G = 3000 / G = 300 ratios are paired too). Compile time (``pytensor.function``) and the first
call (lazy compilation of the inner functions for C/NUMBA, numba's JIT of the outer graph, the
JAX trace + XLA compile) are reported separately and excluded from timings. BFGS at G = 3000 takes
minutes per call (scipy updates its dense inverse Hessian with two n × n matrix products per
iteration, O(n³)), so it runs one call per batch and only in the first ``--slow-repeats`` (≥ 3
unless ``--quick``) rounds; its ratios pair those rounds only.

Targets: newton (C) ≥ 10x faster than BFGS dense at G = 300 (BFGS diag reported alongside), and
time(G = 3000) / time(G = 300) ≤ 15 for newton; the same two numbers are judged for NUMBA and JAX.
"""

from __future__ import annotations

import os
import statistics
import sys
import time
import warnings
from collections.abc import Callable

import numpy as np
import pymc as pm
import pytensor
import pytensor.tensor as pt
import scipy
import scipy.stats
from _timing import (
    PROFILE_REPORTS,
    blas_threads,
    fmt_time,
    git_revision,
    paired_difference,
    profile,
    ratio,
    time_interleaved,
    timed,
    timing_parser,
)
from pytensor.graph.replace import graph_replace

import pymc_optim as pmo
from pymc_optim.backends.newton import NewtonOp

SIZES = (30, 300, 3000)
PER_GROUP = 5
MU_TRUE, SIGMA_TRUE = 0.5, 0.7
POINT = {"mu": 0.4, "sigma": 0.6}
GTOL = 1e-9
NEWTON_TOL = 1e-8  # pmo's default for method="newton"
#: (label, pytensor mode); None is the default mode (C backend)
MODES = (("C", None), ("NUMBA", "NUMBA"), ("JAX", "JAX"))
BFGS = {"BFGS dense": "dense", "BFGS diag": "diagonal"}
RTOL_NEWTON, RTOL_BFGS = 1e-9, 1e-6
SPEEDUP_TARGET, SPEEDUP_AT = 10.0, 300
SCALING_TARGET, SCALING_BIG, SCALING_SMALL = 15.0, 3000, 300
SLOW_G = 3000  # BFGS at this G (and above) gets the reduced repeats


# --- the problem --------------------------------------------------------------------------------
class LaplaceProblem:
    """The random-intercepts data for G groups, the PyMC graph of ℓ(u) and a numpy reference."""

    def __init__(self, G: int, seed: int):
        rng = np.random.default_rng(seed)
        self.G = G
        self.group = np.repeat(np.arange(G), PER_GROUP)
        u_true = rng.normal(0.0, SIGMA_TRUE, G)
        self.y = rng.poisson(np.exp(MU_TRUE + u_true[self.group]))
        self.counts = np.bincount(self.group, minlength=G).astype("float64")
        self.sums = np.bincount(self.group, weights=self.y, minlength=G)
        self.mu = pt.scalar("mu", dtype="float64")
        self.sigma = pt.scalar("sigma", dtype="float64")
        self.u = pt.vector("u", shape=(G,), dtype="float64")
        mu, sigma, u = self.mu, self.sigma, self.u
        self.joint = (
            pm.logp(pm.Normal.dist(0.0, sigma), u).sum()
            + pm.logp(pm.Poisson.dist(pt.exp(mu + u[self.group])), self.y).sum()
        )
        self.values = (np.array(POINT["mu"]), np.array(POINT["sigma"]))

    def graphs(self, method: str, structure: str):
        """(L, ∂L/∂mu, ∂L/∂sigma, u*, success, n_iterations, n_evaluations) and u* alone."""
        kwargs = {"options": {"gtol": GTOL}} if method == "BFGS" else None
        mu, sigma = self.mu, self.sigma
        u_star, success = pmo.minimize(
            -self.joint,
            self.u,
            x0=np.zeros(self.G),
            method=method,
            structure=structure,
            optimizer_kwargs=kwargs,
        )
        info = pmo.solution_info(u_star)
        hessian = 1.0 / sigma**2 + pt.constant(self.counts) * pt.exp(mu + u_star)
        loss = graph_replace(self.joint, {self.u: u_star}) - 0.5 * pt.log(hessian).sum()
        g_mu, g_sigma = pt.grad(loss, [mu, sigma])
        full = [loss, g_mu, g_sigma, u_star, success, info.n_iterations, info.n_evaluations]
        return full, [u_star, success]

    def gradient(self, u, mu, sigma):
        """∇ᵤ(−ℓ), closed form."""
        return u / sigma**2 + self.counts * np.exp(mu + u) - self.sums

    def reference(self, mu: float, sigma: float):
        """u*, L and (∂L/∂mu, ∂L/∂sigma) from numpy and scipy.stats alone."""
        u = np.zeros(self.G)
        for _ in range(200):  # separable Newton, steps clipped to ±1 far from the mode
            F = self.gradient(u, mu, sigma)
            if np.max(np.abs(F)) <= 1e-12:
                break
            u = u - np.clip(F / (1 / sigma**2 + self.counts * np.exp(mu + u)), -1.0, 1.0)
        else:
            raise AssertionError("the numpy reference solve did not converge")
        r = self.counts * np.exp(mu + u)
        h = 1 / sigma**2 + r
        loss = (
            scipy.stats.norm(0.0, sigma).logpdf(u).sum()
            + scipy.stats.poisson(np.exp(mu + u[self.group])).logpmf(self.y).sum()
            - 0.5 * np.log(h).sum()
        )
        # dL/dθ = ∂L/∂θ + (∂L/∂u)·du*/dθ with ∂L/∂u = −½ r/h at u* and du*/dθ = −h⁻¹ ∂F/∂θ
        dl_du = -0.5 * r / h
        dmu = (self.sums - r).sum() - 0.5 * (r / h).sum() + dl_du @ (-r / h)
        dsigma = (
            (u**2 / sigma**3 - 1 / sigma).sum()
            + (1 / (sigma**3 * h)).sum()
            + dl_du @ (2 * u / (sigma**3 * h))
        )
        return u, np.array([loss, dmu, dsigma])


# --- building and checking ----------------------------------------------------------------------
def relative_error(got: np.ndarray, want: np.ndarray) -> float:
    return float(np.max(np.abs(got - want) / np.abs(want)))


def build_case(problem: LaplaceProblem, name: str, method: str, structure: str, mode):
    """Compile a contender, call it once, and check it; returns (row, fn, fwd_fn or None)."""
    full, fwd = problem.graphs(method, structure)
    inputs = [problem.mu, problem.sigma]
    fn, t_compile = timed(lambda: pytensor.function(inputs, full, mode=mode, trust_input=True))
    out, t_first = timed(lambda: fn(*problem.values))
    fwd_fn = None
    row = {"name": name, "compile": t_compile, "first": t_first, "values": problem.values}
    if method == "newton":
        fwd_fn, row["compile_fwd"] = timed(
            lambda: pytensor.function(inputs, fwd, mode=mode, trust_input=True)
        )
        _, row["first_fwd"] = timed(lambda: fwd_fn(*problem.values))
    loss, g_mu, g_sigma, u_star, success, n_it, n_ev = (np.asarray(o) for o in out)
    row["result"] = np.array([loss, g_mu, g_sigma], dtype="float64")
    row["u_star"] = np.array(u_star)
    row["success"], row["n_it"], row["n_ev"] = bool(success), int(n_it), int(n_ev)
    row["max_grad"] = float(
        np.max(np.abs(problem.gradient(row["u_star"], *map(float, problem.values))))
    )
    return row, fn, fwd_fn


def check_case(row: dict, reference: np.ndarray, newton_c: dict | None) -> None:
    """Raise AssertionError with a short message if the row misses its stated tolerances."""
    row["err"] = relative_error(row["result"], reference)
    if row["name"].startswith("newton"):
        if not row["success"] or row["max_grad"] > NEWTON_TOL:
            raise AssertionError(f"no convergence: success={row['success']}, {row['max_grad']:.1e}")
        np.testing.assert_allclose(row["result"], reference, rtol=RTOL_NEWTON, atol=0)
        if newton_c is not None and newton_c is not row:
            np.testing.assert_allclose(row["result"], newton_c["result"], rtol=RTOL_NEWTON, atol=0)
            # each mode stops within tol / min h ≤ tol · sigma² of the exact mode
            atol = 2 * NEWTON_TOL * POINT["sigma"] ** 2
            np.testing.assert_allclose(row["u_star"], newton_c["u_star"], rtol=0, atol=atol)
    else:
        np.testing.assert_allclose(row["result"], reference, rtol=RTOL_BFGS, atol=0)


# --- where the Newton time goes -----------------------------------------------------------------
def newton_node(fn):
    nodes = [n for n in fn.maker.fgraph.toposort() if isinstance(n.op, NewtonOp)]
    if len(nodes) != 1:
        raise RuntimeError(f"expected one NewtonOp in the compiled graph, found {len(nodes)}")
    return nodes[0]


def runs_natively_in_numba(op) -> bool:
    """Whether the NUMBA backend has its own implementation of `op` (else: object-mode perform)."""
    from pytensor.graph.op import Op
    from pytensor.link.numba.dispatch import numba_funcify

    return numba_funcify.dispatch(type(op)) is not numba_funcify.dispatch(Op)


def execution_path(op, label: str) -> str:
    if label == "JAX":
        return "`lax.while_loop`, jitted inner graphs"
    if label == "NUMBA" and runs_natively_in_numba(op):
        return "numba-native loop, numba inner graphs"
    prefix = "object-mode " if label == "NUMBA" else ""
    return f"{prefix}`perform`: numpy loop, C inner functions"


def count_inner_calls(fn, values) -> dict[str, int] | None:
    """Exact `system`/`merit` call counts of one call of `fn`, when its Newton loop runs in Python
    (``perform``: the C backend, NUMBA's object mode); None otherwise."""
    from pymc_optim.backends import iterations as _iterations

    counts = {"system": 0, "merit": 0}
    original = _iterations.newton

    def counting(system, merit, *args, **kwargs):
        def counted(name, f):
            def wrapper(z):
                counts[name] += 1
                return f(z)

            return wrapper

        return original(counted("system", system), counted("merit", merit), *args, **kwargs)

    _iterations.newton = counting
    try:
        fn(*values)
    finally:
        _iterations.newton = original
    return counts if counts["system"] else None


def inner_function_times(fn, label: str, values, u_star, batch_s: float) -> dict[str, float]:
    """Seconds per call of the Newton Op's inner `system` and `merit` graphs, as `fn` runs them.

    ``perform`` paths call inner functions compiled in PyTensor's default (C) mode, timed as such
    calls; a numba-native loop calls the graphs compiled for NUMBA (timed through a PyTensor
    function, which adds its ~µs call overhead). Under JAX the graphs run inside a
    ``lax.while_loop``: they are timed as (t(2K) − t(K)) / K of a jitted ``fori_loop`` of K
    dependent calls, free of dispatch overhead.
    """
    node = newton_node(fn)
    op = node.op
    param_vars = node.inputs[op.n_controls : op.n_controls + op.n_params]
    params = pytensor.function(
        fn.maker.fgraph.inputs, param_vars, on_unused_input="ignore", mode="FAST_COMPILE"
    )(*values)
    u0 = np.asarray(u_star, dtype="float64")
    graphs = {name: op.numerical_functions()[name] for name in ("system", "merit")}
    if label != "JAX":
        mode = "NUMBA" if label == "NUMBA" and runs_natively_in_numba(op) else None
        fns = {}
        for name, (more_inputs, outs) in graphs.items():
            f = pytensor.function(
                [*op.problem.inner_xs, *more_inputs, *op.problem.inner_params],
                outs,
                mode=mode,
                on_unused_input="ignore",
                trust_input=True,
            )
            fns[name] = lambda f=f: f(u0, *params)
        times = time_interleaved(fns, 5, batch_s)
        return {name: statistics.median(ts) for name, ts in times.items()}

    import jax
    import jax.numpy as jnp

    from pymc_optim.backends.jax import _jax_function

    xs, ps = op.typed_inner_inputs(node)
    condition = op.condition.on(xs, ps)
    (merit,) = op.inner_on(xs, ps, [op.merit])
    inner = {
        "system": _jax_function(
            [*xs, *ps], [merit, condition.flat_residual(), condition.jacobian()]
        ),
        "merit": _jax_function([*xs, *ps], [merit]),
    }
    K = 50

    def repeated(f, k):
        def run(z, *p):
            # each call's input depends on all outputs of the previous one: nothing is hoisted
            # out of the loop or removed as dead code (1e-300 · Σ outputs leaves z unchanged)
            def body(_, z):
                return z + 1e-300 * sum(jnp.sum(o) for o in f(z, *p))

            return jax.lax.fori_loop(0, k, body, z)

        jitted = jax.jit(run)
        return lambda: jax.block_until_ready(jitted(u0, *params))

    fns = {(name, k): repeated(f, k) for name, f in inner.items() for k in (K, 2 * K)}
    times = time_interleaved(fns, 5, batch_s)
    return {name: paired_difference(times[(name, 2 * K)], times[(name, K)]) / K for name in inner}


def trivial_call_time(mode, values, batch_s: float) -> float:
    """Seconds per call of ``pytensor.function([mu, sigma], mu + sigma)`` in `mode`."""
    mu, sigma = pt.scalar("mu", dtype="float64"), pt.scalar("sigma", dtype="float64")
    fn = pytensor.function([mu, sigma], mu + sigma, mode=mode, trust_input=True)
    times = time_interleaved({"trivial": lambda: fn(*values)}, 5, batch_s)
    return statistics.median(times["trivial"])


# --- report -------------------------------------------------------------------------------------
def main(argv=None) -> int:
    parser = timing_parser(__doc__.splitlines()[0])
    parser.add_argument(
        "--slow-repeats",
        type=int,
        default=None,
        help=f"repeats of BFGS at G >= {SLOW_G} (default 3; 1 with --quick)",
    )
    parser.add_argument("--sizes", type=int, nargs="+", default=list(SIZES), help="group counts G")
    parser.add_argument("--profile", action="store_true", help="cProfile newton at the largest G")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--blas-threads", type=int, default=1, help="limit BLAS threads (0 = leave as is)"
    )
    args = parser.parse_args(argv)
    with blas_threads(args.blas_threads):
        return run(args)


def run(args) -> int:
    t_start = time.perf_counter()
    repeats = args.repeats or (3 if args.quick else 11)
    batch_s = args.batch or (0.02 if args.quick else 0.2)
    slow_repeats = args.slow_repeats or (1 if args.quick else 3)
    sizes = sorted(set(args.sizes))
    warnings.filterwarnings("ignore", message="PyTensor could not link to a BLAS")
    warnings.filterwarnings("ignore", message="Numba will use object mode")
    warnings.filterwarnings("ignore", message="Skipping Check")
    import jax

    print(
        f"# pymc_optim graph-native benchmark: Poisson random-intercepts inner mode\n\n"
        f"python {sys.version.split()[0]}, numpy {np.__version__}, scipy {scipy.__version__}, "
        f"pytensor {pytensor.__version__}, pymc {pm.__version__}, jax {jax.__version__}, "
        f"pymc_optim {pmo.__version__} ({git_revision(pmo.__file__)}, imported from "
        f"{os.path.dirname(os.path.dirname(os.path.abspath(pmo.__file__)))}); "
        f"G = {sizes}, {PER_GROUP} counts per group, (mu, sigma) = ({POINT['mu']}, "
        f"{POINT['sigma']}), x0 = zeros; repeats={repeats} "
        f"(BFGS at G >= {SLOW_G}: {slow_repeats}), batch={batch_s}s, BFGS gtol={GTOL:g}, "
        f"newton tol={NEWTON_TOL:g}, default mode {pytensor.config.mode!r} with "
        f"C thunks={pytensor.compile.mode.get_default_mode().linker.c_thunks}, "
        f"BLAS threads={args.blas_threads or 'default'}, "
        f"{os.cpu_count()} CPUs; times are medians over repeats, ratios medians of paired "
        f"per-repeat ratios.\n"
    )
    ok = True
    contenders: dict = {}
    slow: dict = {}
    rows: dict = {}
    full_fns: dict = {}

    print("## 1. Checks before timing (one call each; compile and first call not timed below)\n")
    print(
        "| G | contender | compile | first call | success | iterations / evaluations "
        "| max abs ∇(−ℓ)(u*) | max rel err of (L, ∂L/∂mu, ∂L/∂sigma) vs reference | status |"
    )
    print("|---:|---|---:|---:|---|---:|---:|---:|---|")
    specs = [(f"newton {label}", "newton", "diagonal", mode) for label, mode in MODES]
    specs += [(name, "BFGS", structure, None) for name, structure in BFGS.items()]
    for G in sizes:
        problem = LaplaceProblem(G, args.seed)
        _, reference = problem.reference(*map(float, problem.values))
        newton_c = None
        for name, method, structure, mode in specs:
            try:
                row, fn, fwd_fn = build_case(problem, name, method, structure, mode)
            except Exception as exc:  # a crash of one contender is reported, not fatal
                ok = False
                print(f"| {G} | {name} | CRASH: {type(exc).__name__}: {str(exc)[:100]} ||||||")
                continue
            if name == "newton C":
                newton_c = row
            status = "ok"
            try:
                check_case(row, reference, newton_c)
            except AssertionError as exc:
                ok = False
                status = "CHECK FAILED: " + " ".join(str(exc).split())[:120]
            else:
                contenders[(G, name)] = lambda fn=fn, v=problem.values: fn(*v)
                full_fns[(G, name)] = fn
                if fwd_fn is not None:
                    contenders[(G, name + " fwd")] = lambda f=fwd_fn, v=problem.values: f(*v)
                if method == "BFGS" and G >= SLOW_G:
                    slow[(G, name)] = slow_repeats
            rows[(G, name)] = row
            first = fmt_time(row["first"])
            if "compile_fwd" in row:
                first += f" (fwd fn: {row['compile_fwd']:.2f} s + {fmt_time(row['first_fwd'])})"
            print(
                f"| {G} | {name} | {row['compile']:.2f} s | {first} | {row['success']} | "
                f"{row['n_it']} / {row['n_ev']} | {row['max_grad']:.1e} | "
                f"{row.get('err', float('nan')):.1e} | {status} |",
                flush=True,
            )

    print(f"\n(checks done after {time.perf_counter() - t_start:.0f} s; timing...)\n", flush=True)
    times = time_interleaved(contenders, repeats, batch_s, slow=slow)
    med = {key: statistics.median(ts) for key, ts in times.items()}

    names = [f"newton {label}" for label, _ in MODES]
    print("## 2. Seconds per call of (L, ∇L): medians\n")
    print("| contender | " + " | ".join(f"G = {G}" for G in sizes) + " |")
    print("|---|" + "---:|" * len(sizes))

    def cells(fmt: Callable[[int], str | None]) -> str:
        return " | ".join(fmt(G) or "n/a" for G in sizes)

    for name in names:
        print(f"| {name} | " + cells(lambda G, n=name: _t(med, (G, n))) + " |")
        print(
            f"| {name}, forward only | " + cells(lambda G, n=name: _t(med, (G, n + " fwd"))) + " |"
        )
        print(
            f"| {name}, gradient part (paired full − fwd) | "
            + cells(lambda G, n=name: _diff(times, (G, n), (G, n + " fwd")))
            + " |"
        )

    def with_range(G: int, name: str) -> str | None:
        if (G, name) not in times:
            return None
        ts = times[(G, name)]
        return (
            f"{fmt_time(med[(G, name)])} ({len(ts)} rep., {fmt_time(min(ts))}–{fmt_time(max(ts))})"
        )

    for name in BFGS:
        print(f"| {name} (repeats, min–max) | " + cells(lambda G, n=name: with_range(G, n)) + " |")
    print(
        "| BFGS dense − BFGS diag (paired: cost of the dense implicit solve) | "
        + cells(lambda G: _diff(times, (G, "BFGS dense"), (G, "BFGS diag")))
        + " |"
    )

    print("\n## 3. Ratios: medians of paired per-repeat ratios\n")
    print("| ratio | " + " | ".join(f"G = {G}" for G in sizes) + " |")
    print("|---|" + "---:|" * len(sizes))
    for bfgs in BFGS:
        for name in names:
            print(
                f"| {bfgs} / {name} | "
                + cells(lambda G, b=bfgs, n=name: _r(ratio(times, (G, b), (G, n)), "x"))
                + " |"
            )
    print(
        "| newton NUMBA / newton C | "
        + cells(lambda G: _r(ratio(times, (G, "newton NUMBA"), (G, "newton C")), ""))
        + " |"
    )
    print(
        "| newton JAX / newton C | "
        + cells(lambda G: _r(ratio(times, (G, "newton JAX"), (G, "newton C")), ""))
        + " |"
    )

    print("\n## 4. Scaling of newton with G: paired ratios of (L, ∇L) times (forward only)\n")
    pairs = list(zip(sizes[:-1], sizes[1:], strict=True))
    print("| mode | " + " | ".join(f"t({b}) / t({a})" for a, b in pairs) + " |")
    print("|---|" + "---:|" * len(pairs))
    for name in names:
        row = []
        for a, b in pairs:
            full = _r(ratio(times, (b, name), (a, name)), "")
            fwd = _r(ratio(times, (b, name + " fwd"), (a, name + " fwd")), "")
            row.append(f"{full or 'n/a'} ({fwd or 'n/a'})")
        print(f"| {name} | " + " | ".join(row) + " |")

    big = max(sizes)
    breakdown_rows = []
    exact_counts: dict = {}  # (n_iterations, n_evaluations) -> counted calls of the numpy loop
    for label, mode in MODES:
        key = (big, f"newton {label}")
        if key not in full_fns:
            continue
        r, fn = rows[key], full_fns[key]
        op = newton_node(fn).op
        try:
            counts = count_inner_calls(fn, r["values"])
            inner = inner_function_times(fn, label, r["values"], r["u_star"], batch_s)
            overhead = trivial_call_time(mode, r["values"], batch_s)
        except Exception as exc:  # the breakdown is informational: report, do not crash
            breakdown_rows.append(f"| {label} | failed: {type(exc).__name__}: {str(exc)[:80]} |")
            continue
        signature = (r["n_it"], r["n_ev"])
        approx = ""
        if counts is not None:
            exact_counts[signature] = counts
        elif signature in exact_counts:  # the native loops mirror the numpy loop step for step
            counts = exact_counts[signature]
        else:  # the JAX loop evaluates `system` once per iteration, `merit` for the rest
            counts = {"system": r["n_it"] + 1, "merit": r["n_ev"] - r["n_it"] - 1}
            approx = "≈ "
        estimate = counts["system"] * inner["system"] + counts["merit"] * inner["merit"]
        total, fwd = med[key], med[(big, f"newton {label} fwd")]
        grad_part = paired_difference(times[key], times[(big, f"newton {label} fwd")])
        breakdown_rows.append(
            f"| {label} | {execution_path(op, label)} | {fmt_time(total)} | {fmt_time(fwd)} | "
            f"{fmt_time(grad_part)} ({100 * grad_part / total:.0f}%) | "
            f"{approx}{counts['system']} × {fmt_time(inner['system'])} | "
            f"{approx}{counts['merit']} × {fmt_time(inner['merit'])} | "
            f"{fmt_time(estimate)} ({100 * estimate / total:.0f}%) | "
            f"{fmt_time(fwd - estimate)} ({100 * (fwd - estimate) / total:.0f}%) | "
            f"{fmt_time(overhead)} |"
        )
        if args.profile:
            profile(f"newton {label}, G={big}, (L, ∇L)", contenders[key], 100, top=18)
    print(f"\n## 5. Where the newton time goes at G = {big}\n")
    print(
        "| mode | execution path | (L, ∇L) | forward only | gradient part (% of L, ∇L) "
        "| inner `system` calls (m, F, diag A) | inner `merit` calls (line search) "
        "| inner calls total (%) | rest of forward: loop, Op and function calls (%) "
        "| a trivial function call in this mode |"
    )
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for line in breakdown_rows:
        print(line)
    print(
        "\n(Inner calls are counted exactly where the loop runs in Python and reused for a native "
        "loop with the same iteration/evaluation counts; ≈ marks counts inferred from them. "
        "Forward-only and (L, ∇L) are separate timed functions, so a gradient part within the "
        "noise can come out negative.)"
    )

    print("\n## Targets\n")
    for name in names:
        speedup = ratio(times, (SPEEDUP_AT, "BFGS dense"), (SPEEDUP_AT, name))
        speedup_diag = ratio(times, (SPEEDUP_AT, "BFGS diag"), (SPEEDUP_AT, name))
        if speedup is None:
            print(f"- FAIL (not measured): {name} vs BFGS dense at G={SPEEDUP_AT}")
        else:
            verdict = "PASS" if speedup >= SPEEDUP_TARGET else "FAIL"
            diag = f"{speedup_diag:.0f}x" if speedup_diag is not None else "n/a"
            print(
                f"- {verdict}: {name} >= {SPEEDUP_TARGET:g}x faster than BFGS dense at "
                f"G={SPEEDUP_AT} (got {speedup:.0f}x; vs BFGS diag {diag})"
            )
        scaling = ratio(times, (SCALING_BIG, name), (SCALING_SMALL, name))
        if scaling is None:
            print(f"- FAIL (not measured): {name}: t(G={SCALING_BIG}) / t(G={SCALING_SMALL})")
        else:
            verdict = "PASS" if scaling <= SCALING_TARGET else "FAIL"
            print(
                f"- {verdict}: {name}: t(G={SCALING_BIG}) / t(G={SCALING_SMALL}) <= "
                f"{SCALING_TARGET:g} (got {scaling:.2f})"
            )
    for report in PROFILE_REPORTS:
        print(report)
    print(f"\nTotal runtime {time.perf_counter() - t_start:.0f} s.")
    return 0 if ok else 1


def _t(med: dict, key) -> str | None:
    return fmt_time(med[key]) if key in med else None


def _diff(times: dict, a, b) -> str | None:
    if a not in times or b not in times:
        return None
    k = min(len(times[a]), len(times[b]))
    return fmt_time(paired_difference(times[a][:k], times[b][:k]))


def _r(value: float | None, unit: str) -> str | None:
    if value is None:
        return None
    return f"{value:.0f}{unit}" if value >= 100 else f"{value:.2f}{unit}"


if __name__ == "__main__":
    sys.exit(main())
