"""Model plumbing: helpers that take a ``pm.Model`` (or build inside one)."""
