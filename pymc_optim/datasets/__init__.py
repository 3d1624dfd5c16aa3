"""Real data sets with a published answer, and the models that reproduce it.

- :mod:`pymc_optim.datasets.rust1987`: Rust's (1987) bus engine replacement data ("Harold
  Zurcher") and the dynamic discrete choice model whose likelihood contains a Bellman fixed point.
"""

from pymc_optim.datasets.rust1987 import Rust1987Data, load_rust1987

__all__ = ["Rust1987Data", "load_rust1987"]
