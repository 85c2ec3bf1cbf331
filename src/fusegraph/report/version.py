"""The fusegraph version that artifacts, reports and the server record: one constant, the
package's own (``fusegraph.__version__`` is this), kept equal to ``pyproject.toml``'s by a test."""
from __future__ import annotations

FUSEGRAPH_VERSION = "0.1.0"
