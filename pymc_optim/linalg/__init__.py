"""Linear algebra of A: structures of the Jacobian/Hessian, their solves, log-determinants and draws."""
