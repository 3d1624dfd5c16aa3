"""The linear algebra of A = âF/âx: its structures, their detection, solves and log-determinants."""
