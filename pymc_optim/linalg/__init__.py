"""Linear algebra of A: structures, their solves, log-determinants and draws."""
