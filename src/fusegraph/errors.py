"""Typed errors of fusegraph.

Every error names what it is about (model, node, op, input) and what was expected, so a user
can act on it without reading a traceback. Nothing here knows any framework or kernel.
"""
from __future__ import annotations


class FusegraphError(Exception):
    """Base class of every error fusegraph raises on purpose."""


class ModelLoadError(FusegraphError):
    """A model file or object could not be read: missing, truncated, malformed or hostile."""


class UnsupportedOpError(FusegraphError):
    """A node whose op (or op version, or attribute combination) has no kernel."""

    def __init__(self, message: str, *, node: str | None = None, op_type: str | None = None):
        super().__init__(message)
        self.node = node
        self.op_type = op_type


class InputError(FusegraphError):
    """Feeds given to ``run`` do not match the model's inputs (name, rank, shape or dtype)."""


class ShapeInferenceError(FusegraphError):
    """Shapes or dtypes of a node's inputs are inconsistent with what the op accepts."""


class VerifyError(FusegraphError):
    """``Graph.verify()`` found a broken invariant (definition, order, shape, dtype)."""


class KernelError(FusegraphError):
    """A kernel failed at run time; the message names the node and op."""


class ConfigError(FusegraphError):
    """An invalid ``fg.Config`` value or config-file key."""


class ArtifactError(FusegraphError):
    """A ``.fgm`` artifact is corrupt, tampered with, from the future or for another machine."""


class PassError(FusegraphError):
    """A pass broke the graph or a fixed-point group did not converge."""


class PlanError(FusegraphError):
    """An execution plan (order, memory slots, streams) does not fit its graph or breaks an invariant."""


class ModelClosedError(FusegraphError):
    """``run`` was called on a model after ``close()``."""


class UsageError(FusegraphError):
    """A call (or command line) whose arguments contradict each other or the model given:
    a compile option for an already compiled artifact, an output path that cannot be written."""


class RunCancelled(FusegraphError):
    """A run was stopped before it finished: its ``CancelToken`` was cancelled (or the model
    was told to stop, e.g. a server shutting down). The model is ready for its next run."""

    def __init__(self, message: str, *, reason: str = "cancelled", node: str | None = None):
        super().__init__(message)
        self.reason = reason
        self.node = node


class RunDeadlineExceeded(RunCancelled, TimeoutError):
    """A run passed its deadline (``model.run(feeds, timeout=...)`` or a token made with a
    timeout) and was stopped between two kernels; also a ``TimeoutError``."""


class RunLimitExceeded(FusegraphError):
    """A run asked for more than its ``Config`` caps allow (``max_run_bytes``: a tensor whose
    size comes from run-time data; ``max_loop_iterations``: a Loop's iterations); the message
    names the node and the size. Nothing was allocated for it."""

    def __init__(self, message: str, *, node: str | None = None, requested: int | None = None,
                 limit: int | None = None):
        super().__init__(message)
        self.node = node
        self.requested = requested
        self.limit = limit
