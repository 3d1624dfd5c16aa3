"""Peak memory of a dense Laplace marginal against the memory guard's estimate (issue 37 item 4).

Run ``python benchmarks/bench_memory.py [side ...] [--backends numba c]`` (default sides 20 30
40 50: N = 400 … 2,500). A script, not a test: it prints the table measured in this run and
exits 0 whatever the numbers are.

Model: a ``pm.CustomDist`` ICAR as users write it, on a side × side grid (N = side²): the
pairwise differences −½ Σ_edges (φ_i − φ_j)² plus PyMC's soft sum-to-zero penalty
−½ (Σφ / (0.001 N))², a rank-one term that makes the Hessian dense; y_i ~ Poisson(exp(b0 + φ_i)).
Each row is one fresh process (peak resident memory is per process): ``marginalize_laplace``
with ``hessian_structure="dense"`` ("auto" splits the penalty off as a rank-one update of a
sparse H, `pymc_optim.linalg.low_rank`), then ``logp_dlogp_function`` (what ``pm.sample``
compiles) and one logp and gradient. Columns: the growth of the peak resident set size over the
process's size before ``marginalize_laplace`` (ru_maxrss), the same in units of 8 N² bytes (one
N × N float64 matrix), and the guard's estimate (``dense_memory_estimate`` for that backend).
Keep the sides such that the peak stays well inside the machine's memory: the growth is ≈ 40 · 8
N² bytes.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import textwrap

CHILD = textwrap.dedent(
    """
    import json, sys
    import numpy as np
    import pytensor
    if sys.argv[2] == "c":
        pytensor.config.linker = "cvm"
    import pymc as pm
    from pymc.blocking import DictToArrayBijection
    import pymc_optim as pmo
    from pymc_optim.linalg.structure import LinearStructure
    from pymc_optim.model import laplace_structure

    side = int(sys.argv[1])
    n = side * side
    index = np.arange(n).reshape(side, side)
    i = np.concatenate([index[:, :-1].ravel(), index[:-1, :].ravel()])
    j = np.concatenate([index[:, 1:].ravel(), index[1:, :].ravel()])
    y = np.random.default_rng(0).poisson(1.5, n)

    def logp(value):
        pairwise = -0.5 * ((value[i] - value[j]) ** 2).sum()
        return pairwise - 0.5 * (value.sum() / (0.001 * n)) ** 2

    with pm.Model() as model:
        b0 = pm.Normal("b0", 0.0, 1.0)
        phi = pm.CustomDist("phi", logp=logp, shape=n)
        pm.Poisson("y", pm.math.exp(b0 + phi), observed=y)

    def status(field):
        with open("/proc/self/status") as lines:
            return next(int(l.split()[1]) * 1024 for l in lines if l.startswith(field + ":"))

    # the high-water mark reset to the resident memory now (Linux's clear_refs): a transient
    # peak of the imports or the model's construction does not count as growth
    with open("/proc/self/clear_refs", "w") as refs:
        refs.write("5")
    base = status("VmRSS")
    width = laplace_structure.latent_width(model, [phi], n)
    estimate = laplace_structure.dense_memory_estimate(LinearStructure("dense"), n, width=width)
    marginal = pmo.marginalize_laplace(model, "phi", hessian_structure="dense")
    f = marginal.logp_dlogp_function(ravel_inputs=True)
    f.set_extra_values({})
    point = marginal.initial_point()
    f(DictToArrayBijection.map({v.name: point[v.name] for v in f._grad_vars}).data)
    peak = status("VmHWM")
    print(json.dumps({"grew": peak - base, "estimate": estimate, "width": width}))
    """
)


def measure(side: int, backend: str) -> dict:
    done = subprocess.run(
        [sys.executable, "-c", CHILD, str(side), backend], capture_output=True, text=True
    )
    if done.returncode != 0:
        return {"error": done.stderr.strip().splitlines()[-1]}
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("sides", nargs="*", type=int, default=[20, 30, 40, 50])
    parser.add_argument("--backends", nargs="*", default=["numba", "c"])
    args = parser.parse_args()
    print("| N | backend | w | peak growth MB | N × N matrices | estimate MB | estimate / peak |")
    print("|---|---|---|---|---|---|---|")
    for backend in args.backends:
        for side in args.sides:
            n = side * side
            row = measure(side, backend)
            if "error" in row:
                print(f"| {n:,} | {backend} | | failed: {row['error']} | | | |")
                continue
            grew, estimate = row["grew"], row["estimate"]
            print(
                f"| {n:,} | {backend} | {row['width']:.2f} | {grew / 1e6:,.0f} | "
                f"{grew / (8 * n * n):.1f} | {estimate / 1e6:,.0f} | {estimate / grew:.2f} |",
                flush=True,
            )


if __name__ == "__main__":
    main()
