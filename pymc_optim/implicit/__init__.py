"""How solutions are differentiated: the one implicit-function-theorem rule (see :mod:`.rule`)."""

from pymc_optim.implicit.rule import (
    OptimalityCondition,
    differentiated_elsewhere,
    implicit_pullback,
)

__all__ = ["OptimalityCondition", "differentiated_elsewhere", "implicit_pullback"]
