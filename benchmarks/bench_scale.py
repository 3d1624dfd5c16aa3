"""Latent fields at scale: the CustomDist ICAR marginal at 10⁴, 10⁵ and 10⁶ values (issue 37
items 4 and 5).

Poisson counts with log rate b + σ φ, φ an ICAR on a side × side grid with PyMC's soft
sum-to-zero penalty written in a ``pm.CustomDist`` (`bench_low_rank.icar_poisson_model`):
"auto" finds H sparse plus rank one. Each size runs in a fresh process: build the model,
``marginalize_laplace``, compile PyMC's logp+gradient function (numba, the default backend),
the first call (numba compiles, or loads from its disk cache, the solver loop and kernels), then
five calls at nearby points (median). Peak memory is the process's resident high-water mark
(``VmHWM``) after each phase. The baseline is the arithmetic the marginal needs, measured in the
same process: one sparse Cholesky factorization of H's pattern and one selected inverse (the
log-determinant's gradient), by the same kernels.

Usage: ``python benchmarks/bench_scale.py [SIDE ...]`` (default 100 316 1000). Run it twice for
warm numba caches. The 10⁶ row needs about 6 GB.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).parent


def _peak_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM"):
            return int(line.split()[1]) / 1024
    return float("nan")


def child(side: int) -> dict:
    sys.path.insert(0, str(HERE))
    import bench_low_rank

    import pymc_optim as pmo
    from pymc_optim.linalg import _cholesky
    from pymc_optim.linalg.sparse import SparsePattern

    row: dict = {"n": side * side}
    model, edges, _ = bench_low_rank.icar_poisson_model(side, "CustomDist")
    start = time.perf_counter()
    marginal = pmo.marginalize_laplace(model, "phi")
    row["marginalize s"], row["peak after marginalize MB"] = time.perf_counter() - start, _peak_mb()
    start = time.perf_counter()
    fn = marginal.logp_dlogp_function(ravel_inputs=True)
    fn.set_extra_values({})
    row["compile s"], row["peak after compile MB"] = time.perf_counter() - start, _peak_mb()
    point = np.array([1.0, np.log(0.5)])
    start = time.perf_counter()
    value, gradient = fn(point)
    row["first call s"], row["peak after first call MB"] = time.perf_counter() - start, _peak_mb()
    assert np.isfinite(value) and np.all(np.isfinite(gradient))
    times = []
    for step in range(1, 6):
        start = time.perf_counter()
        fn(point + 0.01 * step)
        times.append(time.perf_counter() - start)
    row["logp+grad s"] = float(np.median(times))
    row["peak MB"] = _peak_mb()
    # the arithmetic: one factorization and one selected inverse of H's pattern
    n = side * side
    degree = np.bincount(edges.ravel(), minlength=n)
    lower = np.maximum(edges[:, 0], edges[:, 1]), np.minimum(edges[:, 0], edges[:, 1])
    pattern = SparsePattern(np.r_[np.arange(n), lower[0]], np.r_[np.arange(n), lower[1]], n)
    analysis = pattern._analysis()
    values = np.r_[degree + 1.0, -np.ones(len(edges))]
    factors, inverses = [], []
    for _ in range(3):
        start = time.perf_counter()
        x, _ = pattern._factor(values + 1e-3 * len(factors))
        factors.append(time.perf_counter() - start)
        start = time.perf_counter()
        _cholesky.selected_inverse(analysis, x)
        inverses.append(time.perf_counter() - start)
    row["factor s"], row["selected inverse s"] = min(factors), min(inverses)
    row["factor nnz M"] = analysis.factor_nnz / 1e6
    return row


def main(sides: list[int]) -> None:
    columns = [
        "n",
        "marginalize s",
        "compile s",
        "first call s",
        "logp+grad s",
        "factor s",
        "selected inverse s",
        "÷ (factor + sel. inv.)",
        "factor nnz M",
        "peak MB",
    ]
    print("| " + " | ".join(columns) + " |")
    print("|" + "---|" * len(columns))
    for side in sides:
        done = subprocess.run(
            [sys.executable, __file__, "--child", str(side)], capture_output=True, text=True
        )
        if done.returncode:
            print(f"| {side * side} | failed: {done.stderr.strip().splitlines()[-1]} |")
            continue
        row = json.loads(done.stdout.strip().splitlines()[-1])
        row["÷ (factor + sel. inv.)"] = row["logp+grad s"] / (
            row["factor s"] + row["selected inverse s"]
        )
        cells = [f"{row[c]:,.0f}" if c == "n" else f"{row[c]:.3g}" for c in columns]
        print("| " + " | ".join(cells) + " |", flush=True)


if __name__ == "__main__":
    if sys.argv[1:2] == ["--child"]:
        print(json.dumps(child(int(sys.argv[2]))))
    else:
        main([int(s) for s in sys.argv[1:]] or [100, 316, 1000])
