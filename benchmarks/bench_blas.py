"""What PyTensor's "could not link to a BLAS installation" costs in the C backend.

Runs the same timings in two fresh processes, with PyTensor's C code linked to no BLAS (what a
pip install gives: ``blas__ldflags=""``, the "NumPy C-API based implementation") and to a system
OpenBLAS (``blas__ldflags="-lopenblas"``, e.g. Debian's ``libopenblas-dev``; conda's PyTensor
gets the same from its own BLAS), and prints a table of per-call times and their ratio,
measured in this run. Each process has its own compile directory so that no compiled module is
shared between them. Timings: best of `--repeats` runs of a loop of calls, compilation
excluded, and the best over `--rounds` pairs of processes run alternately (so that a change of
the machine's load does not favour one side); single-threaded BLAS (``OPENBLAS_NUM_THREADS=1``)
so both sides use one core.

    python benchmarks/bench_blas.py [--sizes 100 400] [--repeats 5] [--rounds 2]
"""

import argparse
import functools
import json
import os
import subprocess
import sys
import tempfile
import timeit

CASES = ("matmul A @ B", "matvec A @ v", "cholesky(A)", "solve(A, b)", "MvNormal logp + grad")


def measure(sizes: list[int], repeats: int) -> dict:
    import warnings

    warnings.filterwarnings("ignore", message="PyTensor could not link to a BLAS")
    import numpy as np
    import pymc as pm
    import pytensor
    import pytensor.tensor as pt

    rng = np.random.default_rng(0)
    results = {"ldflags": pytensor.config.blas__ldflags}
    for n in sizes:
        a = pt.dmatrix("a")
        b = pt.dmatrix("b")
        v = pt.dvector("v")
        m = rng.normal(size=(n, n))
        spd = m @ m.T / n + np.eye(n)
        x = rng.normal(size=n)
        logp = pm.logp(pm.MvNormal.dist(mu=pt.zeros(n), cov=a), v).sum()
        functions = {
            "matmul A @ B": (pytensor.function([a, b], a @ b), (m, m)),
            "matvec A @ v": (pytensor.function([a, v], a @ v), (m, x)),
            "cholesky(A)": (pytensor.function([a], pt.linalg.cholesky(a)), (spd,)),
            "solve(A, b)": (pytensor.function([a, v], pt.linalg.solve(a, v)), (spd, x)),
            "MvNormal logp + grad": (
                pytensor.function([a, v], [logp, *pt.grad(logp, [a, v])]),
                (spd, x),
            ),
        }
        for name, (fn, args) in functions.items():
            call = functools.partial(fn, *args)
            call()
            number = max(1, int(0.2 / max(timeit.timeit(call, number=1), 1e-6)))
            best = min(timeit.repeat(call, number=number, repeat=repeats)) / number
            results[f"{name}|{n}"] = best
    return results


def run_child(ldflags: str, sizes: list[int], repeats: int) -> dict:
    with tempfile.TemporaryDirectory() as compiledir:
        env = {
            **os.environ,
            "PYTENSOR_FLAGS": f"blas__ldflags={ldflags},compiledir={compiledir}",
            "OPENBLAS_NUM_THREADS": "1",
        }
        args = [sys.executable, __file__, "--child", "--repeats", str(repeats), "--sizes"]
        out = subprocess.run(
            [*args, *map(str, sizes)], env=env, capture_output=True, text=True, check=True
        )
        return json.loads(out.stdout.strip().splitlines()[-1])


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[100, 400])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    options = parser.parse_args()
    if options.child:
        print(json.dumps(measure(options.sizes, options.repeats)))
        return
    runs = {"": [], "-lopenblas": []}
    for _ in range(options.rounds):
        for ldflags, results in runs.items():
            results.append(run_child(ldflags, options.sizes, options.repeats))
    without, linked = ({k: min(r[k] for r in rs) for k in rs[0]} for rs in runs.values())
    without["ldflags"], linked["ldflags"] = runs[""][0]["ldflags"], runs["-lopenblas"][0]["ldflags"]
    print(f"C backend; no BLAS ldflags={without['ldflags']!r}, linked={linked['ldflags']!r}\n")
    print("| operation | n | no BLAS µs | OpenBLAS µs | no BLAS / OpenBLAS |")
    print("|---|---|---|---|---|")
    for n in options.sizes:
        for name in CASES:
            t0, t1 = without[f"{name}|{n}"], linked[f"{name}|{n}"]
            print(f"| {name} | {n} | {t0 * 1e6:.1f} | {t1 * 1e6:.1f} | {t0 / t1:.2f}x |")


if __name__ == "__main__":
    main()
