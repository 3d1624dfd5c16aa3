"""One packer: several arrays as one flat float64 vector and back (numpy, JAX and PyTensor alike).

Every solver works on a flat vector z holding all its controls (scipy needs one, the Newton loops
and their structured solves index it). Unpacking slices z and reshapes; it works on numpy arrays,
JAX arrays and PyTensor variables, which share the `reshape`/`astype` methods. The numba backend
generates its own packing source (:mod:`pymc_optim.backends.numba`): numba cannot call this class.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

__all__ = ["Packer"]


class Packer:
    """The layout of several arrays in one flat vector: their shapes, dtypes and offsets.

    Parameters
    ----------
    templates : sequence of arrays
        Arrays (or anything with ``shape`` and ``dtype``; Python numbers count as 0-d) whose
        layout is recorded.
    """

    def __init__(self, templates: Sequence):
        self.shapes = [tuple(np.shape(t)) for t in templates]
        self.dtypes = [np.dtype(_dtype(t)) for t in templates]
        self.sizes = [int(np.prod(s, dtype=int)) for s in self.shapes]
        self.offsets = [0, *np.cumsum(self.sizes).tolist()]

    @classmethod
    def from_shapes(cls, shapes: Sequence[tuple[int, ...]], dtype) -> Packer:
        """The layout of arrays of the given static `shapes`, all of `dtype`."""
        return cls([np.empty(shape, dtype=dtype) for shape in shapes])

    @property
    def size(self) -> int:
        return self.offsets[-1]

    @staticmethod
    def pack(arrays: Sequence, xp=np):
        """The arrays' elements as one float64 vector (`xp`: numpy or jax.numpy)."""
        flat = [xp.ravel(xp.asarray(a)).astype(xp.float64) for a in arrays]
        return flat[0] if len(flat) == 1 else xp.concatenate(flat)

    def unpack(self, flat) -> list:
        """The arrays back from `flat`, with their shapes and dtypes."""
        out = []
        for start, stop, shape, dtype in zip(
            self.offsets[:-1], self.offsets[1:], self.shapes, self.dtypes, strict=True
        ):
            piece = (flat if len(self.shapes) == 1 else flat[start:stop]).reshape(shape)
            out.append(piece if piece.dtype == dtype else piece.astype(dtype))
        return out

    def failed(self) -> list[np.ndarray]:
        """NaN arrays of the recorded layout: the solution reported by a solve that raised."""
        return [np.full(s, np.nan, dtype=d) for s, d in zip(self.shapes, self.dtypes, strict=True)]


def _dtype(array):
    dtype = getattr(array, "dtype", None)  # JAX tracers have one but cannot become numpy arrays
    return np.asarray(array).dtype if dtype is None else dtype
