"""The package's warning category (tests turn it into errors)."""

__all__ = ["PymcOptimWarning"]


class PymcOptimWarning(UserWarning):
    """Something pymc_optim did may not be what you meant; the message says what and why."""
