"""``"file.py:factory"``: a torch model built by a Python function, for the command line only
(``fusegraph compile model.py:make_model --example-input 1x3x224x224``); ``fg.compile`` never
runs a string as Python (give it the module).

``factory()`` returns an ``nn.Module``, or ``(module, example_inputs)``. Example inputs come
from the caller first (``--example-input`` shapes such as ``1x3x224x224`` or ``2x16:int64``,
random values), then the factory's own, then a module-level ``example_inputs()`` function in
the same file. The module is put in eval mode. This runs the file's code, as ``python file.py``
would: give only files you trust.
"""
from __future__ import annotations

import importlib.util
import re
from pathlib import Path
from typing import Any

from ..errors import InputError, ModelLoadError

_SPEC = re.compile(r"^(?P<file>.+\.py):(?P<fn>[A-Za-z_]\w*)$")
_DTYPES = {"float32": "float32", "float": "float32", "float16": "float16", "bfloat16": "bfloat16",
           "float64": "float64", "int64": "int64", "int32": "int32", "bool": "bool", "uint8": "uint8"}


def is_python_spec(model: Any) -> bool:
    return isinstance(model, str) and _SPEC.match(model) is not None


def parse_example_input(text: str, seed: int = 0):
    """``1x3x224x224`` (float32, standard normal) or ``2x16:int64`` (integers in [0, 100))."""
    import torch
    shape_text, _, dtype_text = text.partition(":")
    try:
        shape = [int(d) for d in shape_text.lower().split("x")] if shape_text else []
    except ValueError:
        raise InputError(f"--example-input {text!r}: expected a shape such as 1x3x224x224 "
                         f"(optionally :int64)") from None
    name = _DTYPES.get(dtype_text or "float32")
    if name is None:
        raise InputError(f"--example-input {text!r}: unknown dtype {dtype_text!r}; one of {sorted(_DTYPES)}")
    dtype = getattr(torch, name)
    g = torch.Generator().manual_seed(seed)
    if dtype.is_floating_point:
        return torch.randn(shape, generator=g).to(dtype)
    if dtype == torch.bool:
        return torch.ones(shape, dtype=torch.bool)
    return torch.randint(0, 100, shape, generator=g, dtype=dtype)


def load_python_model(spec: str, example_inputs: Any = None):
    """(module in eval mode, example inputs) from ``"file.py:factory"``."""
    m = _SPEC.match(spec)
    path = Path(m.group("file"))
    if not path.is_file():
        raise ModelLoadError(f"{spec}: file {str(path)!r} does not exist")
    loader = importlib.util.spec_from_file_location(f"fusegraph_user_{path.stem}", path)
    module = importlib.util.module_from_spec(loader)
    try:
        loader.loader.exec_module(module)
    except Exception as exc:
        raise ModelLoadError(f"{spec}: running {path} failed: {type(exc).__name__}: {exc}") from exc
    factory = getattr(module, m.group("fn"), None)
    if not callable(factory):
        raise ModelLoadError(f"{spec}: {path} defines no function {m.group('fn')!r}")
    try:
        built = factory()
    except Exception as exc:
        raise ModelLoadError(f"{spec}: {m.group('fn')}() failed: {type(exc).__name__}: {exc}") from exc
    own = None
    if isinstance(built, tuple) and len(built) == 2:
        built, own = built
    import torch
    if not isinstance(built, torch.nn.Module):
        raise ModelLoadError(f"{spec}: {m.group('fn')}() returned a {type(built).__name__}, not a torch.nn.Module")
    inputs = example_inputs if example_inputs is not None else own
    if inputs is None and callable(getattr(module, "example_inputs", None)):
        inputs = module.example_inputs()
    if inputs is None:
        raise ModelLoadError(f"{spec}: no example inputs; give them (--example-input 1x3x224x224), return "
                             f"(module, inputs) from {m.group('fn')}(), or define example_inputs() in {path.name}")
    return built.eval(), inputs


def resolve_model_arg(model: str, example_inputs: Any = None):
    """The command line's model argument: ``file.py:factory`` becomes (its module, its example
    inputs); anything else is passed on as it is."""
    if is_python_spec(model):
        return load_python_model(model, example_inputs)
    return model, example_inputs
