"""Distributions for latent fields: scalable GMRF priors."""
