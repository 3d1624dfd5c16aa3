"""Real data sets with a published answer, and the models that reproduce it.

- :mod:`pymc_optim.datasets.rust1987`: Rust's (1987) bus engine replacement data ("Harold
  Zurcher") and the dynamic discrete choice model whose likelihood contains a Bellman fixed point.
- :mod:`pymc_optim.datasets.finland`: the Finland disease map (Vanhatalo et al. 2010), a
  Gaussian-process latent field under Poisson counts (Stan's embedded-Laplace example).
"""

from pymc_optim.datasets.finland import FinlandData, finland_model, load_finland
from pymc_optim.datasets.rust1987 import Rust1987Data, load_rust1987

__all__ = ["FinlandData", "Rust1987Data", "finland_model", "load_finland", "load_rust1987"]
