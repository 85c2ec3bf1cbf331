"""Checking and converting user feeds (numpy arrays or torch tensors) before a run.

Every mismatch raises ``InputError`` naming the input, what was expected and what was given.
Symbolic dims must agree across inputs (two inputs with dim ``batch`` get the same size).
A sequence input (``meta["container"]``) takes a list of arrays, an optional one also None;
its tensors are copied (a sequence owns its elements, ``ops/sequence.py``).
``random_feeds`` makes inputs for a model's specs (the CLI's and bisect's default inputs).
"""
from __future__ import annotations

from typing import Any, Mapping

import numpy as np
import torch

from ..errors import InputError
from ..ir.arrays import numpy_to_torch
from ..ir import DType, Value
from ..ir.shape import format_shape


def _describe(shape) -> str:
    return format_shape(tuple(shape))


def convert_feeds(model_name: str, inputs: list[Value], feeds: Mapping[str, Any]) -> list[torch.Tensor]:
    if not isinstance(feeds, Mapping):
        raise InputError(f"{model_name}: run() takes a dict of input name -> array, got "
                         f"{type(feeds).__name__}")
    expected = {v.name for v in inputs}
    unknown = [k for k in feeds if k not in expected]
    if unknown:
        raise InputError(f"{model_name}: unknown input name(s) {unknown}; the model's inputs are "
                         f"{sorted(expected)}")
    missing = [v.name for v in inputs if v.name not in feeds]
    if missing:
        raise InputError(f"{model_name}: missing input(s) {missing}; expected "
                         + ", ".join(f"{v.name}: {v.type_str()}" for v in inputs))
    symbols: dict[str, tuple[int, str]] = {}
    tensors = []
    for v in inputs:
        if "container" in v.meta:
            tensors.append(_container_feed(model_name, v, feeds[v.name]))
        else:
            tensors.append(_check_one(model_name, v, feeds[v.name], symbols))
    return tensors


def _container_feed(model_name: str, v: Value, given: Any):
    from ..ops.sequence import TensorSequence
    kind = v.meta["container"]
    if given is None:
        if kind.startswith("optional"):
            return None
        raise InputError(f"{model_name}: input {v.name!r} is a sequence; None is not one")
    if kind == "optional":
        elem = Value(v.name, DType(v.meta.get("elem_dtype", 0)), None)
        return _check_one(model_name, elem, given, {})
    if not isinstance(given, (list, tuple)):
        raise InputError(f"{model_name}: input {v.name!r} is a sequence: give a list of arrays, got "
                         f"{type(given).__name__}")
    elem = Value(v.name, DType(v.meta.get("elem_dtype", 0)), None)
    seq = TensorSequence(_check_one(model_name, elem, x, {}).clone() for x in given)
    seq.elem_dtype = elem.dtype
    return seq


def _check_one(model_name: str, v: Value, given: Any, symbols: dict) -> torch.Tensor:
    if isinstance(given, torch.Tensor):
        try:
            dtype = DType.from_torch(given.dtype)
        except TypeError:
            raise InputError(f"{model_name}: input {v.name!r} expects {v.dtype.name}, got torch {given.dtype}") from None
        tensor = given
    else:
        if not isinstance(given, np.ndarray):
            if isinstance(given, (list, tuple, int, float, bool, np.generic)):
                given = np.asarray(given)
            else:
                raise InputError(f"{model_name}: input {v.name!r} must be a numpy array or torch tensor, "
                                 f"got {type(given).__name__}")
        try:
            dtype = DType.from_numpy(given.dtype)
        except TypeError:
            raise InputError(f"{model_name}: input {v.name!r} expects {v.dtype.name}, got numpy "
                             f"{given.dtype}") from None
        tensor = None
    if v.dtype != DType.UNDEFINED and dtype != v.dtype:
        raise InputError(f"{model_name}: input {v.name!r} expects dtype {v.dtype.name} "
                         f"({v.type_str()}), got {dtype.name}")
    shape = tuple(given.shape)
    if v.shape is not None:
        if len(shape) != len(v.shape):
            raise InputError(f"{model_name}: input {v.name!r} expects rank {len(v.shape)} "
                             f"(shape {format_shape(v.shape)}), got rank {len(shape)} (shape {_describe(shape)})")
        for axis, (want, got) in enumerate(zip(v.shape, shape)):
            if isinstance(want, int) and want != got:
                raise InputError(f"{model_name}: input {v.name!r} expects shape {format_shape(v.shape)}, "
                                 f"got {_describe(shape)} (dim {axis} must be {want})")
            if isinstance(want, str):
                seen = symbols.get(want)
                if seen is not None and seen[0] != got:
                    raise InputError(f"{model_name}: input {v.name!r} dim {axis} ({want!r}) is {got}, but "
                                     f"input {seen[1]!r} set {want!r} = {seen[0]}")
                symbols[want] = (got, v.name)
    if tensor is None:
        tensor = numpy_to_torch(given if given.flags.writeable else np.array(given), model_name, v.name,
                                error=InputError)
    return tensor


def random_feeds(specs, seed: int = 0) -> dict[str, np.ndarray]:
    """Random inputs for ``specs`` (a model's ``inputs``, or a graph's: anything with name,
    shape, dtype); symbolic dims become 1, integers fall in [0, 10), booleans are random."""
    rng = np.random.default_rng(seed)
    feeds = {}
    for spec in specs:
        if spec.dtype == DType.UNDEFINED:
            raise InputError(f"input {spec.name!r} is not a tensor of a known type (a sequence or an "
                             f"optional): give it explicitly")
        if spec.shape is None:
            raise InputError(f"input {spec.name!r} has unknown rank: random inputs need it; give this "
                             f"input explicitly (fusegraph run: --input {spec.name}=FILE.npy)")
        shape = [d if isinstance(d, int) else 1 for d in spec.shape]
        np_dtype = spec.dtype.to_numpy()
        if np.issubdtype(np_dtype, np.floating):
            feeds[spec.name] = rng.standard_normal(shape).astype(np_dtype)
        elif np_dtype == np.bool_:
            feeds[spec.name] = rng.integers(0, 2, shape).astype(np.bool_)
        else:
            feeds[spec.name] = rng.integers(0, 10, shape).astype(np_dtype)
    return feeds



def empty_symbolic_dims(inputs: list[Value], shapes) -> str:
    """`` (input 'x' dim 1 ('seq') is 0; ...)`` for the inputs' symbolic dims that are 0 in
    ``shapes`` (exports rarely allow an empty sequence or batch), or "": named in the refusal
    of a run whose shape arithmetic fails at those shapes."""
    zero = [f"input {v.name!r} dim {i} ({d!r}) is 0" for v, shape in zip(inputs, shapes)
            for i, d in enumerate(v.shape or ()) if not isinstance(d, int) and i < len(shape) and shape[i] == 0]
    return f" ({'; '.join(zero)})" if zero else ""
