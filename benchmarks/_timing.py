"""Timing helpers shared by the benchmark scripts: interleaved batches, paired ratios, profiles."""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import gc
import io
import os
import pstats
import statistics
import subprocess
import time
from collections.abc import Callable

#: Fewest paired repeats a slow run is cut down to.
MIN_REPEATS = 5

#: cProfile reports collected by `profile`, printed by the scripts after their tables.
PROFILE_REPORTS: list[str] = []


def calls_per_batch(fn: Callable[[], object], batch_s: float) -> tuple[int, float]:
    """Number of calls of `fn` that last about `batch_s` seconds (after one warm-up call), and the
    seconds per call measured on the way."""
    fn()
    n, elapsed = 1, 0.0
    while True:
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        elapsed = time.perf_counter() - t0
        if elapsed >= batch_s / 10 or n >= 1_000_000:
            break
        n *= 10
    return max(1, round(n * batch_s / elapsed)), elapsed / n


def time_interleaved(
    contenders: dict,
    repeats: int,
    batch_s: float,
    *,
    budget_s: float | None = None,
    slow: dict | None = None,
) -> dict[object, list[float]]:
    """Seconds per call of each contender, one entry per repeat, batches interleaved.

    With `budget_s`, the number of repeats is lowered (never below `MIN_REPEATS`) so that the timed
    repeats last about `budget_s` seconds in all, as estimated from the calibration. `slow` maps
    some contenders to a smaller number of repeats: they run one call per batch, with no warm-up
    (their checked first call was one), in the first rounds only.
    """
    slow = slow or {}
    calibration = {
        key: (1, 0.0) if key in slow else calls_per_batch(fn, batch_s)
        for key, fn in contenders.items()
    }
    numbers = {key: number for key, (number, _) in calibration.items()}
    if budget_s is not None:
        per_repeat = sum(number * per_call for number, per_call in calibration.values())
        repeats = min(repeats, max(MIN_REPEATS, int(budget_s / per_repeat)))
    times: dict[object, list[float]] = {key: [] for key in contenders}
    keys = list(contenders)
    gc_was_enabled = gc.isenabled()
    gc.disable()
    try:
        for r in range(repeats):
            for key in keys if r % 2 == 0 else keys[::-1]:
                if key in slow and r >= slow[key]:
                    continue
                fn, number = contenders[key], numbers[key]
                t0 = time.perf_counter()
                for _ in range(number):
                    fn()
                times[key].append((time.perf_counter() - t0) / number)
    finally:
        if gc_was_enabled:
            gc.enable()
    return times


def paired_ratio(num: list[float], den: list[float]) -> float:
    return statistics.median(a / b for a, b in zip(num, den, strict=True))


def paired_difference(a: list[float], b: list[float]) -> float:
    return statistics.median(x - y for x, y in zip(a, b, strict=True))


def ratio(times: dict, num, den) -> float | None:
    """Median of paired ratios over the repeats both contenders ran (None if one is missing)."""
    if num not in times or den not in times:
        return None
    k = min(len(times[num]), len(times[den]))
    return paired_ratio(times[num][:k], times[den][:k])


def fmt_time(seconds: float) -> str:
    if seconds >= 1:
        return f"{seconds:.2f} s"
    if seconds >= 1e-3:
        return f"{seconds * 1e3:.2f} ms"
    return f"{seconds * 1e6:.1f} µs"


def timed(fn: Callable[[], object]) -> tuple[object, float]:
    t0 = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t0


def profile(
    label: str, fn: Callable[[], object], calls: int, top: int = 15, cumulative: str | None = None
) -> None:
    """cProfile `calls` calls of `fn` into `PROFILE_REPORTS`, sorted by own time; with
    `cumulative` (a regular expression of function names), also by cumulative time."""
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(calls):
        fn()
    prof.disable()
    buf = io.StringIO()
    stats = pstats.Stats(prof, stream=buf)
    stats.sort_stats("tottime").print_stats(top)
    if cumulative is not None:
        buf.write(f"\n--- {cumulative}, by cumulative time\n")
        stats.sort_stats("cumulative").print_stats(cumulative, top)
    report = buf.getvalue().strip()
    PROFILE_REPORTS.append(f"\n### cProfile: {label} ({calls} calls)\n\n```\n{report}\n```")


def git_revision(package_file: str) -> str:
    """The checkout's short commit (with "+dirty" for local changes to pymc_optim), if any."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(package_file)))
    try:
        rev = subprocess.run(
            ["git", "-C", root, "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", root, "status", "--porcelain", "--", "pymc_optim"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return rev + ("+dirty" if dirty else "")


def blas_threads(limit: int):
    """A context limiting BLAS to `limit` threads (0: left as is), so that the O(n³) kernels of
    one contender do not fight the others, or other processes, for the cores. Needs threadpoolctl;
    without it the threads are left as they are, and the script says so."""
    if limit <= 0:
        return contextlib.nullcontext()
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:
        print("(threadpoolctl not installed: BLAS threads left as is)")
        return contextlib.nullcontext()
    return threadpool_limits(limits=limit, user_api="blas")


def timing_parser(description: str) -> argparse.ArgumentParser:
    """An argument parser with the options every timing script takes: --quick, --repeats and
    --batch (None where not given: each script picks its own defaults)."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--quick", action="store_true", help="smoke run: 3 short repeats")
    parser.add_argument("--repeats", type=int, default=None, help="repeats per case")
    parser.add_argument("--batch", type=float, default=None, help="seconds per timed batch")
    return parser
