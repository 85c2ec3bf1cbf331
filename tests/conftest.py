"""Shared fixtures: the light models (shipped and random weights) and transformer exports."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))  # tests/oracle.py, tests/model_builders.py


@pytest.fixture(scope="session")
def transformer_models(tmp_path_factory):
    """BERT- and GPT-2-style ONNX exports (2 layers, hidden 768, 12 heads, random weights)."""
    from model_builders import build_transformer_models
    return build_transformer_models(tmp_path_factory.mktemp("transformers"))


_THREADS_AT_START: list[int] = []


@pytest.fixture(autouse=True)
def _thread_count_is_left_alone():
    """No test, fixture or import, and nothing fusegraph does, changes the process's intra-op
    thread count for good (README: what fusegraph does to your process)."""
    import torch
    before = torch.get_num_threads()
    if not _THREADS_AT_START:
        _THREADS_AT_START.append(before)
    if before != _THREADS_AT_START[0]:
        torch.set_num_threads(_THREADS_AT_START[0])
        pytest.fail(f"torch's thread count was {before}, not {_THREADS_AT_START[0]}, before this test: a "
                    f"fixture or an import changed it")
    yield
    after = torch.get_num_threads()
    if after != before:
        torch.set_num_threads(before)
        pytest.fail(f"torch's thread count went from {before} to {after} during this test")
