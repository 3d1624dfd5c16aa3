"""`pymc_optim.linalg.structure`: the layout of A read off a sparsity pattern."""

import numpy as np
import pytest

from pymc_optim.linalg.structure import LinearStructure, structure_from_pattern


def _blocks(n_blocks, b):
    return np.kron(np.eye(n_blocks, dtype=bool), np.ones((b, b), dtype=bool))


def test_diagonal_pattern():
    assert structure_from_pattern(np.eye(5, dtype=bool)) == LinearStructure("diagonal")


@pytest.mark.parametrize("b", [2, 3, 5])
def test_block_pattern_gives_its_block_size(b):
    assert structure_from_pattern(_blocks(4, b)) == LinearStructure("block_diagonal", b)


def test_partly_filled_blocks_give_the_smallest_enclosing_block_size():
    """Blocks of 4 where only some entries are nonzero still need blocks of 4 (not 2)."""
    pattern = np.eye(8, dtype=bool)
    pattern[0, 3] = pattern[3, 0] = pattern[5, 6] = pattern[6, 5] = True
    assert structure_from_pattern(pattern) == LinearStructure("block_diagonal", 4)


def test_entry_across_blocks_gives_dense():
    pattern = _blocks(4, 2)
    pattern[1, 2] = pattern[2, 1] = True  # couples blocks 0 and 1: blocks of 4 hold it
    assert structure_from_pattern(pattern) == LinearStructure("block_diagonal", 4)
    pattern[0, 7] = pattern[7, 0] = True  # couples the first and the last element
    assert structure_from_pattern(pattern) == LinearStructure("dense")


def test_a_single_block_is_dense():
    assert structure_from_pattern(np.ones((4, 4), dtype=bool)) == LinearStructure("dense")
