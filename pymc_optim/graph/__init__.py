"""Graph plumbing: the solver Op base, splitting a user's graph, and solution diagnostics."""
