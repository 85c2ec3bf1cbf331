"""Fixtures for the pass tests; puts this folder on sys.path for ``passes_util``."""
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).parent))


def _frontend_drops_0d() -> bool:
    from fusegraph.frontends import onnx_data
    scalar = np.array(3, np.int64)
    scalar.setflags(write=False)  # as numpy_helper.to_array returns it
    return tuple(onnx_data.numpy_to_torch(scalar).shape) != ()


@pytest.fixture(autouse=True)
def keep_0d_constants(monkeypatch):
    """Work around a frontend bug while it lasts: ``onnx_data.numpy_to_torch`` turns 0-d
    constants into shape [1] (``np.ascontiguousarray`` returns ndim >= 1), which breaks every
    exporter Shape -> Gather(scalar) chain before any pass runs. Inactive once fixed."""
    if not _frontend_drops_0d():
        return
    from fusegraph.frontends import onnx_data
    original = onnx_data.numpy_to_torch

    def fixed(arr, where="model", name=""):
        t = original(arr, where, name)
        return t.reshape(arr.shape) if tuple(t.shape) != tuple(arr.shape) else t
    monkeypatch.setattr(onnx_data, "numpy_to_torch", fixed)
