"""Memory plans that serve a range of input shapes ("buckets"), for models with symbolic input
dims.

A model whose inputs have symbolic dims (a batch, a sequence, a KV cache's past) cannot size
its activations once. It plans them per *bucket*: a plan made for one shape gives every
activation a slot rounded up to the next *boundary* of its bytes (``slot_capacity``: powers
of two and the halfway points between them, ``..., 64, 96, 128, 192, 256, ...`` times 64
bytes, so a slot is at most 1.5 times what the shape it was made for needs), and every later
shape whose activations all fit their slots runs in that plan without padding its data (a
tensor uses the front of its slot). The dims of such shapes form the bucket: for sizes
linear in a dim, a range of up to 1.5 times in that dim; a shape that fits no kept plan gets
a plan of its own. Unlike ranges fixed per input dim, this needs no relation between the
dims (a decoder's mask length is its past plus its sequence) and no evaluation of shapes the
model never ran.

``slot_capacity(nbytes)``: the slot a plan gives an activation of ``nbytes``;
``boundary_at_least(n)``: the boundary sequence itself. Pure functions: nothing here
allocates; ``runtime/frames.py`` keeps the plans and calls the planner (``memory_plan.py``)
with these capacities.
"""
from __future__ import annotations

Range = tuple[int, int]
UNIT = 64          # the arena's alignment: every slot starts at a multiple of it


def boundary_at_least(n: int) -> int:
    """The smallest boundary ``>= n`` of 1, 2, 3, 4, 6, 8, 12, 16, 24, 32 ... (powers of two
    and three times powers of two)."""
    if n <= 1:
        return max(n, 0)
    p = 1 << (n - 1).bit_length()          # the power of two >= n
    three_quarters = 3 * p // 4            # 3 * 2^(k-2): between p / 2 and p
    return three_quarters if p >= 4 and three_quarters >= n else p


def slot_capacity(nbytes: int) -> int:
    """The bytes a bucket's plan gives an activation of ``nbytes`` (0 stays 0)."""
    units = -(-int(nbytes) // UNIT)
    return boundary_at_least(units) * UNIT
