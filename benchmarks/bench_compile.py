"""Seconds from a model to a compiled Laplace marginal and to recovered latents, cold and warm
compile caches (issue 19 item 4: ≤ 60 s each for every model of ``bench_coupled.py``; issue 35
item 5: ≤ 60 s cold and ≤ 10 s warm to the first logp+gradient).

Run ``python benchmarks/bench_compile.py [--models finland100 icar100 ...] [--warm]``. A script,
not a test: it prints one markdown table and exits 0 whatever the timings.

Each model runs in its own child process with an empty PyTensor compile directory and numba
cache directory (what a user meets on a new machine, or after a PyTensor upgrade): nothing is
reused from an earlier model or run, not even PyTensor's own modules that any model needs.
With ``--warm`` a second, fresh child process then runs the same model with the two directories
the first one filled (what a user meets when running the model again the next day): a second
row per model, "warm". The cold row is that of the first child, so one run gives both.
Columns, each its own step in that order:

- *import*: ``import pymc, pymc_optim`` in the child (not part of the total);
- *build*: ``pmo.marginalize_laplace(model, latent)`` (the structure probe included);
- *compile*: ``logp_dlogp_function`` (what ``pm.sample`` compiles), default backend (numba);
- *first call*: one logp+gradient at the initial point (the first inner solve);
- *sample 10+10*: ``pm.sample(10, tune=10, chains=1)`` on the marginal, which compiles its own
  functions again (PyMC's), so that recovery has a posterior to work on;
- *recover*: ``pmo.recover_latent`` on those 10 draws, its compilation included (its figure is
  compile-dominated: a draw costs milliseconds).

*total to a marginal* = build + compile + first call. The cold target (≤ 60 s) applies to it
and to *recover*, the warm target (≤ 10 s) to it.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

MODELS = {
    "finland100": "Finland GP, 100 counties",
    "finland500": "GP, 500 synthetic points",
    "hsgp": "Finland as pm.gp.HSGP(m=[10, 10])",
    "icar100": "ICAR, 100 areas",
    "icar1000": "ICAR, 1,000 areas (dense)",
    "ar1000": "AR(1), 1,000 steps",
    "bym200": "BYM, 100 areas (200 latent values)",
    "germany": "Germany BYM2, 544 districts (1,087 latent values, sparse)",
}


def bym_model(n: int = 100, seed: int = 19):
    """Besag–York–Mollié: a pm.ICAR field and an iid one on `bench_coupled`'s ring of areas,
    both marginalized (2n latent values): the model whose `recover_latent` once generated an
    11.5 MB C module and compiled for 28 minutes (issue 19)."""
    import numpy as np
    import pymc as pm
    import pytensor.tensor as pt
    from bench_coupled import ring_adjacency

    rng = np.random.default_rng(seed)
    adjacency = ring_adjacency(n)
    with pm.Model() as model:
        b = pm.Normal("b", 0.0, 2.0)
        sigma_phi = pm.HalfNormal("sigma_phi", 1.0)
        sigma_theta = pm.HalfNormal("sigma_theta", 1.0)
        phi = pm.ICAR("phi", W=adjacency)
        theta = pm.Normal("theta", 0.0, 1.0, shape=n)
        rate = pt.exp(b + sigma_phi * phi + sigma_theta * theta)
        pm.Poisson("y", mu=rate, observed=rng.poisson(np.exp(1.0 + rng.normal(0, 0.5, n))))
    return model, ["phi", "theta"]


def build_model(key: str):
    """(model, latent name or names) of `key`, as `bench_coupled.py` builds them."""
    from bench_coupled import ar_model, hsgp_model, icar_model, synthetic_finland

    from pymc_optim.datasets import finland_model, load_finland

    if key == "finland100":
        return finland_model(load_finland()), "theta"
    if key == "finland500":
        return finland_model(synthetic_finland(500)), "theta"
    if key == "hsgp":
        return hsgp_model(load_finland()), "theta"
    if key == "bym200":
        return bym_model()
    if key == "germany":
        from pymc_optim.datasets import germany_bym2_model

        return germany_bym2_model(), ["phi", "theta"]
    if key.startswith("icar"):
        return icar_model(int(key[4:])), "phi"
    return ar_model(1000), "f"


def measure(key: str) -> dict:
    """The figures of one model, in this process (whose compile directory is empty)."""
    import warnings

    t0 = time.perf_counter()
    import numpy as np
    import pymc as pm

    import pymc_optim as pmo

    seconds = {"import": time.perf_counter() - t0}
    warnings.simplefilter("ignore")
    model, latent = build_model(key)
    t0 = time.perf_counter()
    marginal = pmo.marginalize_laplace(model, latent)
    seconds["build"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    fn = marginal.logp_dlogp_function(ravel_inputs=True)
    seconds["compile"] = time.perf_counter() - t0
    fn.set_extra_values({})
    point = marginal.initial_point()
    q = np.concatenate([np.ravel(point[v.name]) for v in fn._grad_vars])
    t0 = time.perf_counter()
    fn(q)
    seconds["first call"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    with marginal:
        idata = pm.sample(
            10,
            tune=10,
            chains=1,
            cores=1,
            random_seed=1,
            progressbar=False,
            compute_convergence_checks=False,
        )
    seconds["sample 10+10"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    pmo.recover_latent(marginal, idata, random_seed=2, progressbar=False)
    seconds["recover"] = time.perf_counter() - t0
    return seconds


COLUMNS = ["import", "build", "compile", "first call", "sample 10+10", "recover"]


def run_child(key: str, compiledir: str) -> dict | str:
    """`measure(key)` in a fresh process whose PyTensor compile directory and numba cache are
    under `compiledir`; its seconds, or the last line of its error."""
    flags = [os.environ.get("PYTENSOR_FLAGS", ""), f"base_compiledir={compiledir}"]
    env = dict(os.environ, PYTENSOR_FLAGS=",".join(f for f in flags if f))
    env["NUMBA_CACHE_DIR"] = os.path.join(compiledir, "numba")  # the kernels with cache=True
    child = subprocess.run(
        [sys.executable, __file__, "--child", key],
        env=env,
        capture_output=True,
        text=True,
        cwd=os.path.dirname(__file__),
    )
    if child.returncode != 0:
        lines = child.stderr.strip().splitlines() or [f"exit {child.returncode}"]
        return lines[-1]
    return json.loads(child.stdout.strip().splitlines()[-1])


def print_row(key: str, caches: str, s: dict | str) -> None:
    if isinstance(s, str):
        print(f"| {MODELS[key]} | {caches} | failed: {s} |", flush=True)
        return
    total = s["build"] + s["compile"] + s["first call"]
    if caches == "warm":
        met = "met" if total <= 10 else "not met"
    else:
        met = "met" if max(total, s["recover"]) <= 60 else "not met"
    cells = " | ".join(f"{s[c]:.1f}" for c in COLUMNS)
    print(f"| {MODELS[key]} | {caches} | {cells} | {total:.1f} | {met} |", flush=True)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    parser.add_argument(
        "--warm", action="store_true", help="then again in a fresh process with the filled caches"
    )
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(measure(args.child)))
        return
    from _timing import git_revision

    import pymc_optim as pmo

    runs = "empty, then warm" if args.warm else "empty"
    print(f"commit {git_revision(pmo.__file__)}; caches per model: {runs}\n")
    target = "≤ 60 s cold, ≤ 10 s warm" if args.warm else "≤ 60 s"
    print(f"| model | caches | {' | '.join(COLUMNS)} | total to a marginal | {target} |")
    print("|---|---|" + "---|" * (len(COLUMNS) + 2), flush=True)
    for key in args.models:
        with tempfile.TemporaryDirectory(prefix="pytensor-cold-") as compiledir:
            cold = run_child(key, compiledir)
            print_row(key, "empty", cold)
            if args.warm and not isinstance(cold, str):
                print_row(key, "warm", run_child(key, compiledir))


if __name__ == "__main__":
    main()
