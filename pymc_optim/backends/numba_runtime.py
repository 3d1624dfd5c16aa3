"""What compiled numba code needs from the process: per-thread buffers kept between calls (warm
starts, chord steps, the last sparse factor), read-only arrays registered by the process (a
sparse pattern's symbolic analysis), the calling thread's BLAS thread count, and the counting of
and warning on failed solves.

A numba function cannot hold mutable state of its own: a global array is frozen into the
compiled code as a constant. The solvers ask for their buffer at each call instead, through one
C-callable function, ``buffer(key, size)`` → the address of a float64 array of `size` elements
owned by this module for the pair (key, calling thread). The function is registered with LLVM
under our own symbol name at import, as `pymc_optim.linalg._cholesky` registers its LAPACK
symbols, so a solver that numba cached on disk links to this process's function.

A buffer is zeros when first handed out, and again whenever `size` changes; its contents are
the caller's. Each OS thread has its own buffers (a nutpie chain's thread, a ``pm.sample``
process), so chains never read each other's state. Threads that end leave their buffers here:
a few vectors each, bounded by `MAX_THREADS` per key.
"""

from __future__ import annotations

import ctypes
import threading
import warnings
from collections import OrderedDict
from hashlib import sha256

import numba
import numpy as np
from numba import types
from numba.extending import intrinsic

from pymc_optim._warnings import PymcOptimWarning
from pymc_optim.graph.failure_ops import record_failure
from pymc_optim.linalg import _cholesky

__all__ = [
    "BLAS_THREADS_SETTABLE",
    "MAX_THREADS",
    "copy_into",
    "register_arrays",
    "registered_array",
    "registered_arrays",
    "count_failure",
    "failure_key",
    "warn_failure",
    "set_blas_threads",
    "solver_buffer",
    "thread_buffer",
]

#: Buffers kept per key: the least recently served thread's go first.
MAX_THREADS = 64

_BUFFERS: dict[int, OrderedDict[int, np.ndarray]] = {}


def _buffer(key: int, size: int) -> int:
    """The address of the (key, this thread) buffer of `size` float64 elements, 0 on failure."""
    try:
        per_thread = _BUFFERS.setdefault(key, OrderedDict())
        thread = threading.get_ident()
        buffer = per_thread.get(thread)
        if buffer is None or buffer.size != size:
            buffer = per_thread[thread] = np.zeros(max(size, 1))[:size]
        per_thread.move_to_end(thread)
        while len(per_thread) > MAX_THREADS:
            per_thread.popitem(last=False)
        return buffer.ctypes.data
    except MemoryError:
        return 0


def thread_buffer(key: int) -> np.ndarray | None:
    """This thread's buffer for `key` (what `solver_buffer` serves compiled code), or None."""
    return _BUFFERS.get(key, {}).get(threading.get_ident())


# Kept referenced for the life of the process: LLVM holds only their addresses.
_CALLBACKS: list = []


def _python_callable(name: str, function, n_args: int):
    """`function` (int64 arguments, int64 result) callable from numba code as the LLVM symbol
    ``pymc_optim_<name>``: compiled code calls it by name, so code cached on disk links to
    this process's function. Each call takes the GIL."""
    import llvmlite.binding as llvm

    callback = ctypes.CFUNCTYPE(ctypes.c_int64, *[ctypes.c_int64] * n_args)(function)
    _CALLBACKS.append(callback)
    symbol = f"pymc_optim_{name}"
    llvm.add_symbol(symbol, ctypes.cast(callback, ctypes.c_void_p).value)
    return types.ExternalFunction(symbol, types.int64(*[types.int64] * n_args))


_buffer_address = _python_callable("solver_buffer", _buffer, 2)


@intrinsic
def _as_pointer(typingctx, address, dtype):
    """An int64 address as a pointer to `dtype` (``np.float64``, ``np.int64``), for
    `numba.carray`."""
    signature = types.CPointer(dtype.instance_type)(types.int64, dtype)

    def codegen(context, builder, sig, args):
        return builder.inttoptr(args[0], context.get_value_type(sig.return_type))

    return signature, codegen


@numba.njit(cache=True)
def solver_buffer(key, size):
    """This thread's float64 buffer for `key`, of `size` elements (numba code only); empty if
    it could not be allocated."""
    address = _buffer_address(key, size)
    if address == 0:
        return np.zeros(0)
    return numba.carray(_as_pointer(address, np.float64), (size,))


# --- int64 arrays of the process, read by compiled code ---------------------------------------
#: key → [address 0, size 0, address 1, size 1, ...] of the registered arrays, and the arrays.
_TABLES: dict[int, tuple[np.ndarray, tuple[np.ndarray, ...]]] = {}


def register_arrays(key: int, arrays) -> None:
    """Make `arrays` (int64, as they are or as contiguous copies) readable from compiled code as
    ``registered_array(registered_arrays(key, len(arrays)), i)``, for the life of the process.
    Code that reads them holds no copy (a numba constant array over 1 MB makes a function
    uncacheable, and any constant array is compiled into its machine code); the first
    registration under a key is kept."""
    if key in _TABLES:
        return
    kept = tuple(np.ascontiguousarray(a, dtype=np.int64) for a in arrays)
    table = np.array([v for a in kept for v in (a.ctypes.data, a.size)], dtype=np.int64)
    _TABLES[key] = (table, kept)


def _table(key: int, count: int) -> int:
    """The address of `key`'s table of `count` arrays, 0 if there is none."""
    found = _TABLES.get(key)
    if found is None or found[0].size != 2 * count:
        return 0
    return found[0].ctypes.data


_table_address = _python_callable("array_table", _table, 2)


@numba.njit(cache=True)
def registered_arrays(key, count):
    """The table of the `count` arrays registered under `key` (numba code only)."""
    address = _table_address(key, count)
    if address == 0:
        raise RuntimeError("pymc_optim: arrays read by compiled code are not registered")
    return numba.carray(_as_pointer(address, np.int64), (2 * count,))


@numba.njit(cache=True)
def registered_array(table, i):
    """Array `i` of a `registered_arrays` table (numba code only; read it, never write)."""
    return numba.carray(_as_pointer(table[2 * i], np.int64), (table[2 * i + 1],))


@numba.njit(cache=True)
def copy_into(target, offset, source):
    """``target[offset : offset + source.size] = source.ravel()`` by a loop: numba's slice
    assignment compiles its shape-mismatch message, seconds of compile time per caller."""
    for i in range(source.size):
        target[offset + i] = source.flat[i]


def _blas_threads_function():
    """`openblas_set_num_threads_local` callable from numba (the symbol registered under our
    own name, as `_cholesky`'s LAPACK kernels are), or a no-op where scipy's BLAS has none."""
    setter = _cholesky.SET_BLAS_THREADS
    if setter is None:

        @numba.njit(cache=True)
        def keep(n):
            return n

        return keep
    import llvmlite.binding as llvm

    name = "pymc_optim_openblas_set_num_threads_local"
    llvm.add_symbol(name, ctypes.cast(setter, ctypes.c_void_p).value)
    return types.ExternalFunction(name, types.intc(types.intc))


#: ``set_blas_threads(n)`` → the previous count, for the calling thread (numba code only).
#: Solvers and sparse kernels run with one: their matrices gain nothing from OpenBLAS's
#: threads, a threaded call waits for a descheduled thread on a busy machine, and OpenBLAS's
#: threaded LU (n ≥ 150 here) puts megabytes on the caller's stack, past the 2 MiB of a nutpie
#: chain's thread (a segmentation fault).
set_blas_threads = _blas_threads_function()

#: Whether `set_blas_threads` changes anything (part of the cache keys of code that calls it).
BLAS_THREADS_SETTABLE = _cholesky.SET_BLAS_THREADS is not None


# --- failed evaluations counted by compiled code ---------------------------------------------
_LABELS: dict[int, str] = {}


def failure_key(label: str) -> int:
    """The integer that compiled code passes to `count_failure` for `label` (the same in every
    process, so that a solver cached on disk counts under its label)."""
    key = int(sha256(label.encode()).hexdigest()[:15], 16)
    _LABELS[key] = label
    return key


def _count(key: int, code: int) -> int:
    record_failure(_LABELS.get(key, "a compiled solve"), code)
    return 0


def _warn(key: int) -> int:
    message = _LABELS.get(key, "an inner solve failed")
    warnings.warn(f"{message}; using its last iterate.", PymcOptimWarning, stacklevel=1)
    return 0


#: ``count_failure(failure_key(label), code)`` (numba code only): one failed evaluation under
#: label, in `FAILED_EVALUATIONS` and under the reason of the `SolverStatus` `code` of its first
#: failed solve (0: unknown), as `CountFailures.perform` counts it.
count_failure = _python_callable("count_failure", _count, 2)
#: ``warn_failure(failure_key(message))`` (numba code only): `WarnOnFailure.perform`'s warning.
warn_failure = _python_callable("warn_failure", _warn, 1)
