"""``runtime/threads.intra_op_threads``: inside the block torch runs at the asked count, and the
count found on entry is back on exit, also when the block changed it (a hybrid stream plan's
wide nodes set it from the generated code) or raised."""
from __future__ import annotations

import pytest
import torch

from fusegraph.runtime.threads import intra_op_threads


@pytest.fixture
def at_two():
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(before)


@pytest.mark.parametrize("asked", [None, 1, 2, 3])
def test_the_block_runs_at_the_asked_count_and_the_entry_count_comes_back(at_two, asked):
    with intra_op_threads(asked):
        assert torch.get_num_threads() == (2 if asked is None else asked)
    assert torch.get_num_threads() == 2


@pytest.mark.parametrize("asked", [None, 1, 2])
def test_a_count_the_block_set_is_undone(at_two, asked):
    with intra_op_threads(asked):
        torch.set_num_threads(3)
    assert torch.get_num_threads() == 2


def test_a_raising_block_leaves_the_entry_count(at_two):
    with pytest.raises(ValueError), intra_op_threads(1):
        torch.set_num_threads(3)
        raise ValueError("inside")
    assert torch.get_num_threads() == 2
