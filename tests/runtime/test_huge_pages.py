"""``runtime/backends/cpu/huge_pages.py``: packed weights cut from 2 MiB-aligned mappings advised
for huge pages, consecutive and 64-byte aligned, small requests and kernels without
transparent huge pages served by plain allocations, a dropped last form's bytes reused; a
compiled model's packed weights live there and compute what torch eager does."""
from __future__ import annotations

import numpy as np
import pytest
import torch

import fusegraph as fg
from fusegraph.runtime.backends.cpu import huge_pages
from fusegraph.runtime.backends.cpu.huge_pages import HUGE_PAGE, MIN_BYTES, HugeBuffers

needs_thp = pytest.mark.skipif(not huge_pages.available(), reason="no transparent huge pages on this kernel")


def _vm_flags(address: int) -> set[str]:
    """The VmFlags of the mapping holding ``address`` (``hg``: advised for huge pages)."""
    current = None
    with open("/proc/self/smaps") as f:
        for line in f:
            head = line.split()[0]
            if "-" in head and ":" not in head:
                lo, hi = (int(x, 16) for x in head.split("-"))
                current = lo <= address < hi
            elif current and line.startswith("VmFlags:"):
                return set(line.split()[1:])
    return set()


@needs_thp
def test_buffers_are_consecutive_aligned_and_advised():
    hb = HugeBuffers()
    a, b = hb.empty(MIN_BYTES + 5), hb.empty(3 * MIN_BYTES)
    assert a.dtype == torch.uint8 and a.numel() == MIN_BYTES + 5 and b.numel() == 3 * MIN_BYTES
    assert a.data_ptr() % HUGE_PAGE == 0 and b.data_ptr() % 64 == 0
    assert b.data_ptr() - a.data_ptr() == -(-(MIN_BYTES + 5) // 64) * 64       # cut from one mapping
    assert "hg" in _vm_flags(a.data_ptr())
    a.fill_(1), b.fill_(2)
    assert int(a.sum()) == a.numel() and int(b[-1]) == 2


@needs_thp
def test_a_dropped_last_buffer_is_reused_and_a_larger_request_maps_anew():
    hb = HugeBuffers()
    a = hb.empty(MIN_BYTES)
    b = hb.empty(MIN_BYTES)
    hb.give_back(a)                      # not the last one cut: stays
    hb.give_back(b)
    c = hb.empty(MIN_BYTES)
    assert c.data_ptr() == b.data_ptr()
    big = hb.empty(huge_pages.SLAB_BYTES + 1)
    assert big.data_ptr() % HUGE_PAGE == 0 and big.untyped_storage().data_ptr() != a.untyped_storage().data_ptr()


def test_small_requests_and_kernels_without_huge_pages_get_plain_memory():
    """Each its own allocation (malloc's: whether the heap itself is advised is the host
    program's business), not a cut of a mapping."""
    small = HugeBuffers().empty(MIN_BYTES - 1)
    off = HugeBuffers(enabled=False).empty(4 * MIN_BYTES)
    assert small.untyped_storage().nbytes() == MIN_BYTES - 1 and off.untyped_storage().nbytes() == 4 * MIN_BYTES
    assert not HugeBuffers(enabled=False).takes(4 * MIN_BYTES)


@needs_thp
def test_a_compiled_model_s_packed_weights_are_in_huge_page_mappings():
    """A product's weight packed at bind lives in an advised mapping, and the model computes
    what torch eager does."""
    from fusegraph.runtime.backends.cpu.dnnl import available
    if not available():
        pytest.skip("no oneDNN")
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(512, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 256)).eval()
    x = torch.randn(8, 512)
    cm = fg.compile(net, fg.Config(threads=2), example_inputs=(x,))
    forms = [p.data for forms in cm._executor.binding.backend.store.forms.values() for p in forms]
    big = [t for t in forms if t.numel() >= MIN_BYTES]
    assert big and all("hg" in _vm_flags(t.data_ptr()) for t in big)
    (y,) = cm.run({cm.inputs[0].name: x.numpy()}).values()
    with torch.no_grad():
        r = net(x).numpy()
    np.testing.assert_allclose(y, r, rtol=1e-4, atol=1e-5)
