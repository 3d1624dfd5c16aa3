"""Graph rewrites registered with PyTensor when :mod:`pymc_optim` is imported.

:mod:`.structured_linalg` (Kronecker and block-diagonal matrices through their factors),
:mod:`.scalar` (one-unknown solves by scalar Newton), :mod:`.blockwise_split` (a batched
``Split`` with common sizes as one ``Split``), :mod:`.composite_inputs` and :mod:`.stack_trace`
say what they change and how to exclude them; :mod:`.switch` holds ``pmo.disable_rewrites()``,
which undoes every change of the import to PyTensor and PyMC.
"""
