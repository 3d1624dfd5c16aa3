"""The linear algebra of A = ∂F/∂x: its structure, its solve and its log-determinant."""
