"""Constrained minimization: bounds and equality/inequality constraints, differentiated through KKT.

:mod:`.minimize` holds the public functions and the mathematics (module Notes), :mod:`.kkt` the KKT
conditions on the Op's inner variables; the scipy-backed Op and its active-set polish live in
:mod:`pymc_optim.backends.scipy.constrained`.
"""

from pymc_optim.problems.constrained.minimize import (
    CONSTRAINED_METHODS,
    LagrangeMultipliers,
    constrained_minimize,
    lagrange_multipliers,
)

__all__ = [
    "CONSTRAINED_METHODS",
    "LagrangeMultipliers",
    "constrained_minimize",
    "lagrange_multipliers",
]
