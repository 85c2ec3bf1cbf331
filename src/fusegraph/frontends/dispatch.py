"""Which frontend a model object or path goes to, for the frameworks other than ONNX:

- an ``nn.Module`` (with ``example_inputs``) or an ``ExportedProgram``: ``frontends/torch.py``;
- a SavedModel folder, a Keras model, a ``GraphDef``: ``frontends/tensorflow.py``.

Returns None for anything else (the ONNX frontend's inputs). Detection imports neither torch's
exporter nor TensorFlow unless the model is theirs. A string is never run as Python here: the
command line's ``file.py:factory`` models are built by the CLI (``frontends/python_model.py``)
and handed over as modules.
"""
from __future__ import annotations

from typing import Any


def import_other(model: Any, example_inputs: Any = None, dynamic_shapes: Any = None):
    import torch
    if isinstance(model, (torch.nn.Module, torch.export.ExportedProgram)):
        from .torch import import_torch
        return import_torch(model, example_inputs, dynamic_shapes)
    from .tensorflow import import_tensorflow, is_saved_model, is_tensorflow_object
    if is_saved_model(model) or is_tensorflow_object(model):
        return import_tensorflow(model)
    return None
