"""pymc_optim demo: estimate a cost parameter from firms' profit-maximizing output, by NUTS.

Each firm i sells at price p_i and chooses its output q to maximize profit p_i·q − c·q²·⁵ (cost
parameter c, the same for all firms). We observe noisy outputs and infer c. The model states the
firms' problem, not its solution: `pmo.minimize` solves it inside the model and NUTS
differentiates through the solution by the implicit function theorem. The closed-form optimum
q* = (p / (2.5 c))^(2/3) checks the answer.
"""

import numpy as np
import pymc as pm
import pytensor.tensor as pt
from pytensor.graph.replace import graph_replace

import pymc_optim as pmo

rng = np.random.default_rng(2026)
n_firms, c_true, noise = 40, 1.5, 0.05
prices = rng.uniform(1.0, 4.0, n_firms)
q_true = (prices / (2.5 * c_true)) ** (2 / 3)
q_observed = q_true + rng.normal(0.0, noise, n_firms)

with pm.Model() as model:
    c = pm.LogNormal("c", mu=0.0, sigma=1.0)
    q = pt.vector("q", shape=(n_firms,))
    # negative profit of every firm, summed: the firms' problems are independent
    neg_profit = -(prices * q - c * pt.abs(q) ** 2.5).sum()
    q_star, success = pmo.minimize(neg_profit, q, x0=np.ones(n_firms), method="BFGS")
    pm.Deterministic("q_star", q_star)
    pm.Normal("q_obs", mu=q_star, sigma=noise, observed=q_observed)
    idata = pm.sample(500, tune=500, chains=2, cores=1, random_seed=1, progressbar=False)

c_post = idata.posterior["c"]
c_mean, c_sd = float(c_post.mean()), float(c_post.std())
q_closed_form = (prices / (2.5 * c_mean)) ** (2 / 3)
q_solved = graph_replace(q_star, {c: pt.constant(c_mean)}).eval()
max_error = float(np.max(np.abs(q_solved - q_closed_form)))

print(f"posterior of c: {c_mean:.3f} ± {c_sd:.3f}   (truth {c_true})")
print(f"divergences: {int(idata.sample_stats['diverging'].sum())}")
print(f"inner solution vs closed form at the posterior mean: max |error| = {max_error:.1e}")
assert abs(c_mean - c_true) < 4 * c_sd, "posterior far from the truth"
assert max_error < 1e-5, "inner solution disagrees with the closed form"
