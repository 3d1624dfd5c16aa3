"""Sparse against dense Jacobians for a root's Newton solve and its implicit gradient (issue 15
item 1: ``root``/``fixed_point`` with ``structure="sparse"``).

Run ``python benchmarks/bench_sparse_root.py [n ...]`` (default 2,000 10,000 100,000). A script,
not a test: it prints one markdown table and exits 0 whatever the timings.

The problem: n equations on a chain, x_i³ + 2x_i − 0.5 x_{i−1} − 0.3 x_{i+1} = a_i (tridiagonal,
non-symmetric Jacobian), solved by ``pmo.root(..., method="newton")`` from x = 0; one call
returns x* and the gradient of Σ i·x*_i in a (the implicit rule's transposed solve). Columns:
seconds to compile (build + ``pytensor.function``), median seconds per call over `repeats`
calls (C backend, one BLAS thread), and for n ≤ 3,000 the dense structure's per-call time and
the ratio dense / sparse in the same run.
"""

from __future__ import annotations

import os
import sys
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import numpy as np  # noqa: E402
import pytensor  # noqa: E402
import pytensor.tensor as pt  # noqa: E402

import pymc_optim as pmo  # noqa: E402

DENSE_MAX = 3000  # a dense (n, n) Jacobian above this is minutes per call on this machine


def compiled(n: int, structure: str):
    x, a = pt.vector("x", shape=(n,)), pt.vector("a", shape=(n,))
    left = pt.concatenate([[0.0], x[:-1]])
    right = pt.concatenate([x[1:], [0.0]])
    equations = x**3 + 2 * x - 0.5 * left - 0.3 * right - a
    start = time.perf_counter()
    x_star, success = pmo.root(equations, x, x0=np.zeros(n), method="newton", structure=structure)
    loss = (x_star * np.arange(n)).sum()
    fn = pytensor.function([a], [x_star, success, pt.grad(loss, a)])
    return fn, time.perf_counter() - start


def per_call(fn, a, repeats: int) -> float:
    fn(a)  # the first call (compiled inner functions, the LU's column order)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        out = fn(a)
        times.append(time.perf_counter() - start)
    assert out[1], "the solve failed"
    return float(np.median(times))


def main():
    sizes = [int(s) for s in sys.argv[1:]] or [2000, 10_000, 100_000]
    print("| n | sparse compile (s) | sparse per call (s) | dense per call (s) | dense / sparse |")
    print("|---|---|---|---|---|")
    for n in sizes:
        a = np.linspace(-1.0, 2.0, n)
        fn, setup = compiled(n, "sparse")
        sparse = per_call(fn, a, repeats=5)
        if n <= DENSE_MAX:
            dense_fn, _ = compiled(n, "dense")
            dense = per_call(dense_fn, a, repeats=3)
            cells = f"{dense:.3f} | {dense / sparse:.1f}x"
            np.testing.assert_allclose(fn(a)[0], dense_fn(a)[0], rtol=1e-10)
        else:
            cells = "— | —"
        print(f"| {n:,} | {setup:.1f} | {sparse:.4f} | {cells} |", flush=True)


if __name__ == "__main__":
    main()
