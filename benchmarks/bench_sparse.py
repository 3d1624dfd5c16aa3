"""Sparse Cholesky backends for GMRF Hessians H = τ·L_grid + diag(w) (issue 15).

Run ``python benchmarks/bench_sparse.py`` (about a minute on 2 cores) or ``--quick`` (n = 10⁴
only). A script, not a test: it prints a markdown table of times measured in this run and exits
0 whatever the timings (1 only if a backend's log-determinant disagrees with ours).

H is the 2-D grid Laplacian (4-neighbour, m × m, n = m²) times τ = 1.7 plus a diagonal w ~ U(0.5,
2): the Hessian of an ICAR latent field with a Poisson likelihood. Columns: **analyse** (fill-
reducing ordering + symbolic factorization, once per pattern), **refactor** (numeric
factorization with new values, the per-evaluation cost), **logdet**, **solve** (one right-hand
side), **selinv** (entries of H⁻¹ on the pattern of H: what the gradient of log det H needs), and
the ratio selinv / refactor. Each time is the fastest of ``--repeat`` calls after a warm-up call.

Backends: ``pymc_optim`` (ours: numba supernodal Cholesky on a postordered minimum-degree
ordering with relaxed supernodes, supernodal Takahashi selected inverse; the `sparse` extra),
``pymc_optim, reference kernels`` (the tested references they replaced: simplicial up-looking
factorization, column Takahashi recurrences), ``scipy splu`` (SuperLU; no symbolic
reuse, so every refactor is a full analyse + factor; no selected inverse), and, when importable,
``sparsax`` (CHOLMOD in an XLA custom call; cached symbolic analysis) and ``scikit-sparse``
(CHOLMOD via ``sksparse.cholmod``; no selected inverse). "—" marks what a backend lacks.
"""

from __future__ import annotations

import argparse
import sys
import time

import numpy as np
import scipy.sparse as sp


def grid_hessian(m: int, seed: int = 0) -> sp.coo_matrix:
    """τ·L_grid + diag(w) on an m × m grid, as a full symmetric COO matrix."""
    rng = np.random.default_rng(seed)
    path = sp.diags([-1.0, 2.0, -1.0], [-1, 0, 1], shape=(m, m))
    eye = sp.identity(m)
    laplacian = sp.kron(eye, path) + sp.kron(path, eye)
    return (1.7 * laplacian + sp.diags(rng.uniform(0.5, 2.0, m * m))).tocoo()


def best(function, repeat: int) -> float:
    function()
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        function()
        times.append(time.perf_counter() - start)
    return min(times)


def bench_ours(H, repeat):
    from pymc_optim.linalg import _cholesky as ch

    lower = sp.tril(H).tocoo()
    n = H.shape[0]
    b = np.random.default_rng(1).normal(size=n)
    analyse = best(lambda: ch.analyse(lower.row, lower.col, n), 1)
    symbolic = ch.analyse(lower.row, lower.col, n)
    lx, _ = ch.factorize(symbolic, lower.data)
    return {
        "analyse": analyse,
        "refactor": best(lambda: ch.factorize(symbolic, lower.data), repeat),
        "logdet": best(lambda: ch.logdet(symbolic, lx), repeat),
        "solve": best(lambda: ch.solve(symbolic, lx, b), repeat),
        "selinv": best(lambda: ch.selected_inverse(symbolic, lx), repeat),
        "value": ch.logdet(symbolic, lx),
        "note": f"nnz(L) = {symbolic.factor_nnz:.3g}, {symbolic.factor_flops:.3g} multiply-adds",
    }


def bench_reference(H, repeat):
    """Ours with the tested reference kernels: simplicial up-looking factorization and the
    column Takahashi recurrences (what the supernodal kernels replaced)."""
    from pymc_optim.linalg import _cholesky as ch

    lower = sp.tril(H).tocoo()
    n = H.shape[0]
    symbolic = ch.analyse(lower.row, lower.col, n)
    lx, _ = ch.factorize_simplicial(symbolic, lower.data)
    return {
        "analyse": None,
        "refactor": best(lambda: ch.factorize_simplicial(symbolic, lower.data), repeat),
        "logdet": best(lambda: ch.logdet(symbolic, lx), repeat),
        "solve": None,
        "selinv": best(lambda: ch.selected_inverse_simplicial(symbolic, lx), repeat),
        "value": ch.logdet(symbolic, lx),
        "note": "simplicial factor, column selected inverse",
    }


def bench_splu(H, repeat):
    from scipy.sparse.linalg import splu

    A = H.tocsc()
    b = np.random.default_rng(1).normal(size=A.shape[0])

    def factor():
        return splu(A, permc_spec="MMD_AT_PLUS_A", diag_pivot_thresh=0.0,
                    options={"SymmetricMode": True})  # fmt: skip

    lu = factor()
    refactor = best(factor, repeat)
    return {
        "analyse": None,
        "refactor": refactor,
        "logdet": best(lambda: np.log(lu.U.diagonal()).sum(), repeat),
        "solve": best(lambda: lu.solve(b), repeat),
        "selinv": None,
        "value": float(np.log(lu.U.diagonal()).sum()),
        "note": "refactor = ordering + symbolic + numeric every call",
    }


def bench_sparsax(H, repeat):
    import jax

    jax.config.update("jax_enable_x64", True)
    import jax.numpy as jnp
    import sparsax

    upper = sp.triu(H).tocoo()
    n = H.shape[0]
    Ai, Aj = jnp.asarray(upper.row, jnp.int32), jnp.asarray(upper.col, jnp.int32)
    values = np.asarray(upper.data)
    b = jnp.asarray(np.random.default_rng(1).normal(size=n))
    logdet = jax.jit(lambda x: sparsax.logdet(Ai, Aj, x, n))
    selinv = jax.jit(lambda x: sparsax.selinv(Ai, Aj, x, n))
    solve = jax.jit(lambda x: sparsax.solve(Ai, Aj, x, b))
    counter = [0]

    def fresh():
        # New values every call, so the numeric cache never answers: a true refactorization.
        counter[0] += 1
        return jnp.asarray(values * (1.0 + 1e-9 * counter[0]))

    start = time.perf_counter()
    logdet(fresh()).block_until_ready()
    analyse = time.perf_counter() - start
    return {
        "analyse": analyse,
        "refactor": None,
        "logdet": best(lambda: logdet(fresh()).block_until_ready(), repeat),
        "solve": best(lambda: solve(fresh()).block_until_ready(), repeat),
        "selinv": best(lambda: selinv(fresh()).block_until_ready(), repeat),
        "value": float(logdet(jnp.asarray(values))),
        "note": "analyse incl. jit; logdet/solve/selinv each include the refactor",
    }


def bench_sksparse(H, repeat):
    from sksparse.cholmod import analyze

    A = H.tocsc()
    b = np.random.default_rng(1).normal(size=A.shape[0])
    analyse = best(lambda: analyze(A), 1)
    factor = analyze(A)
    factor.cholesky_inplace(A)
    return {
        "analyse": analyse,
        "refactor": best(lambda: factor.cholesky_inplace(A), repeat),
        "logdet": best(factor.logdet, repeat),
        "solve": best(lambda: factor(b), repeat),
        "selinv": None,
        "value": float(factor.logdet()),
        "note": "CHOLMOD supernodal",
    }


BACKENDS = {
    "pymc_optim": bench_ours,
    "pymc_optim, reference kernels": bench_reference,
    "scipy splu": bench_splu,
    "sparsax": bench_sparsax,
    "scikit-sparse": bench_sksparse,
}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="n = 10⁴ only")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    sizes = [100] if args.quick else [100, 316]
    header = (
        "n | backend | analyse s | refactor s | logdet s | solve s | selinv s | selinv/refactor"
    )
    print(f"| {header} | note |")
    print("|---|---|---|---|---|---|---|---|---|")
    status = 0
    fmt = lambda t: "—" if t is None else f"{t:.4g}"  # noqa: E731
    for m in sizes:
        H = grid_hessian(m)
        reference = None
        for name, bench in BACKENDS.items():
            try:
                r = bench(H, args.repeat)
            except ImportError as error:
                print(f"| {m * m} | {name} | not installed ({error.name}) | | | | | | |")
                continue
            if reference is None:
                reference = r["value"]
            elif abs(r["value"] - reference) > 1e-8 * abs(reference):
                print(f"logdet mismatch for {name}: {r['value']} vs {reference}", file=sys.stderr)
                status = 1
            ratio = "—"
            if r["selinv"] is not None:
                base = r["refactor"] if r["refactor"] is not None else r["logdet"]
                ratio = f"{r['selinv'] / base:.2f}"
            print(f"| {m * m} | {name} | {fmt(r['analyse'])} | {fmt(r['refactor'])} | "
                  f"{fmt(r['logdet'])} | {fmt(r['solve'])} | {fmt(r['selinv'])} | {ratio} | "
                  f"{r['note']} |")  # fmt: skip
    return status


if __name__ == "__main__":
    sys.exit(main())
