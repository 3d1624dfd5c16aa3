"""Foundation benchmark of :func:`pymc_optim.minimize`: forward overhead and implicit-gradient cost.

Run ``python benchmarks/bench_foundation.py`` (full, a few minutes) or add ``--quick`` for a smoke
run with fewer repeats. ``--profile`` additionally prints a cProfile of our largest case of each
measurement. This is a script, not a test: it prints markdown tables and one PASS/FAIL line per
target, and exits 0 whatever the outcome (it exits 1 only if a correctness check of *ours* fails).

What is measured
----------------
1. **Forward solve overhead.** A compiled PyTensor function returning ``x_star`` of
   ``pmo.minimize(f, x, x0=..., method="BFGS")`` against calling ``scipy.optimize.minimize``
   (BFGS, ``jac=True``) directly on the *same* compiled value-and-gradient function,
   ``pytensor.function([x, a], [f, grad(f, x)], trust_input=True)``, for n = 10, 100, 1000 on the
   smooth strictly convex objective

       f(x; a) = sum(exp(x)) - a·x + 0.5·x·x          (minimum: exp(x*) + x* = a)

   Same x0 (zeros), same ``gtol``; both x* are checked to agree before timing.
   Target: time(ours) / time(scipy direct) <= 1.2 at every n.

2. **Solve + gradient.** One evaluation of ``(x_star, d loss/dθ)`` with ``pmo.minimize`` against
   the installed upstream ``pytensor.tensor.optimize.minimize`` for p = 10, 100, 1000 parameters
   on two objectives:

       2a (specified):  f(x; θ) = 0.5·sum((x - B θ)²) + sum(log1p(exp(x))),  B fixed (n, p)
       2b (extra):      f(x; θ) = 0.5·sum(x²) + sum(log1p(exp(A x + θ))),     A fixed (p, n)
       loss             = sum(c · x*) + 0.5·sum(x*²),                          c fixed

   2a is a sweep over n = 10, 100, 300 controls; 2b runs at n = 10.

   In 2a θ reaches the objective only through the x-independent B θ (length n): both Ops take
   that sub-expression as their parameter (ours: the frontier of x-independent sub-graphs;
   upstream: ``truncated_graph_inputs``), so neither sees p at all, and B θ and Bᵀ w̄ cost the
   same outside either Op. What differs is the gradient through the Op: upstream builds the
   Jacobian of F = ∇ₓf with respect to [x, B θ] with a scan over the n rows of F (n reverse
   passes) and solves with n right-hand sides; ours solves with one right-hand side and does one
   reverse pass. That difference grows with n, but so does the shared forward solve (scipy's
   BFGS updates a dense n × n inverse Hessian every iteration), which both Ops run identically:
   "upstream / ours fwd" is the most any gradient could win. At n = 10 the forward dominates
   completely; the sweep shows how the gradient's share changes with n. 2b makes all p
   parameters inputs of the inner graph, so the parameter count reaches the solve and upstream's
   Jacobian is n × p.

   Both start from zeros (the runtime value of x is the initial guess: ``x0=None`` for ours), use
   BFGS and the same ``gtol``. Each function is compiled once; compile time and first-call time
   (ours compiles its inner function lazily) are reported separately and excluded from the
   timings. Values and gradients are checked to agree (``assert_allclose``, rtol 1e-5) before
   timing; ours is also checked against an independent tight Newton solve of ∇ₓf = 0 and a
   central finite difference of the loss along a random direction. An upstream failure
   (exception or mismatch) is printed in the table instead of crashing the script.
   Targets, judged for each n of 2a (2b is printed for information): time(upstream) / time(ours)
   >= 5 at p = 1000, and time(ours, p=1000) / time(ours, p=10) <= 3. All p of one objective and
   one n are timed in one interleaved run, so the p = 1000 / p = 10 ratio is paired as well. A
   slow run times fewer repeats (``--budget`` seconds in all, never fewer than 5).

How it is timed
---------------
The contenders of one case are timed in interleaved batches (the order alternates between
repeats) with the garbage collector off; each batch runs enough calls to last ``--batch``
seconds, and a repeat's time is the batch mean per call. Tables report the median over repeats
of the absolute times and the median of the *paired* per-repeat ratios, which cancels slow drift
of the machine. The forward-only time of each contender in measurement 2 is shown to separate the
solve from the gradient: "gradient part" is the median of paired per-repeat differences
full − forward-only, and "upstream / ours fwd" bounds the speedup any gradient of ours could
reach, since both Ops run the same scipy BFGS forward.

Note on n = 1000 in measurement 1: scipy's BFGS updates its dense inverse Hessian with two
n × n matrix products per iteration (O(n³)), so that case is dominated by scipy itself and takes
about 3 s per solve on a 2-CPU machine with one BLAS thread.
"""

from __future__ import annotations

import os
import statistics
import sys
import traceback
import warnings

import numpy as np
import pytensor
import pytensor.tensor as pt
import scipy.optimize
from _timing import (
    MIN_REPEATS,
    PROFILE_REPORTS,
    blas_threads,
    fmt_time,
    git_revision,
    paired_difference,
    paired_ratio,
    profile,
    time_interleaved,
    timed,
    timing_parser,
)
from scipy.special import expit

import pymc_optim as pmo

#: What the profiles also list by cumulative time: pymc_optim, PyTensor's function call, BFGS.
_PROFILED = r"pymc_optim|function/types|_minimize_bfgs"

FORWARD_SIZES = (10, 100, 1000)
PARAM_COUNTS = (10, 100, 1000)
# n controls of each gradient objective: 2a sweeps n, so the gradient's share of the time grows
# from negligible (n = 10) to dominant; 2b sees all p parameters in its inner graph, fixed n = 10.
GRADIENT_SIZES = {"a": (10, 100, 300), "b": (10,)}
GTOL = 1e-6  # tighter gtol makes BFGS stop on 'precision loss' (success=False) at n >= 100
FORWARD_TARGET = 1.2
SPEEDUP_TARGET = 5.0
SCALING_TARGET = 3.0
GRADIENT_KINDS = {
    "a": "θ only through B θ (as specified)",
    "b": "θ elementwise inside softplus(A x + θ)",
}


# --- measurement 1: forward overhead ----------------------------------------------------------
def forward_case(n: int, rng: np.random.Generator, repeats: int, batch_s: float, show_profile):
    x = pt.vector("x")
    a = pt.vector("a")
    f = pt.exp(x).sum() - (a * x).sum() + 0.5 * (x * x).sum()
    a_val = rng.uniform(0.5, 3.0, size=n)
    x0 = np.zeros(n)
    options = {"gtol": GTOL}

    x_star, _ = pmo.minimize(f, x, x0=x0, method="BFGS", optimizer_kwargs={"options": options})
    ours_fn, compile_ours = timed(lambda: pytensor.function([a], x_star, trust_input=True))
    value_and_grad, compile_ref = timed(
        lambda: pytensor.function([x, a], [f, pt.grad(f, x)], trust_input=True)
    )

    def fun(z):
        v, g = value_and_grad(z, a_val)
        return float(v), g

    def ours():
        return ours_fn(a_val)

    def direct():
        return scipy.optimize.minimize(fun, x0, jac=True, method="BFGS", options=options)

    res = direct()
    x_ours = ours()
    residual = np.max(np.abs(np.exp(x_ours) + x_ours - a_val))
    np.testing.assert_allclose(x_ours, res.x, rtol=1e-7, atol=1e-10)
    if not res.success or residual > 10 * GTOL:
        raise AssertionError(f"n={n}: solve did not converge (residual {residual:.2e}).")

    times = time_interleaved({"ours": ours, "direct": direct}, repeats, batch_s)
    if show_profile:
        profile(
            f"pmo.minimize forward, n={n}",
            ours,
            calls=max(3, int(0.5 / min(times["ours"]))),
            cumulative=_PROFILED,
        )
    return {
        "n": n,
        "nit": res.nit,
        "nfev": res.nfev,
        "ours": statistics.median(times["ours"]),
        "direct": statistics.median(times["direct"]),
        "ratio": paired_ratio(times["ours"], times["direct"]),
        "max_dx": float(np.max(np.abs(x_ours - res.x))),
        "compile_ours": compile_ours,
        "compile_ref": compile_ref,
    }


# --- measurement 2: solve + gradient ------------------------------------------------------------
class GradientProblem:
    """f(x; θ) with n controls and p parameters, its loss, and an exact numpy reference solve."""

    def __init__(self, kind: str, n: int, p: int, rng: np.random.Generator):
        self.kind, self.n, self.p = kind, n, p
        self.c = rng.normal(size=n)
        self.theta_val = rng.normal(size=p)
        self.x0 = np.zeros(n)
        self.theta = pt.vector("theta")
        self.x = pt.vector("x")
        x, theta = self.x, self.theta
        if kind == "a":  # θ enters only through the x-independent B θ
            self.M = rng.normal(size=(n, p)) / np.sqrt(p)
            mu = pt.dot(pt.constant(self.M), theta)
            self.f = 0.5 * ((x - mu) ** 2).sum() + pt.log1p(pt.exp(x)).sum()
        else:  # θ enters elementwise next to A x: every inner evaluation sees all p of them
            self.M = rng.normal(size=(p, n)) / np.sqrt(n)
            self.f = (
                0.5 * (x**2).sum() + pt.log1p(pt.exp(pt.dot(pt.constant(self.M), x) + theta)).sum()
            )

    def loss(self, x_star):
        return (pt.constant(self.c) * x_star).sum() + 0.5 * (x_star**2).sum()

    def exact(self, theta_val):
        """x*(θ) by a tight Newton solve of ∇ₓf = 0 (scipy.optimize.root), and the loss there."""
        M = self.M
        if self.kind == "a":
            mu = M @ theta_val

            def grad_and_hess(z):
                s = expit(z)
                return z - mu + s, np.diag(1 + s * (1 - s))
        else:

            def grad_and_hess(z):
                s = expit(M @ z + theta_val)
                return z + M.T @ s, np.eye(len(z)) + (M.T * (s * (1 - s))) @ M

        x = scipy.optimize.root(grad_and_hess, self.x0, jac=True, tol=1e-14).x
        return x, self.c @ x + 0.5 * x @ x


def build_gradient_case(problem: GradientProblem, rng: np.random.Generator):
    """Compile ours and upstream, check them, and return (row, contenders)."""
    from pytensor.tensor.optimize import minimize as upstream_minimize

    theta, x, theta_val, x0 = problem.theta, problem.x, problem.theta_val, problem.x0
    optimizer_kwargs = {"options": {"gtol": GTOL}}

    def build(x_star):
        grad_theta = pt.grad(problem.loss(x_star), theta)
        full, t_compile = timed(
            lambda: pytensor.function([theta, x], [x_star, grad_theta], trust_input=True)
        )
        fwd = pytensor.function([theta, x], x_star, trust_input=True)
        (x_val, g_val), t_first = timed(lambda: full(theta_val, x0))
        return full, fwd, t_compile, t_first, np.array(x_val), np.array(g_val)

    row: dict[str, object] = {"n": problem.n, "p": problem.p}
    x_star, _ = pmo.minimize(problem.f, x, method="BFGS", optimizer_kwargs=optimizer_kwargs)
    ours_full, ours_fwd, row["compile_ours"], row["first_ours"], x_ours, g_ours = build(x_star)

    # ours against an independent tight solve, and a central finite difference of the loss
    np.testing.assert_allclose(x_ours, problem.exact(theta_val)[0], rtol=0, atol=10 * GTOL)
    direction = rng.normal(size=problem.p)
    eps = 1e-5
    loss_plus = problem.exact(theta_val + eps * direction)[1]
    loss_minus = problem.exact(theta_val - eps * direction)[1]
    fd = (loss_plus - loss_minus) / (2 * eps)
    np.testing.assert_allclose(g_ours @ direction, fd, rtol=1e-4, atol=1e-6)

    contenders = {
        "ours": lambda: ours_full(theta_val, x0),
        "ours_fwd": lambda: ours_fwd(theta_val, x0),
    }
    row["upstream_status"] = "ok"
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            up_x_star, _ = upstream_minimize(
                problem.f, x, method="BFGS", jac=True, hess=False, optimizer_kwargs=optimizer_kwargs
            )
            up_full, up_fwd, row["compile_up"], row["first_up"], x_up, g_up = build(up_x_star)
        np.testing.assert_allclose(x_up, x_ours, rtol=1e-5, atol=1e-8)
        np.testing.assert_allclose(g_up, g_ours, rtol=1e-5, atol=1e-8)
        row["max_dg"] = float(np.max(np.abs(g_up - g_ours)))
        contenders["upstream"] = lambda: up_full(theta_val, x0)
        contenders["upstream_fwd"] = lambda: up_fwd(theta_val, x0)
    except AssertionError as exc:
        row["upstream_status"] = "mismatch: " + " ".join(str(exc).split())[:80]
    except Exception as exc:  # the upstream Op is not ours: report, do not crash
        row["upstream_status"] = f"crash: {type(exc).__name__}: {str(exc).splitlines()[0][:80]}"
        traceback.print_exc(file=sys.stderr)
    return row, contenders


def gradient_measurement(
    kind: str,
    n: int,
    rng,
    repeats: int,
    batch_s: float,
    budget_s: float | None,
    show_profile: bool,
):
    """All p of one objective kind at `n` controls, timed in one interleaved run (so the p-ratios
    are paired too). Returns the rows by p, failures of our checks by p, the paired ratio
    time(ours, largest p) / time(ours, smallest p), and the number of repeats timed."""
    rows, contenders, failures = {}, {}, {}
    for p in PARAM_COUNTS:
        try:
            rows[p], cs = build_gradient_case(GradientProblem(kind, n, p, rng), rng)
        except AssertionError as exc:
            failures[p] = " ".join(str(exc).split())[:120]
            continue
        contenders.update({(p, name): fn for name, fn in cs.items()})
    if not contenders:
        return rows, failures, None, 0
    times = time_interleaved(contenders, repeats, batch_s, budget_s=budget_s)
    n_repeats = len(next(iter(times.values())))
    for (p, name), ts in times.items():
        rows[p][name] = statistics.median(ts)
    for p, row in rows.items():
        row["repeats"] = n_repeats
        row["grad_ours"] = paired_difference(times[(p, "ours")], times[(p, "ours_fwd")])
        if (p, "upstream") in times:
            row["speedup"] = paired_ratio(times[(p, "upstream")], times[(p, "ours")])
            row["bound"] = paired_ratio(times[(p, "upstream")], times[(p, "ours_fwd")])
            row["grad_up"] = paired_difference(times[(p, "upstream")], times[(p, "upstream_fwd")])
    big, small = PARAM_COUNTS[-1], PARAM_COUNTS[0]
    scaling = None
    if (big, "ours") in times and (small, "ours") in times:
        scaling = paired_ratio(times[(big, "ours")], times[(small, "ours")])
    if show_profile:
        for name, label in (("ours", "pmo.minimize"), ("upstream", "upstream minimize")):
            if (big, name) in contenders:
                calls = max(3, int(2.0 / min(times[(big, name)])))
                profile(
                    f"{label} solve + gradient, kind {kind}, n={n}, p={big}",
                    contenders[(big, name)],
                    calls,
                    cumulative=_PROFILED,
                )
    return rows, failures, scaling, n_repeats


def print_gradient_header() -> None:
    print(
        "| n | p | repeats | ours | upstream | upstream / ours | ours fwd only "
        "| upstream fwd only | gradient part ours / upstream "
        "| upstream / ours fwd (bound if our gradient were free) "
        "| compile + 1st call ours | compile + 1st call upstream | upstream status |"
    )
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|")


def print_gradient_rows(n: int, rows: dict, failures: dict) -> None:
    na = "n/a"
    for p in PARAM_COUNTS:
        if p in failures:
            print(f"| {n} | {p} | OURS CHECK FAILED: {failures[p]} ||||||||||", flush=True)
            continue
        r = rows[p]
        up = "upstream" in r
        grad_part = f"{fmt_time(r['grad_ours'])} / " + (fmt_time(r["grad_up"]) if up else na)
        bound = f"{r['bound']:.2f}x" if up else na
        speedup = f"{r['speedup']:.2f}x" if up else na
        print(
            f"| {n} | {p} | {r['repeats']} | {fmt_time(r['ours'])} | "
            f"{fmt_time(r['upstream']) if up else na} | {speedup} | {fmt_time(r['ours_fwd'])} | "
            f"{fmt_time(r['upstream_fwd']) if up else na} | {grad_part} | {bound} | "
            f"{r['compile_ours']:.2f} s + {fmt_time(r['first_ours'])} | "
            + (f"{r['compile_up']:.2f} s + {fmt_time(r['first_up'])}" if up else na)
            + f" | {r['upstream_status']}"
            + (f" (max abs Δgrad {r['max_dg']:.1e})" if up else "")
            + " |",
            flush=True,
        )


def explain(n: int, rows: dict) -> str:
    """One line on where the time goes at `n` controls, from the largest p of the table."""
    p = PARAM_COUNTS[-1]
    r = rows.get(p, {})
    if "upstream" not in r:
        return f"n={n}: no upstream comparison at p={p}."
    fwd = r["ours_fwd"]
    up_grad_share = r["grad_up"] / r["upstream"]
    dominant = (
        "the shared scipy BFGS forward solve dominates both"
        if fwd >= r["grad_up"]
        else "upstream's gradient dominates its time"
    )
    return (
        f"n={n} (p={p}): {dominant}: BFGS forward {fmt_time(fwd)} (ours) / "
        f"{fmt_time(r['upstream_fwd'])} (upstream); gradient part ours {fmt_time(r['grad_ours'])} "
        f"({r['grad_ours'] / r['ours']:.0%} of ours) vs upstream {fmt_time(r['grad_up'])} "
        f"({up_grad_share:.0%} of upstream); a free gradient of ours would cap the speedup at "
        f"{r['bound']:.2f}x."
    )


# --- report -------------------------------------------------------------------------------------
def main(argv=None) -> int:
    parser = timing_parser(__doc__.splitlines()[0])
    parser.add_argument(
        "--budget",
        type=float,
        default=None,
        help="seconds for the timed repeats of one gradient run (all p at one n); slower runs "
        f"time fewer repeats, never fewer than {MIN_REPEATS} (default 240, 15 with --quick)",
    )
    parser.add_argument("--profile", action="store_true", help="cProfile the largest cases")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--blas-threads",
        type=int,
        default=1,
        help="limit BLAS threads (needs threadpoolctl; 0 = leave as is). One thread keeps the "
        "O(n³) BFGS updates of measurement 1 from fighting other processes for the cores.",
    )
    args = parser.parse_args(argv)
    with blas_threads(args.blas_threads):
        return run(args)


def run(args) -> int:
    repeats = args.repeats or (3 if args.quick else 11)
    batch_s = args.batch or (0.02 if args.quick else 0.2)
    budget_s = args.budget or (15.0 if args.quick else 240.0)
    rng = np.random.default_rng(args.seed)
    warnings.filterwarnings("ignore", message="PyTensor could not link to a BLAS")

    revision = git_revision(pmo.__file__)
    print(
        f"# pymc_optim foundation benchmark\n\n"
        f"python {sys.version.split()[0]}, numpy {np.__version__}, scipy {scipy.__version__}, "
        f"pytensor {pytensor.__version__}, pymc_optim {pmo.__version__} ({revision}); "
        f"repeats={repeats} (a gradient run is cut to about {budget_s:g} s, never below "
        f"{min(repeats, MIN_REPEATS)} repeats), batch={batch_s}s, BFGS gtol={GTOL:g}, "
        f"BLAS threads={args.blas_threads or 'default'}, {os.cpu_count()} CPUs; "
        f"times are medians over repeats, ratios medians of paired per-repeat ratios.\n"
    )
    ok = True

    print("## 1. Forward solve overhead: pmo.minimize vs scipy.optimize.minimize direct\n")
    print(
        "| n | BFGS nit / nfev | ours | scipy direct | ours / direct | max abs Δx* "
        "| compile ours / vg fn |"
    )
    print("|---:|---:|---:|---:|---:|---:|---:|")
    forward_rows = []
    for n in FORWARD_SIZES:
        try:
            r = forward_case(n, rng, repeats, batch_s, args.profile and n == FORWARD_SIZES[0])
        except AssertionError as exc:
            ok = False
            print(f"| {n} | CHECK FAILED: {' '.join(str(exc).split())[:120]} | | | | | |")
            continue
        forward_rows.append(r)
        print(
            f"| {n} | {r['nit']} / {r['nfev']} | {fmt_time(r['ours'])} | "
            f"{fmt_time(r['direct'])} | {r['ratio']:.3f} | {r['max_dx']:.1e} | "
            f"{r['compile_ours']:.2f} s / {r['compile_ref']:.2f} s |",
            flush=True,
        )

    results: dict[str, dict[int, tuple[dict, float | None]]] = {}
    for kind, title in GRADIENT_KINDS.items():
        sizes = GRADIENT_SIZES[kind]
        print(
            f"\n## 2{kind}. Solve + gradient of (x*, d loss/dθ), n = "
            f"{', '.join(map(str, sizes))} controls, {title}: "
            "pmo.minimize vs pytensor.tensor.optimize.minimize\n"
        )
        print_gradient_header()
        results[kind] = {}
        for n in sizes:
            rows, failures, scaling, _ = gradient_measurement(
                kind,
                n,
                rng,
                repeats,
                batch_s,
                budget_s,
                args.profile and kind == "a" and n == sizes[-1],
            )
            ok = ok and not failures
            print_gradient_rows(n, rows, failures)
            results[kind][n] = (rows, scaling)
        if kind == "a":
            print("\nWhere the time goes (largest p; both Ops run the same scipy BFGS forward):\n")
            for n, (rows, _) in results[kind].items():
                print(f"- {explain(n, rows)}")

    print("\n## Targets\n")
    if len(forward_rows) == len(FORWARD_SIZES):
        worst = max(forward_rows, key=lambda r: r["ratio"])
        verdict = "PASS" if worst["ratio"] <= FORWARD_TARGET else "FAIL"
        print(
            f"- {verdict}: 1. forward overhead ours/direct <= {FORWARD_TARGET} at every n "
            f"(worst {worst['ratio']:.3f} at n={worst['n']})"
        )
    else:
        print(f"- FAIL: 1. forward overhead ours/direct <= {FORWARD_TARGET} (a check failed)")
    big, small = PARAM_COUNTS[-1], PARAM_COUNTS[0]
    for kind, by_n in results.items():
        label = f"2{kind}" + (" (the specified measurement)" if kind == "a" else " (informational)")
        for n, (rows, scaling) in by_n.items():
            if "speedup" in rows.get(big, {}):
                s = rows[big]["speedup"]
                verdict = "PASS" if s >= SPEEDUP_TARGET else "FAIL"
                print(
                    f"- {verdict}: {label}, n={n}: upstream/ours >= {SPEEDUP_TARGET}x at p={big} "
                    f"(got {s:.2f}x)"
                )
            else:
                status = rows.get(big, {}).get("upstream_status", "ours failed its check")
                print(
                    f"- FAIL (no comparison): {label}, n={n}: upstream/ours >= "
                    f"{SPEEDUP_TARGET}x: {status}"
                )
            if scaling is not None:
                verdict = "PASS" if scaling <= SCALING_TARGET else "FAIL"
                print(
                    f"- {verdict}: {label}, n={n}: ours time(p={big}) / time(p={small}) <= "
                    f"{SCALING_TARGET} (got {scaling:.2f})"
                )
            else:
                print(
                    f"- FAIL: {label}, n={n}: ours time(p={big}) / time(p={small}) (a check failed)"
                )
    for report in PROFILE_REPORTS:
        print(report)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
