"""The package's logger, set up as PyMC sets up its own, and the notice of a slow compilation."""

import logging
import threading

__all__ = ["announce_compilation", "logger"]

logger = logging.getLogger("pymc_optim")
# as `pymc/__init__.py` does for "pymc": INFO messages reach the console unless the application
# configured logging itself
if not logging.root.handlers:
    logger.setLevel(logging.INFO)
    if not logger.handlers:
        logger.addHandler(logging.StreamHandler())

#: What each backend does with a graph-native solver loop at the first call (the figures behind
#: the wording are in benchmarks/README.md, bench_compile).
_HOW = {
    "numba": "numba compiles it to machine code at the first call (half a minute or more with "
    "an empty cache; later processes reuse numba's disk cache)",
    "JAX": "JAX compiles it at the first call (seconds)",
}
_announced: set[str] = set()
_lock = threading.Lock()


def announce_compilation(backend: str, what: str) -> None:
    """Log, once per process and backend, that `what` is being compiled by `backend` (one of
    ``_HOW``) and that this takes time: a first numba or JAX compilation can take minutes, and
    without a word the sampler looks hung."""
    with _lock:
        if backend in _announced:
            return
        _announced.add(backend)
    logger.info(f"pymc_optim: compiling {what} for {backend}: {_HOW[backend]}.")
