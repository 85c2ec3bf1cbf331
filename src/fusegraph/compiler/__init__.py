"""The driver: ``compile()`` / ``load()`` (``driver.py``), the model users hold
(``model.py``), planning (``planning.py``), per-shape compiles (``specialize.py``) and the
``precision="auto"`` search (``precision_auto.py``). The stages' algorithms live in their own
packages; this one only sequences them."""
from .driver import compile, load  # noqa: A004 - the public API name
from .model import CompiledModel, TensorSpec

__all__ = ["CompiledModel", "TensorSpec", "compile", "load"]
