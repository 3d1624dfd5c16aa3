"""Small dense kernels on one BLAS thread, without touching what other threads get.

OpenBLAS (bundled with scipy's wheels; scipy's LAPACK wrappers and numba's ``np.linalg`` call
it) runs even 100 x 100 factorizations on its thread pool. With any other busy thread or process
on the machine -- nutpie's chains, parallel chains, a second job -- its threads wait for each
other and such a call takes 10-1000x its single-threaded time. OpenBLAS's
``openblas_set_num_threads_local`` sets the count for the calling thread only: kernels run under
:func:`one_blas_thread` (or call :data:`set_local_threads` inside numba code) use one thread while
the user's own large products keep the pool. Where no OpenBLAS with that function is loaded
(another BLAS, an older OpenBLAS), both are no-ops.
"""

from __future__ import annotations

import ctypes
from contextlib import contextmanager

__all__ = ["one_blas_thread", "set_local_threads", "local_threads_available"]


def _find_local_setter():
    """``openblas_set_num_threads_local`` of the OpenBLAS scipy's LAPACK uses, or None."""
    try:
        import scipy.linalg  # noqa: F401  (loads scipy's BLAS, so the controller sees it)
        from threadpoolctl import ThreadpoolController
    except ImportError:
        return None
    for controller in ThreadpoolController().lib_controllers:
        if controller.internal_api != "openblas":
            continue
        setter = getattr(controller.dynlib, "openblas_set_num_threads_local", None)
        if setter is not None:
            setter.argtypes = [ctypes.c_int]
            setter.restype = ctypes.c_int
            return setter
    return None


_SETTER = _find_local_setter()


def _no_setter(n: int) -> int:
    return 0


#: ``set_local_threads(n) -> previous``: this thread's OpenBLAS thread count (a ctypes function,
#: callable from numba's nopython mode too); returns 0 and does nothing without such an OpenBLAS.
set_local_threads = _SETTER if _SETTER is not None else _no_setter


def local_threads_available() -> bool:
    """Whether this process's OpenBLAS takes a per-thread thread count."""
    return _SETTER is not None


@contextmanager
def one_blas_thread():
    """Run the block's BLAS and LAPACK calls (scipy's OpenBLAS) on the calling thread alone."""
    if _SETTER is None:
        yield
        return
    previous = _SETTER(1)
    try:
        yield
    finally:
        _SETTER(previous)
