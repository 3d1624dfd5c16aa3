"""Real data sets with a published answer, and the models that reproduce it.

- :mod:`pymc_optim.datasets.rust1987`: Rust's (1987) bus engine replacement data ("Harold
  Zurcher") and the dynamic discrete choice model whose likelihood contains a Bellman fixed point.
- :mod:`pymc_optim.datasets.finland`: the Finland disease map (Vanhatalo et al. 2010), a
  Gaussian-process latent field under Poisson counts (Stan's embedded-Laplace example).
- :mod:`pymc_optim.datasets.germany`: oral-cavity cancer in Germany's 544 districts (R-INLA's
  disease-mapping example), a BYM2 model: an ICAR field on the district graph plus iid effects.
- :mod:`pymc_optim.datasets.epil`: seizure counts of 59 epileptics (Thall & Vail 1990; BUGS's
  Epil), a Poisson regression with six fixed effects and one random intercept per patient.
"""

from pymc_optim.datasets.epil import EpilData, epil_model, load_epil, load_epil_reference
from pymc_optim.datasets.finland import FinlandData, finland_model, load_finland
from pymc_optim.datasets.germany import (
    GermanyData,
    germany_bym2_model,
    load_germany,
    load_germany_reference,
)
from pymc_optim.datasets.rust1987 import Rust1987Data, load_rust1987

__all__ = [
    "EpilData",
    "FinlandData",
    "GermanyData",
    "Rust1987Data",
    "epil_model",
    "finland_model",
    "germany_bym2_model",
    "load_epil",
    "load_epil_reference",
    "load_finland",
    "load_germany",
    "load_germany_reference",
    "load_rust1987",
]
