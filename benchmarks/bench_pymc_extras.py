"""pymc_optim's Laplace marginal against pymc-extras': value, gradient and time per call.

Run ``python benchmarks/bench_pymc_extras.py`` from an environment that has both pymc_optim and
pymc-extras (under 2 minutes on 2 cores, most of it compilation and numba's first calls). This is
a script, not a test: it prints the per-θ comparison and one markdown table, and exits 0 whatever
the timings.

Extra install: pymc-extras 0.15.1 pins ``pymc<6.4`` and pymc_optim needs ``pymc>=6.4``, so pip
refuses the two together and the project's venv does not have it. A separate venv::

    python3.12 -m venv /tmp/venv_extras
    /tmp/venv_extras/bin/pip install pymc-extras==0.15.1      # resolves pymc 6.3.2
    /tmp/venv_extras/bin/pip install "pymc==6.4.0"             # over pymc-extras' pin
    /tmp/venv_extras/bin/pip install --no-deps -e .
    /tmp/venv_extras/bin/python benchmarks/bench_pymc_extras.py

Without pymc-extras the script runs (a) and the reference alone and says that (b) is skipped.

The problem
-----------
``bench_laplace.py``'s: Poisson random intercepts, G groups with 5 counts each, simulated with
its ``simulate`` (seed G, mu = 0.5, sigma = 0.7) and built with its ``full_model`` (centered):

    mu ~ N(0, 2),  sigma ~ HalfNormal(1),  u_g ~ N(0, sigma),  y_gj ~ Poisson(exp(mu + u_g)),

G = 30 and 300. The latent u is marginalized; θ = (mu, log sigma), PyMC's value variables.

Contenders
----------
(a) ``pmo.marginalize_laplace(model, "u")`` (defaults: the diagonal Hessian is detected,
    graph-native Newton from u = 0).
(b) ``pymc_extras.marginalize(model, laplace_approx={"u": Q})`` (what ``fit_INLA`` calls) with
    the prior precision Q = I / sigma² given as a model Deterministic (an expression of ``sigma``
    that is not a model variable is not remapped into the marginal model: PyMC then finds random
    variables in the logp graph). pymc-extras' defaults: ``pytensor.tensor.optimize.minimize``
    (scipy L-BFGS-B, ``tol=1e-8``) from u = 1, the Hessian of the likelihood by
    ``pytensor.gradient.hessian`` (a scan over the G rows), log det by Cholesky of Q − H; the
    gradient through the Op's implicit pullback (``use_vectorized_jac=True``).
(ref) the Laplace marginal in numpy: the posterior of u factorizes over groups, so the mode is
    G scalar Newton solves to 1e-13 and log det H is a sum over groups; its gradient is by central
    differences (step 1e-5). It is exact up to rounding, so it tells which of (a), (b) differs.

Both marginals are log p(y, u*, θ) + (G/2) log 2π − ½ log det H(u*) with H the negative Hessian
of the log joint in u, plus the priors of mu and sigma and the log-Jacobian of sigma's log
transform: the same constants, so the values are compared as they are (no alignment).

How it is measured
------------------
Each model's logp and gradient in the value variables (mu, sigma_log__) are one compiled
function (``model.compile_fn([model.logp(), model.dlogp(...)], point_fn=False)``) in PyTensor's
default mode (numba backend); the outputs are numpy arrays, so each call is complete when it
returns. One loop calls the function at each of the θ points, in as many passes as last about
0.2 s; loops of (a) and of (b) alternate, and the time per call is that of the best of
``--repeats`` loops divided by its number of calls. Compilation and the first calls (numba's JIT)
are excluded and reported apart.

Results
-------
See ``benchmarks/README.md``.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import warnings

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
os.environ.setdefault("MKL_NUM_THREADS", "1")

import numpy as np  # noqa: E402
import pymc as pm  # noqa: E402
import pytensor  # noqa: E402
import pytensor.tensor as pt  # noqa: E402
import scipy.special  # noqa: E402
from bench_laplace import full_model, simulate  # noqa: E402

import pymc_optim as pmo  # noqa: E402

SIZES = (30, 300)
NAMES = ("mu", "sigma_log__")
#: (mu, sigma) at which the marginals are compared and timed: around the posterior and beyond.
THETAS = ((0.5, 0.7), (0.3, 0.5), (0.7, 0.9), (0.0, 1.2), (1.0, 0.4))
REPEATS = 5


# --- the contenders -----------------------------------------------------------------------------
def pymc_optim_marginal(y, group, G: int) -> pm.Model:
    return pmo.marginalize_laplace(full_model(y, group, G, centered=True), "u")


def pymc_extras_marginal(y, group, G: int) -> pm.Model:
    import pymc_extras as pmx

    model = full_model(y, group, G, centered=True)
    with model:
        precision = pm.Deterministic("Q", pt.eye(G) / model["sigma"] ** 2)
    return pmx.marginalize(model, laplace_approx={"u": precision})


def compiled(model: pm.Model):
    """f(theta) -> (logp, gradient) at theta = (mu, sigma_log__), in the default mode."""
    rvs = [model[name.removesuffix("_log__")] for name in NAMES]
    value_vars = [model.rvs_to_values[rv] for rv in rvs]
    assert [v.name for v in value_vars] == list(NAMES), value_vars
    fn = model.compile_fn(
        [model.logp(), model.dlogp(vars=rvs)],
        inputs=value_vars,
        point_fn=False,
        on_unused_input="ignore",
    )
    fn.trust_input = True
    return lambda theta: fn(*(np.asarray(t, dtype="float64") for t in theta))


# --- the reference ------------------------------------------------------------------------------
def reference_value(y, group, G: int, theta) -> float:
    """The Laplace marginal of the same model at theta = (mu, log sigma), in numpy."""
    mu, log_sigma = theta
    sigma = np.exp(log_sigma)
    n = np.bincount(group, minlength=G).astype(float)
    total = np.bincount(group, weights=y, minlength=G)
    u = np.zeros(G)
    for _ in range(100):
        rate = n * np.exp(mu + u)
        step = (total - rate - u / sigma**2) / (rate + 1 / sigma**2)
        u += step
        if np.max(np.abs(step)) < 1e-13:
            break
    eta = mu + u[group]
    loglik = np.sum(y * eta - np.exp(eta) - scipy.special.gammaln(y + 1.0))
    prior_u = np.sum(-0.5 * (u / sigma) ** 2 - np.log(sigma) - 0.5 * np.log(2 * np.pi))
    hessian = n * np.exp(mu + u) + 1 / sigma**2
    prior_theta = (
        -0.5 * (mu / 2.0) ** 2
        - np.log(2.0)
        - 0.5 * np.log(2 * np.pi)  # mu ~ N(0, 2)
        + np.log(2.0)
        - 0.5 * sigma**2
        - 0.5 * np.log(2 * np.pi)  # sigma ~ HalfNormal(1)
        + log_sigma  # log-Jacobian of sigma = exp(sigma_log__)
    )
    laplace = 0.5 * G * np.log(2 * np.pi) - 0.5 * np.sum(np.log(hessian))
    return float(loglik + prior_u + prior_theta + laplace)


def reference(y, group, G: int, theta, h: float = 1e-5):
    value = reference_value(y, group, G, theta)
    gradient = np.empty(2)
    for i in range(2):
        e = np.eye(2)[i] * h
        up, down = (reference_value(y, group, G, np.add(theta, s * e)) for s in (1, -1))
        gradient[i] = (up - down) / (2 * h)
    return value, gradient


# --- measuring ----------------------------------------------------------------------------------
def prepare(label: str, build, y, group, G: int, thetas) -> dict:
    """Build and compile one contender, call it once at every theta (numba's JIT included)."""
    t0 = time.perf_counter()
    model = build(y, group, G)
    t1 = time.perf_counter()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fn = compiled(model)
        t2 = time.perf_counter()
        outputs = [fn(theta) for theta in thetas]
    t3 = time.perf_counter()
    prefix = "Numba will use object mode to run "
    object_mode = sorted(
        {
            str(w.message).removeprefix(prefix).split("'s perform")[0]
            for w in caught
            if str(w.message).startswith(prefix)
        }
    )
    print(
        f"G={G} {label}: build {t1 - t0:.1f} s, compile {t2 - t1:.1f} s, first calls "
        f"{t3 - t2:.1f} s"
        + (f"; numba object mode for {', '.join(object_mode)}" * bool(object_mode)),
        file=sys.stderr,
    )
    return {
        "fn": fn,
        "values": np.array([float(v) for v, _ in outputs]),
        "gradients": np.array([np.asarray(g, dtype=float) for _, g in outputs]),
        "setup_s": t3 - t0,
        "object_mode": object_mode,
    }


def time_per_call(contenders: dict, thetas, repeats: int, loop_s: float = 0.2) -> dict:
    """Seconds per call: the best of `repeats` loops, each of `passes` calls at every theta (as
    many passes as last about `loop_s`), loops of the contenders alternating."""

    def loop(fn, passes: int) -> float:
        t0 = time.perf_counter()
        for _ in range(passes):
            for theta in thetas:
                fn(theta)
        return (time.perf_counter() - t0) / (passes * len(thetas))

    passes = {
        label: max(1, round(loop_s / (len(thetas) * loop(c["fn"], 1))))
        for label, c in contenders.items()
    }
    best = dict.fromkeys(contenders, np.inf)
    for _ in range(repeats):
        for label, c in contenders.items():
            best[label] = min(best[label], loop(c["fn"], passes[label]))
    return best


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=list(SIZES))
    parser.add_argument("--repeats", type=int, default=REPEATS, help="timed loops per contender")
    args = parser.parse_args(argv)
    pytensor.config.compute_test_value = "off"
    warnings.filterwarnings("ignore", message=".*INLA is currently experimental.*")
    try:
        import pymc_extras

        have_extras = True
        print(f"pymc-extras {pymc_extras.__version__}", end="; ")
    except ImportError:
        have_extras = False
    print(
        f"pymc {pm.__version__}, pytensor {pytensor.__version__}, numpy {np.__version__}, "
        f"mode {pytensor.compile.mode.get_default_mode().linker}"
    )
    if not have_extras:
        print(
            "pymc_extras is not importable: contender (b) is skipped (run this script from a venv "
            "with pymc-extras, see its docstring)"
        )

    thetas = [(mu, np.log(sigma)) for mu, sigma in THETAS]
    rows = []
    for G in args.sizes:
        y, group = simulate(G)
        refs = [reference(y, group, G, theta) for theta in thetas]
        ref_values = np.array([v for v, _ in refs])
        ref_grads = np.array([g for _, g in refs])
        contenders = {"(a) pymc_optim": prepare("(a)", pymc_optim_marginal, y, group, G, thetas)}
        if have_extras:
            try:
                contenders["(b) pymc-extras"] = prepare(
                    "(b)", pymc_extras_marginal, y, group, G, thetas
                )
            except Exception as error:  # a contender that cannot run is reported, not fatal
                print(f"G={G} (b) pymc-extras: failed: {type(error).__name__}: {error}"[:500])
        seconds = time_per_call(contenders, thetas, args.repeats)

        print(f"\nG = {G}, at (mu, sigma) =", ", ".join(f"({m:g}, {s:g})" for m, s in THETAS))
        for label, c in contenders.items():
            print(f"  {label} logp:", " ".join(f"{v:.8f}" for v in c["values"]))
        print("  (ref) logp:", " ".join(f"{v:.8f}" for v in ref_values))
        for label, c in contenders.items():
            value_err = np.abs(c["values"] - ref_values)
            grad_err = np.abs(c["gradients"] - ref_grads).max(axis=1)
            print(f"  {label} |logp - ref|:", " ".join(f"{e:.1e}" for e in value_err))
            print(f"  {label} max |grad - ref|:", " ".join(f"{e:.1e}" for e in grad_err))
        row = {"G": G, "a_ms": 1e3 * seconds["(a) pymc_optim"]}
        b = contenders.get("(b) pymc-extras")
        if b is not None:
            a = contenders["(a) pymc_optim"]
            row.update(
                b_ms=1e3 * seconds["(b) pymc-extras"],
                dvalue=np.abs(a["values"] - b["values"]).max(),
                dgrad=np.abs(a["gradients"] - b["gradients"]).max(),
                rel_dgrad=(
                    np.abs(a["gradients"] - b["gradients"]).max(axis=1)
                    / np.abs(ref_grads).max(axis=1)
                ).max(),
                a_setup=a["setup_s"],
                b_setup=b["setup_s"],
            )
            if b["object_mode"]:
                print(f"  (b) runs {', '.join(b['object_mode'])} in numba's object mode")
        rows.append(row)

    print(f"\nBest of {args.repeats} loops of calls at {len(THETAS)} θ points, numba backend:\n")
    print(
        "| G | max \\|Δ logp\\| (nats) | max \\|Δ grad\\| | max rel. Δ grad | (a) ms/call | "
        "(b) ms/call | (b) / (a) | setup s (a) / (b) |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        if "b_ms" in r:
            print(
                f"| {r['G']} | {r['dvalue']:.1e} | {r['dgrad']:.1e} | {r['rel_dgrad']:.1e} | "
                f"{r['a_ms']:.3f} | {r['b_ms']:.2f} | {r['b_ms'] / r['a_ms']:.0f}x | "
                f"{r['a_setup']:.0f} / {r['b_setup']:.0f} |"
            )
        else:
            print(f"| {r['G']} | — | — | — | {r['a_ms']:.3f} | skipped | — | — |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
