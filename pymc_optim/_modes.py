"""Compile modes for graphs the package evaluates only a few times."""

from pytensor.compile.mode import Mode

__all__ = ["PYTHON_MODE"]

#: Python linker (each Op's numpy perform) and fast_compile rewrites: for graphs evaluated a few
#: times (a transform at the initial point, a constant folded while a Hessian's pattern is read,
#: the structure probes' Hessian–vector products, fit_inla's batched map to constrained values),
#: where compiling them (C modules, or numba's machine code under PyTensor 3's default: tens of
#: seconds for a probe's vectorized second derivatives) costs more than it saves.
PYTHON_MODE = Mode(linker="py", optimizer="fast_compile")
