"""Rust (1987) bus engine replacement: the data, and a Bellman fixed point inside the likelihood.

Harold Zurcher, superintendent of maintenance of the Madison (Wisconsin) Metropolitan bus
company, decides every month for each bus whether to keep its engine (and pay a maintenance cost
that grows with mileage) or replace it (at cost RC, after which the mileage restarts at 0). Rust
(1987, Econometrica 55(5)) models this as a dynamic discrete choice: in mileage state s the
choice-specific values are

    v(s, keep)    = −c(s) + β EV(s),           c(s) = 0.001 θ₁₁ s,
    v(s, replace) = −RC − c(0) + β EV(0),

with i.i.d. extreme-value shocks, so P(replace | s) = logistic(v(s, replace) − v(s, keep)), and
the expected value function EV solves the Bellman ("logsum") fixed point

    EV = T(EV; θ) = P · log(exp v(·, keep) + exp v(·, replace)),

P the monthly mileage transition matrix (increments of 0, 1, …, J bins with probabilities θ₃,
truncated at the top state). The likelihood of the observed decisions needs EV(θ) and, for
gradient-based estimation or NUTS, dEV/dθ: :func:`expected_value` solves the fixed point with
:func:`pymc_optim.fixed_point` (Newton–Kantorovich: Newton's method on EV − T(EV) = 0) and
differentiates it by the implicit function theorem, never through the iterations.

Contents: :func:`load_rust1987` (raw files → state, decision, increment arrays for any bus groups
and number of states), the first stage (:func:`transition_probabilities`,
:func:`transition_matrix`), the graph builders (:func:`bellman_update`, :func:`expected_value`,
:func:`replacement_logit`, :func:`choice_log_likelihood`) and a PyMC model (:func:`rust_model`).
The data's README (``data/rust1987/README.md`` next to this module) gives the source, the licence,
the processing and the published estimates that ``tests/test_rust1987.py`` reproduces.
"""

from pymc_optim.datasets.rust1987.data import (
    GROUP_FILES,
    MAX_MILEAGE,
    Rust1987Data,
    load_rust1987,
    transition_log_likelihood,
    transition_matrix,
    transition_probabilities,
)
from pymc_optim.datasets.rust1987.estimator import MLEResult, RustLikelihood
from pymc_optim.datasets.rust1987.model import (
    COST_SCALE,
    INNER_TOL,
    bellman_update,
    choice_log_likelihood,
    expected_value,
    replacement_logit,
    rust_model,
)

__all__ = [
    "COST_SCALE",
    "GROUP_FILES",
    "INNER_TOL",
    "MAX_MILEAGE",
    "MLEResult",
    "Rust1987Data",
    "RustLikelihood",
    "bellman_update",
    "choice_log_likelihood",
    "expected_value",
    "load_rust1987",
    "replacement_logit",
    "rust_model",
    "transition_log_likelihood",
    "transition_matrix",
    "transition_probabilities",
]
