"""The linear algebra of A = ∂F/∂x: its structures, their detection, solves and log-determinants."""
