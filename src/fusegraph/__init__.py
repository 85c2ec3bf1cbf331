"""fusegraph: a graph engine for deep-learning inference on PyTorch kernels.

    import fusegraph as fg
    model = fg.compile("model.onnx", config=fg.Config(streams=2))
    outputs = model.run({"input": x})
"""
from .config import Config
from .compiler import CompiledModel, TensorSpec, compile, load
from .config_file import load_config
from .runtime.run_control import CancelToken
from . import errors

__version__ = "0.1.0"
__all__ = ["CancelToken", "Config", "CompiledModel", "TensorSpec", "compile", "errors", "load", "load_config",
           "__version__"]
