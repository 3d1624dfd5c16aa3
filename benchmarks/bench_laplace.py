"""Laplace marginal vs full-model NUTS: effective samples per second of the hyperparameters.

Run ``python benchmarks/bench_laplace.py`` (about 8 minutes on 2 cores) or ``--quick`` for a
smoke run (few draws; the numbers are then meaningless). This is a script, not a test: it prints
one markdown table and the target lines, and exits 0 whatever the timings.

Extra install: contender (e) needs blackjax (``pip install "blackjax>=1.7"``, not in any extra
of ``pyproject.toml``: no test uses it); without it, (e) and the blackjax-driven (a) are skipped.

The problem
-----------
Poisson random intercepts, G groups with 5 counts each, simulated once per G with a fixed seed
(mu = 0.5, sigma = 0.7):

    mu ~ N(0, 2),  sigma ~ HalfNormal(1),  u_g ~ N(0, sigma),  y_gj ~ Poisson(exp(mu + u_g)).

The hyperparameters are θ = (mu, sigma), the latent field is u. ``--design mixed`` replaces the
5 counts per group by groups of 1, 5 and 50 counts (a third each): a posterior on which neither
parametrization of the full model suits every group.

Contenders (same data, same priors, same draws, tune and seed)
---------------------------------------------------------------
(a) ``pmo.marginalize_laplace(model, "u", hessian_structure="diagonal")``: graph-native Newton,
    sampled by PyMC's NUTS (C backend), by nutpie (numba backend) and by blackjax NUTS with
    window adaptation on the model's JAX logp (``pymc.sampling.jax.get_jaxified_logp``, JAX
    backend), the last so that the JAX comparison with (e) differs only in the marginal.
(b) the full model, centered (u ~ N(0, sigma)), PyMC NUTS and nutpie.
(c) the full model, non-centered (u = sigma·z, z ~ N(0, 1)), PyMC NUTS and nutpie.
(d) a hand-built Laplace marginal with the upstream Op, what a user would write without
    pymc_optim: ``pytensor.tensor.optimize.minimize`` (scipy BFGS, its default) of −log p(y, u | θ)
    from u = 0, the Hessian by ``pytensor.gradient.hessian`` (a scan), log det by Cholesky
    (``slogdet`` overflows: see ``hand_built_model``); a Potential in a model of (mu, sigma),
    PyMC NUTS. Its logp and gradient equal (a)'s to ~1e-8. It costs ~10 ms per gradient at
    G = 30 (sampled: ~3 minutes) and ~2.5 s at G = 300 (hours), so at G = 300 it is *estimated*:
    same gradient count and ESS as (a) (NUTS on the same density follows the same trajectories),
    times its own cost per gradient timed at 10 posterior draws. Draws near the posterior need
    fewer BFGS iterations than tuning's early points, so the estimate flatters (d).
(e) blackjax's ``laplace_marginal_factory`` (L-BFGS inner solve, dense ``jax.hessian``,
    ``slogdet``) on the same log joint written in JAX, blackjax NUTS with window adaptation.

How it is measured
------------------
ESS is the minimum bulk ESS over (mu, sigma) of the kept draws (ArviZ); the wall time is that of
tuning plus drawing, compile and JIT excluded: PyMC's ``sampling_time`` (it starts after the
logp/gradient function is compiled, but includes the lazy compilation of pymc_optim's inner
functions at the first evaluation, a fraction of a second); nutpie after
``compile_pymc_model``; for blackjax the whole chain (adaptation + draws) is one ``jax.jit``
compiled ahead of time (``.lower().compile()``) and then timed. Chains run one after the other
(``cores=1``). "grads" counts leapfrog steps (gradient evaluations) over tuning and drawing, so
"ms/grad" is the cost of one logp+gradient evaluation inside the sampler. One BLAS thread.

A second table profiles (a): the cost of one logp+gradient of (a) and of (b) outside the
sampler (C backend) and the Newton iterations and function evaluations per inner solve.

Targets: (a) ≥ 5x the better of (b), (c) at G = 300, ≥ 100x (d), ≥ 50x (e).

Results
-------
See ``benchmarks/README.md``: the tables of the last full run and what they say.
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

import arviz as az  # noqa: E402
import numpy as np  # noqa: E402
import pymc as pm  # noqa: E402
import pytensor  # noqa: E402
import pytensor.tensor as pt  # noqa: E402
import scipy.special  # noqa: E402
from _sampling import sample_nutpie, sample_pymc  # noqa: E402
from pytensor.graph.replace import graph_replace  # noqa: E402

import pymc_optim as pmo  # noqa: E402

SIZES = (30, 300)
PER_GROUP = 5
MU_TRUE, SIGMA_TRUE = 0.5, 0.7
DRAWS, TUNE, CHAINS, SEED = 1000, 1000, 2, 1
HYPER = ("mu", "sigma")
TARGETS = {"full": 5.0, "hand-built": 100.0, "blackjax": 50.0}
TARGET_G = 300
#: (d) costs ~7 ms per gradient at G = 30 (a 4-minute run) and ~2.4 s at G = 300 (hours): above
#: this G it is estimated from its timed cost per gradient (see estimate_from_gradient_cost).
HAND_BUILT_MAX_G = 30
HAND_BUILT_POINTS = 10


# --- the problem --------------------------------------------------------------------------------
def simulate(G: int, design: str = "equal") -> tuple[np.ndarray, np.ndarray]:
    """Counts and group index: `PER_GROUP` counts per group, or (``"mixed"``) a third of the
    groups with 1 count, a third with 5 and a third with 50."""
    rng = np.random.default_rng(G)
    sizes = np.full(G, PER_GROUP) if design == "equal" else np.arange(G) * 3 // G
    if design == "mixed":
        sizes = np.array([1, 5, 50])[sizes]
    group = np.repeat(np.arange(G), sizes)
    u = rng.normal(0.0, SIGMA_TRUE, G)
    return rng.poisson(np.exp(MU_TRUE + u[group])), group


def full_model(y, group, G: int, centered: bool) -> pm.Model:
    with pm.Model() as model:
        mu = pm.Normal("mu", 0.0, 2.0)
        sigma = pm.HalfNormal("sigma", 1.0)
        if centered:
            u = pm.Normal("u", 0.0, sigma, shape=G)
        else:
            u = pm.Deterministic("u", sigma * pm.Normal("z", 0.0, 1.0, shape=G))
        pm.Poisson("y", pt.exp(mu + u[group]), observed=y)
    return model


def marginal_model(y, group, G: int) -> pm.Model:
    return pmo.marginalize_laplace(
        full_model(y, group, G, centered=True), "u", hessian_structure="diagonal"
    )


def hand_built_model(y, group, G: int) -> pm.Model:
    """(d): the Laplace marginal written with pytensor.tensor.optimize.minimize."""
    from pytensor.gradient import hessian
    from pytensor.tensor.optimize import minimize

    # log p(y, u | θ) on plain symbolic θ, u: `hessian` builds a scan whose inner graph would
    # otherwise swallow the random variables' RNGs, which PyMC cannot compile.
    mu, sigma = pt.scalar("mu"), pt.scalar("sigma")
    u = pt.vector("u", shape=(G,))
    eta = mu + u[group]
    joint = (
        -0.5 * pt.sum((u / sigma) ** 2)
        - G * pt.log(sigma)
        - 0.5 * G * np.log(2 * np.pi)
        + pt.sum(y * eta - pt.exp(eta))
        - scipy.special.gammaln(y + 1).sum()
    )
    u_star, _ = minimize(-joint, u)  # the Op's input u is also its starting point
    u_star = graph_replace(u_star, {u: pt.zeros(G)})
    # log det by Cholesky: with `slogdet`, the compiled logp-and-gradient function evaluates
    # log(det(H)), which overflows to inf at G = 300.
    logdet = 2.0 * pt.log(pt.diag(pt.linalg.cholesky(hessian(-joint, u)))).sum()
    marginal = graph_replace(joint + 0.5 * G * np.log(2 * np.pi) - 0.5 * logdet, {u: u_star})
    with pm.Model() as model:
        theta = {mu: pm.Normal("mu", 0.0, 2.0), sigma: pm.HalfNormal("sigma", 1.0)}
        pm.Potential("laplace", graph_replace(marginal, theta))
    return model


def blackjax_log_joint(y, group):
    """(e): log p(y, u, mu, log sigma) in JAX, with the log-Jacobian of sigma = exp(log sigma)."""
    import jax.numpy as jnp
    from jax.scipy import stats

    def log_joint(u, phi):
        mu, log_sigma = phi[0], phi[1]
        sigma = jnp.exp(log_sigma)
        return (
            stats.norm.logpdf(mu, 0.0, 2.0)
            + stats.norm.logpdf(sigma, 0.0, 1.0)
            + log_sigma
            + stats.norm.logpdf(u, 0.0, sigma).sum()
            + stats.poisson.logpmf(y, jnp.exp(mu + u[group])).sum()
        )

    return log_joint


# --- samplers -----------------------------------------------------------------------------------
def run_pymc(model: pm.Model, draws: int, tune: int) -> dict:
    return _result(*sample_pymc(model, draws, tune, CHAINS, SEED))


def run_nutpie(model: pm.Model, draws: int, tune: int) -> dict:
    return _result(*sample_nutpie(model, draws, tune, CHAINS, SEED))


def run_blackjax(logdensity, draws: int, tune: int) -> dict:
    """Blackjax NUTS with window adaptation on θ = (mu, log sigma), one jitted call per chain."""
    import blackjax
    import jax
    import jax.numpy as jnp

    def chain(key, position):
        warmup_key, sample_key = jax.random.split(key)
        adaptation = blackjax.window_adaptation(blackjax.nuts, logdensity)
        (state, parameters), warmup = adaptation.run(warmup_key, position, num_steps=tune)
        kernel = blackjax.nuts(logdensity, **parameters).step

        def one_step(state, key):
            state, info = kernel(key, state)
            return state, (state.position, info.num_integration_steps)

        _, (positions, steps) = jax.lax.scan(one_step, state, jax.random.split(sample_key, draws))
        return positions, steps.sum() + warmup.info.num_integration_steps.sum()

    keys = jax.random.split(jax.random.key(SEED), CHAINS)
    # PyMC's default start: the initial point (mu = 0, log sigma = 0) jittered by U(-1, 1).
    starts = np.random.default_rng(SEED).uniform(-1.0, 1.0, (CHAINS, 2))
    compiled = jax.jit(chain).lower(keys[0], jnp.asarray(starts[0])).compile()
    t0 = time.perf_counter()
    outputs = [compiled(k, jnp.asarray(s)) for k, s in zip(keys, starts, strict=True)]
    for positions, _ in outputs:
        positions.block_until_ready()
    seconds = time.perf_counter() - t0
    positions = np.stack([np.asarray(p) for p, _ in outputs])
    steps = int(sum(int(s) for _, s in outputs))
    posterior = {"mu": positions[..., 0], "sigma": np.exp(positions[..., 1])}
    return _result(az.convert_to_dataset(posterior), seconds, steps)


def _result(posterior, seconds: float, steps: int) -> dict:
    ess = min(float(az.ess(posterior, var_names=list(HYPER))[v]) for v in HYPER)
    return {
        "ess": ess,
        "seconds": float(seconds),
        "steps": steps,
        "means": {v: float(posterior[v].mean()) for v in HYPER},
        "posterior": posterior,
        "estimated": False,
    }


def estimate_from_gradient_cost(model: pm.Model, reference: dict, n_points: int) -> dict:
    """ESS/s of a model whose logp equals the reference's (to solver tolerance), without sampling.

    NUTS on two implementations of the same density follows the same trajectories, so it takes
    the same number of gradient evaluations for the same ESS; only the cost per evaluation
    differs. That cost is timed at `n_points` posterior draws of the reference (the inner solve's
    work depends on θ) and multiplied by the reference's gradient count.
    """
    fn = model.logp_dlogp_function(ravel_inputs=True)
    fn.set_extra_values({})
    posterior = reference["posterior"]
    chain, draw = posterior["mu"].shape
    picks = np.random.default_rng(SEED).choice(chain * draw, n_points, replace=False)
    values = {"mu": posterior["mu"].values.ravel(), "sigma": posterior["sigma"].values.ravel()}
    to_value = {
        "mu": lambda i: values["mu"][i],
        "sigma_log__": lambda i: np.log(values["sigma"][i]),
    }
    points = [np.array([to_value[v.name](i) for v in model.value_vars]) for i in picks]
    fn(points[0])  # lazy compilation of inner functions
    t0 = time.perf_counter()
    for x in points:
        fn(x)
    per_gradient = (time.perf_counter() - t0) / n_points
    return {
        **reference,
        "seconds": per_gradient * reference["steps"],
        "estimated": True,
    }


def profile_marginal(y, group, G: int, reference: dict, n_points: int) -> dict:
    """Cost of one logp+gradient of (a) and of (b) (C backend), and Newton's work per solve.

    Timed at `n_points` posterior draws of the reference run, outside the sampler. The
    iteration and evaluation counts are the NewtonOp's own outputs.
    """
    from pytensor.graph.traversal import ancestors

    from pymc_optim.backends.newton import NewtonOp

    marginal = marginal_model(y, group, G)
    node = next(
        v.owner
        for v in ancestors(marginal.potentials)
        if v.owner is not None and isinstance(v.owner.op, NewtonOp)
    )
    k = node.op.n_controls
    counts = marginal.replace_rvs_by_values(node.outputs[k + 1 : k + 3])
    count_fn = pytensor.function(marginal.value_vars, counts, on_unused_input="ignore")
    posterior = reference["posterior"]
    picks = np.random.default_rng(SEED).choice(posterior["mu"].size, n_points, replace=False)
    theta = {
        "mu": posterior["mu"].values.ravel()[picks],
        "sigma_log__": np.log(posterior["sigma"].values.ravel()[picks]),
    }
    names = [v.name for v in marginal.value_vars]
    points = [np.array([theta[name][i] for name in names]) for i in range(n_points)]
    work = np.array([[int(c) for c in count_fn(*x)] for x in points])

    full = full_model(y, group, G, centered=True)
    full_points = []
    for x in points:
        value = dict(zip(names, x, strict=True))
        full_points.append(
            np.concatenate(
                [
                    np.atleast_1d(value[v.name]) if v.name in value else np.zeros(G)
                    for v in full.value_vars
                ]
            )
        )
    return {
        "marginal_us": _time_per_call(marginal, points),
        "full_us": _time_per_call(full, full_points),
        "iterations": work[:, 0].mean(),
        "evaluations": work[:, 1].mean(),
    }


def _time_per_call(model: pm.Model, points: list[np.ndarray], repeats: int = 20) -> float:
    fn = model.logp_dlogp_function(ravel_inputs=True)
    fn.set_extra_values({})
    fn(points[0])
    t0 = time.perf_counter()
    for _ in range(repeats):
        for x in points:
            fn(x)
    return 1e6 * (time.perf_counter() - t0) / (repeats * len(points))


# --- contenders ---------------------------------------------------------------------------------
def contenders(G: int, have_blackjax: bool, design: str):
    y, group = simulate(G, design)
    out = {
        "(a) marginal, PyMC NUTS": lambda d, t: run_pymc(marginal_model(y, group, G), d, t),
        "(a) marginal, nutpie": lambda d, t: run_nutpie(marginal_model(y, group, G), d, t),
        "(b) full centered, PyMC NUTS": lambda d, t: run_pymc(
            full_model(y, group, G, centered=True), d, t
        ),
        "(b) full centered, nutpie": lambda d, t: run_nutpie(
            full_model(y, group, G, centered=True), d, t
        ),
        "(c) full non-centered, PyMC NUTS": lambda d, t: run_pymc(
            full_model(y, group, G, centered=False), d, t
        ),
        "(c) full non-centered, nutpie": lambda d, t: run_nutpie(
            full_model(y, group, G, centered=False), d, t
        ),
    }
    if G <= HAND_BUILT_MAX_G:
        out["(d) hand-built optimize.minimize, PyMC NUTS"] = lambda d, t: run_pymc(
            hand_built_model(y, group, G), d, t
        )
    out["(d) hand-built optimize.minimize, PyMC NUTS, estimated"] = lambda d, t, reference: (
        estimate_from_gradient_cost(hand_built_model(y, group, G), reference, HAND_BUILT_POINTS)
    )
    if have_blackjax:
        out["(a) marginal, JAX + blackjax NUTS"] = lambda d, t: run_blackjax(
            _jax_logdensity(marginal_model(y, group, G)), d, t
        )
        out["(e) blackjax laplace_marginal_factory"] = lambda d, t: run_blackjax(
            _blackjax_laplace_logdensity(y, group, G), d, t
        )
    return out


def _jax_logdensity(model: pm.Model):
    """The model's logp on (mu, log sigma), as JAX: the same graph the JAX backend compiles."""
    from pymc.sampling.jax import get_jaxified_logp

    names = [v.name for v in model.value_vars]
    assert sorted(names) == ["mu", "sigma_log__"], names
    logp = get_jaxified_logp(model)
    order = [("mu", "sigma_log__").index(name) for name in names]
    return lambda x: logp([x[i] for i in order])


def _blackjax_laplace_logdensity(y, group, G: int):
    import jax.numpy as jnp
    from blackjax.mcmc.laplace_marginal import laplace_marginal_factory

    laplace = laplace_marginal_factory(blackjax_log_joint(y, group), jnp.zeros(G))
    return lambda phi: laplace(phi)[0]


# --- main ---------------------------------------------------------------------------------------
def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="100 draws, 100 tune: smoke run")
    parser.add_argument("--sizes", type=int, nargs="+", default=list(SIZES))
    parser.add_argument(
        "--design",
        choices=["equal", "mixed"],
        default="equal",
        help="5 counts per group (the standard problem) or groups of 1, 5 and 50 counts",
    )
    parser.add_argument("--only", nargs="*", default=None, help="contenders whose label has this")
    args = parser.parse_args(argv)
    draws, tune = (100, 100) if args.quick else (DRAWS, TUNE)
    warnings.filterwarnings("ignore")
    pytensor.config.compute_test_value = "off"
    try:
        import blackjax  # noqa: F401

        have_blackjax = True
    except ImportError:
        have_blackjax = False
        print("blackjax not installed: (e) and (a) under blackjax NUTS are skipped")

    rows, by_label = [], {}
    for G in args.sizes:
        for label, run in contenders(G, have_blackjax, args.design).items():
            if args.only and not any(s in label for s in args.only):
                continue
            t0 = time.perf_counter()
            try:
                if label.endswith("estimated"):
                    result = run(draws, tune, by_label[(G, "(a) marginal, PyMC NUTS")])
                else:
                    result = run(draws, tune)
            except Exception as error:  # a contender that cannot run is reported, not fatal
                print(f"G={G} {label}: failed: {type(error).__name__}: {error}"[:300])
                continue
            result.update(G=G, label=label, total=time.perf_counter() - t0)
            rows.append(result)
            by_label[(G, label)] = result
            print(
                f"G={G} {label}: ESS {result['ess']:.0f}, {result['seconds']:.2f} s "
                f"(with compile {result['total']:.1f} s)",
                file=sys.stderr,
            )
    print_table(rows, draws, tune)
    print("\nWhere (a) spends its time (C backend, at 50 posterior draws of (a), cold start):\n")
    print("| G | (a) logp+grad µs | (b) logp+grad µs | ratio | Newton iterations | evaluations |")
    print("|---|---|---|---|---|---|")
    for G in args.sizes:
        reference = by_label.get((G, "(a) marginal, PyMC NUTS"))
        if reference is None:
            continue
        y, group = simulate(G, args.design)
        prof = profile_marginal(y, group, G, reference, n_points=50)
        print(
            f"| {G} | {prof['marginal_us']:.0f} | {prof['full_us']:.1f} | "
            f"{prof['marginal_us'] / prof['full_us']:.1f} | {prof['iterations']:.2f} | "
            f"{prof['evaluations']:.2f} |"
        )
    return 0


def print_table(rows: list[dict], draws: int, tune: int) -> None:
    print(f"\n{CHAINS} chains x ({tune} tune + {draws} draws), seed {SEED}, cores=1\n")
    print(
        "| G | contender | min bulk ESS | wall s | ESS/s | grads | ms/grad | mean mu | mean sigma |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        rate = r["ess"] / r["seconds"]
        per_grad = 1e3 * r["seconds"] / r["steps"] if r["steps"] else float("nan")
        print(
            f"| {r['G']} | {r['label']} | {r['ess']:.0f} | {r['seconds']:.2f} | {rate:.1f} | "
            f"{r['steps']} | {per_grad:.3f} | {r['means']['mu']:.3f} | "
            f"{r['means']['sigma']:.3f} |"
        )
    print()
    by = {(r["G"], r["label"]): r["ess"] / r["seconds"] for r in rows}
    for G in sorted({r["G"] for r in rows}):
        for backend in ("PyMC NUTS", "nutpie"):
            a = by.get((G, f"(a) marginal, {backend}"))
            full = [
                by.get((G, f"({k}) full {p}, {backend}"))
                for k, p in (("b", "centered"), ("c", "non-centered"))
            ]
            full = [f for f in full if f is not None]
            if a is not None and full:
                _ratio_line(G, f"(a)/best of (b),(c), {backend}", a / max(full), TARGETS["full"])
        a = by.get((G, "(a) marginal, PyMC NUTS"))
        for label in (
            "(d) hand-built optimize.minimize, PyMC NUTS",
            "(d) hand-built optimize.minimize, PyMC NUTS, estimated",
        ):
            d = by.get((G, label))
            if a is not None and d is not None:
                what = "(a)/(d), PyMC NUTS" + (
                    " (d estimated)" if label.endswith("estimated") else ""
                )
                _ratio_line(G, what, a / d, TARGETS["hand-built"])
        e = by.get((G, "(e) blackjax laplace_marginal_factory"))
        for label in (
            "(a) marginal, JAX + blackjax NUTS",
            "(a) marginal, nutpie",
            "(a) marginal, PyMC NUTS",
        ):
            a = by.get((G, label))
            if a is not None and e is not None:
                _ratio_line(
                    G, f"{label.removeprefix('(a) marginal, ')} (a)/(e)", a / e, TARGETS["blackjax"]
                )


def _ratio_line(G: int, what: str, ratio: float, target: float) -> None:
    judged = G == TARGET_G
    verdict = ("PASS" if ratio >= target else "FAIL") if judged else "(not judged)"
    print(f"G={G}: {what} = {ratio:.2f}x (target {target:g}x) {verdict}")


if __name__ == "__main__":
    sys.exit(main())
