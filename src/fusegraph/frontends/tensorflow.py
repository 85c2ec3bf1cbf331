"""TensorFlow frontend: a SavedModel folder, a Keras model or a frozen ``GraphDef`` becomes an
IR ``Graph``, through ``tf2onnx``'s Python API (opset 17) and the ONNX frontend.

- A Keras model: ``tf2onnx.convert.from_keras`` with the model's own input signature (unknown
  dims stay symbolic); output names are the model's.
- A SavedModel folder (one holding ``saved_model.pb``): its ``serving_default`` signature (or the
  one named by ``signature``) is frozen by ``tf2onnx.tf_loader.from_saved_model`` and converted;
  inputs and outputs keep the signature's names.
- A ``GraphDef`` (frozen: variables as constants): inputs are its Placeholders, outputs the
  nodes nothing reads, unless named.

For Keras models only tf2onnx's transpose optimiser runs (it cancels the NHWC <-> NCHW
transposes its conversion inserts); a SavedModel or GraphDef goes through tf2onnx's default
conversion (its Python API offers no choice there). fusegraph's frontend adds no optimisation. TensorFlow and tf2onnx are an optional
extra: without them every entry point raises ``ModelLoadError`` naming ``fusegraph[tensorflow]``.
"""
from __future__ import annotations

import os
import sys
import warnings
from pathlib import Path
from typing import Any

from ..errors import ModelLoadError, UnsupportedOpError
from ..ir import Graph

OPSET = 17
_EXTRA = "pip install 'fusegraph[tensorflow]'"


def _ortools_before_tensorflow() -> None:
    """OR-Tools (the exact memory planner's CP-SAT) and TensorFlow bundle clashing protobuf /
    abseil builds: CP-SAT segfaults when TensorFlow was loaded first, and works when it was
    loaded second. So load OR-Tools first; when TensorFlow is already there without it, keep
    OR-Tools out of this process (the planner falls back to its other solvers) and say so."""
    if "ortools.sat.python.cp_model" in sys.modules:
        return
    if "tensorflow" not in sys.modules:
        try:
            from ortools.sat.python import cp_model  # noqa: F401
        except ImportError:
            pass
        return
    warnings.warn("TensorFlow was imported before OR-Tools, whose CP-SAT solver would then crash this "
                  "process; fusegraph's exact memory planner will not use CP-SAT here (import fusegraph's "
                  "TensorFlow frontend, or ortools, before tensorflow to keep it)", RuntimeWarning, stacklevel=3)
    sys.modules["ortools.sat.python.cp_model"] = None    # import -> ImportError -> other solvers


def _modules():
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    _ortools_before_tensorflow()
    try:
        import tensorflow as tf
        import tf2onnx
        from tf2onnx import tf_loader
    except ImportError as exc:
        raise ModelLoadError(f"compiling a TensorFlow model needs TensorFlow and tf2onnx, which are not "
                             f"installed ({exc.name or exc}): {_EXTRA}") from None
    return tf, tf2onnx, tf_loader


def is_saved_model(model: Any) -> bool:
    return isinstance(model, (str, Path)) and Path(model).is_dir() and (Path(model) / "saved_model.pb").is_file()


def is_tensorflow_object(model: Any) -> bool:
    """A Keras model or a GraphDef, recognised without importing TensorFlow."""
    mod = type(model).__module__ or ""
    names = {c.__name__ for c in type(model).__mro__}
    if "GraphDef" in names and ("tensorflow" in mod or "tensorflow" in str(type(model))):
        return True
    return mod.split(".")[0] in ("keras", "tf_keras", "tensorflow") and ("Model" in names or "Layer" in names)


def import_tensorflow(model: Any, *, signature: str = "serving_default", input_names=None,
                      output_names=None) -> Graph:
    """Build an IR graph from a SavedModel folder, a Keras model or a frozen GraphDef."""
    tf, tf2onnx, tf_loader = _modules()
    from .onnx import import_onnx
    if is_saved_model(model):
        proto, where = _from_saved_model(str(model), signature, tf2onnx, tf_loader), str(model)
    elif isinstance(model, tf.compat.v1.GraphDef):
        proto, where = _from_graph_def(model, input_names, output_names, tf2onnx), "GraphDef"
    elif hasattr(model, "inputs") and hasattr(model, "outputs") and hasattr(model, "name"):
        proto, where = _from_keras(model, tf, tf2onnx), f"keras model {model.name!r}"
    elif isinstance(model, (str, Path)) and Path(model).is_dir():
        raise ModelLoadError(f"{model}: a folder is accepted as a TensorFlow SavedModel only; it holds "
                             f"no saved_model.pb")
    else:
        raise ModelLoadError(f"cannot import a {type(model).__name__} with the TensorFlow frontend: give a "
                             f"SavedModel folder, a Keras model or a frozen GraphDef")
    graph = import_onnx(proto)
    graph.meta["source"] = where
    graph.meta["frontend"] = "tensorflow (tf2onnx)"
    return graph


def _convert(fn, where: str):
    try:
        proto, _ = fn()
    except (ModelLoadError, UnsupportedOpError):
        raise
    except Exception as exc:  # tf2onnx raises plain exceptions for ops it cannot convert
        raise UnsupportedOpError(f"{where}: tf2onnx could not convert it: {type(exc).__name__}: "
                                 f"{str(exc).splitlines()[0] if str(exc) else ''}") from exc
    return proto


def _from_keras(model, tf, tf2onnx):
    from tf2onnx.optimizer.transpose_optimizer import TransposeOptimizer
    specs = []
    for i, t in enumerate(model.inputs):
        layer = getattr(getattr(t, "_keras_history", None), "operation", None)   # the InputLayer
        name = getattr(layer, "name", None) or (getattr(t, "name", None) or f"input_{i}").split(":")[0]
        specs.append(tf.TensorSpec(tuple(t.shape), t.dtype, name=name))
    # only tf2onnx's transpose optimiser (it cancels the NHWC <-> NCHW pairs the conversion
    # itself inserts); folding, CSE and the rest are fusegraph's passes' job (measured faster)
    layout_only = {"optimize_transpose": TransposeOptimizer}
    return _convert(lambda: tf2onnx.convert.from_keras(model, input_signature=tuple(specs), opset=OPSET,
                                                       optimizers=layout_only), f"keras model {model.name!r}")


def _from_saved_model(path: str, signature: str, tf2onnx, tf_loader):
    try:
        graph_def, inputs, outputs, renames = tf_loader.from_saved_model(
            path, None, None, signatures=[signature], return_tensors_to_rename=True)
    except Exception as exc:
        raise ModelLoadError(f"{path}: cannot load the SavedModel's {signature!r} signature: "
                             f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}") from exc
    return _convert(lambda: tf2onnx.convert.from_graph_def(graph_def, input_names=inputs, output_names=outputs,
                                                           opset=OPSET, tensors_to_rename=renames), path)


def _from_graph_def(graph_def, input_names, output_names, tf2onnx):
    if input_names is None:
        input_names = [f"{n.name}:0" for n in graph_def.node if n.op == "Placeholder"]
    if output_names is None:
        read = {i.split(":")[0].lstrip("^") for n in graph_def.node for i in n.input}
        output_names = [f"{n.name}:0" for n in graph_def.node
                        if n.name not in read and n.op not in ("Placeholder", "Const", "NoOp")]
    if not output_names:
        raise ModelLoadError("GraphDef: no output found (give output_names)")
    renames = {n: n.split(":")[0] for n in list(input_names) + list(output_names)}
    return _convert(lambda: tf2onnx.convert.from_graph_def(graph_def, input_names=list(input_names),
                                                           output_names=list(output_names), opset=OPSET,
                                                           tensors_to_rename=renames), "GraphDef")
