"""The linear algebra of A = ∂F/∂x: its structures, their detection, solves, log-determinants
and draws (dense, diagonal, block-diagonal in :mod:`.structure`; sparse in :mod:`.sparse`)."""
