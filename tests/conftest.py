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
