"""Distributions for latent fields: scalable GMRF priors."""

from pymc_optim.distributions.gmrf import GMRF, ICAR, RW

__all__ = ["GMRF", "ICAR", "RW"]
