"""Distributions for latent fields: scalable GMRF priors."""

from pymc_optim.distributions.gmrf import GMRF, ICAR, RW, bym2_scaling_factor

__all__ = ["GMRF", "ICAR", "RW", "bym2_scaling_factor"]
