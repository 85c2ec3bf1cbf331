"""fusegraph: a graph engine for deep-learning inference on PyTorch kernels.

    import fusegraph as fg
    model = fg.compile("model.onnx", config=fg.Config(streams=2))
    outputs = model.run({"input": x})
"""
from . import errors
from .compiler import CompiledModel, TensorSpec, compile, load
from .config import Config
from .config_file import load_config
from .report.version import FUSEGRAPH_VERSION as __version__
from .runtime.run_control import CancelToken

__all__ = ["CancelToken", "Config", "CompiledModel", "TensorSpec", "compile", "errors", "load", "load_config",
           "__version__"]
