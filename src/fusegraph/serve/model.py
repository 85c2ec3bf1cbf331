"""A served model: its protocol specs, its instances, and how a batch of requests runs.

An *instance* is one ``CompiledModel`` (its own arena and executor lock) driven by its own
worker thread (``batcher.py``), with ``torch.set_num_threads`` set on that thread; instances
x threads never exceed the machine's cores (``settings.bound_threads``).

Batch sizes. A model whose batch axis is symbolic (``batch`` in an ONNX export) runs any
batch as it is. A static-shape model (resnet50's ``1x3x224x224``) is compiled once per batch
size, since fusegraph plans memory and script segments for fixed shapes: from its ONNX source,
lazily (or at start with ``warmup``), for the sizes 1, 2, 4, ... up to ``max_batch_size`` (and
that size itself), or the config's ``batch_sizes``. A batch of 5 runs on the size-8 variant
with the last request's rows repeated as padding, and the padding rows are dropped from the
outputs. Each variant is a whole compiled model (weights, oneDNN's prepacked copies, its own
arena: ~300 MiB for resnet50 at batch 8), per instance, so few sizes keep memory down; each
instance keeps at most ``batch_variants`` of them (least recently used is closed first). When
no variant can be built (an ``.fgm`` has no source to recompile; a graph that hard-codes its
batch in a Reshape), the batch runs request by request on the base model: correct, just not
faster. What happens is logged once per model.
"""
from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from pathlib import Path

import numpy as np

from ..errors import FusegraphError, ModelLoadError
from .settings import ModelSettings, bound_threads
from .tensors import TensorSpec, datatype_of

log = logging.getLogger("fusegraph.serve")


def _specs(values, batch_axis: int | None) -> list[TensorSpec]:
    specs = []
    for v in values:
        if v.shape is None:
            raise ModelLoadError(f"{v.name!r} has unknown rank: the server needs each input's rank")
        shape = tuple(-1 if not isinstance(d, int) or (batch_axis is not None and i == batch_axis) else d
                      for i, d in enumerate(v.shape))
        symbols = tuple(d if isinstance(d, str) and i != batch_axis else None for i, d in enumerate(v.shape))
        specs.append(TensorSpec(v.name, datatype_of(v.dtype), shape, symbols))
    return specs


def variant_sizes(settings: ModelSettings, static_batch: int | None) -> list[int]:
    """The batch sizes a static-shape model is compiled for: ``batch_sizes`` or 1, 2, 4, ..,
    always with ``max_batch_size`` (every batch fits) and the model's own size (no compile)."""
    sizes, s = set(settings.batch_sizes), 1
    while not settings.batch_sizes and s < settings.max_batch_size:
        sizes.add(s)
        s *= 2
    return sorted(sizes | {settings.max_batch_size} | ({static_batch} if static_batch else set()))


def _constants(graph) -> dict:
    from onnx import numpy_helper
    values = {t.name: numpy_helper.to_array(t) for t in graph.initializer}
    for node in graph.node:
        if node.op_type == "Constant" and node.attribute and node.attribute[0].name == "value":
            values[node.output[0]] = numpy_helper.to_array(node.attribute[0].t)
    return values


def _with_batch(proto, axis: int, size: int, static: int = 1):
    """A copy of the ONNX model whose inputs and outputs have ``size`` on ``axis``.

    A Reshape whose constant target shape repeats the model's batch on ``axis`` where its input
    has that batch too (resnet50's ``Reshape(x, [1, 2048])``) gets ``0`` there instead: ONNX's
    "copy the input's dim", so it follows the batch. The caller verifies the result numerically.
    """
    import onnx
    from onnx import numpy_helper
    model = onnx.ModelProto()
    model.CopyFrom(proto)
    graph = model.graph
    try:
        inferred = onnx.shape_inference.infer_shapes(proto).graph
    except Exception:  # noqa: BLE001 - no shapes: Reshapes stay as they are
        inferred = None
    known = {}
    for vi in (list(inferred.value_info) + list(inferred.input) if inferred is not None else []):
        known[vi.name] = [d.dim_value if d.HasField("dim_value") else None for d in vi.type.tensor_type.shape.dim]
    consts = _constants(graph)
    for i, node in enumerate(graph.node):
        if node.op_type != "Reshape" or len(node.input) < 2 or node.input[1] not in consts:
            continue
        if any(a.name == "allowzero" and a.i for a in node.attribute):
            continue
        target, shape_in = consts[node.input[1]], known.get(node.input[0])
        if target.ndim == 1 and len(target) > axis and target[axis] == static and shape_in \
                and len(shape_in) > axis and shape_in[axis] == static:
            target = target.copy()
            target[axis] = 0
            name = f"{node.input[1]}__fg_batch_{i}"
            graph.initializer.append(numpy_helper.from_array(target, name))
            node.input[1] = name
    inits = {t.name for t in graph.initializer}
    del graph.value_info[:]
    for vi in list(graph.input) + list(graph.output):
        if vi.name in inits:
            continue
        dims = vi.type.tensor_type.shape.dim
        if len(dims) > axis:
            dims[axis].ClearField("dim_param")
            dims[axis].dim_value = size
    return model


class ModelSource:
    """Where instances come from: an ``.fgm`` (loaded) or an ONNX file (compiled)."""

    def __init__(self, path: Path, settings: ModelSettings):
        self.path = Path(path)
        self.settings = settings
        self.onnx = None
        if self.path.suffix != ".fgm":
            import onnx
            try:
                self.onnx = onnx.load(str(self.path))
            except Exception as exc:  # noqa: BLE001 - any unreadable file
                raise ModelLoadError(f"{self.path}: cannot read as ONNX: {exc}") from None

    def base(self):
        import fusegraph as fg
        if self.onnx is None:
            return fg.load(self.path)
        return fg.compile(self.onnx, config=self.settings.compile.replace(threads=None))

    def variant(self, size: int, static: int = 1):
        """The model compiled for batch ``size``, or None when it cannot be."""
        if self.onnx is None:
            return None
        import fusegraph as fg
        proto = _with_batch(self.onnx, self.settings.batch_axis, size, static)
        return fg.compile(proto, config=self.settings.compile.replace(threads=None))


class Instance:
    """One compiled model (plus batch variants) used by one worker thread at a time."""

    def __init__(self, served: "ServedModel", index: int, base):
        self.served = served
        self.index = index
        self.base = base
        self.variants: OrderedDict[int, object] = OrderedDict()
        self.failed: set[int] = set()

    def _model_for(self, size: int):
        if size == self.served.static_batch:
            return self.base
        if size in self.variants:
            self.variants.move_to_end(size)
            return self.variants[size]
        if size in self.failed:
            return None
        try:
            model = self.served.source.variant(size, self.served.static_batch)
            if model is not None:
                self._check_variant(model, size)
        except FusegraphError as exc:
            self.served.note_once(f"batch size {size} cannot be compiled ({exc}); such batches run request "
                                  f"by request")
            model = None
        if model is None:
            self.failed.add(size)
            return None
        self.variants[size] = model
        while len(self.variants) > self.served.settings.batch_variants:
            _, old = self.variants.popitem(last=False)
            old.close()
        return model

    def _check_variant(self, model, size: int) -> None:
        """The variant's outputs have the batch on the axis, and each of its rows equals the
        base model's run of that row (rtol 1e-3: a separate compilation, never a different
        function), on random inputs."""
        axis = self.served.settings.batch_axis
        for spec in model.outputs:
            if spec.shape is None or len(spec.shape) <= axis or spec.shape[axis] != size:
                raise ModelLoadError(f"output {spec.name!r} of the batch-{size} variant has shape "
                                     f"{spec.shape}, not batch {size} on axis {axis}")
        rng = np.random.default_rng(0)
        feeds = {}
        for spec in model.inputs:
            dtype = spec.dtype.to_numpy()
            feeds[spec.name] = (rng.standard_normal(spec.shape).astype(dtype) if np.issubdtype(dtype, np.floating)
                                else np.zeros(spec.shape, dtype))
        got = model.run(feeds)
        for i in range(size):
            want = self.base.run({k: np.take(v, [i], axis=axis) for k, v in feeds.items()})
            for k, w in want.items():
                g = np.take(got[k], [i], axis=axis)
                if g.shape != w.shape or not np.allclose(g, w, rtol=1e-3, atol=1e-4 * max(1.0, float(np.abs(w).max()))):
                    raise ModelLoadError(f"the batch-{size} variant's output {k!r} row {i} differs from a "
                                         f"run of that row alone")

    def warmup(self) -> None:
        for size in (self.served.sizes if self.served.resizes else []):
            self._model_for(size)

    def run(self, feeds: dict[str, np.ndarray], rows: int) -> dict[str, np.ndarray]:
        """Run ``rows`` stacked rows: directly, on a padded variant, or row by row."""
        served = self.served
        if not served.resizes:
            return self.base.run(feeds)
        axis = served.settings.batch_axis
        size = next(s for s in served.sizes if s >= rows)
        model = self._model_for(size)
        if model is None:
            parts = [self.base.run({k: np.take(v, [i], axis=axis) for k, v in feeds.items()}) for i in range(rows)]
            return {k: np.concatenate([p[k] for p in parts], axis=axis) for k in parts[0]}
        if size > rows:
            feeds = {k: np.concatenate([v] + [np.take(v, [rows - 1], axis=axis)] * (size - rows), axis=axis)
                     for k, v in feeds.items()}
        outputs = model.run(feeds)
        if size > rows:
            outputs = {k: np.take(v, range(rows), axis=axis) for k, v in outputs.items()}
        return outputs

    def close(self) -> None:
        for m in list(self.variants.values()) + [self.base]:
            m.close()


class ServedModel:
    """A named model in the repository, with its instances and protocol specs."""

    def __init__(self, name: str, path: Path, settings: ModelSettings):
        self.name = name
        self.source = ModelSource(path, settings)
        self.instance_count, self.threads = bound_threads(settings)
        if self.instance_count < settings.instances:
            log.warning("instances cut to the core count", extra={"model": name,
                        "asked": settings.instances, "instances": self.instance_count})
        self.settings = settings
        self._notes: set[str] = set()
        base = self.source.base()
        self.platform = "fusegraph_fgm" if self.source.onnx is None else "fusegraph_onnx"
        axis = settings.batch_axis if settings.batching else None
        if axis is not None:
            for v in base.inputs + base.outputs:
                if v.shape is None or len(v.shape) <= axis:
                    raise ModelLoadError(f"model {name!r}: max_batch_size is set but {v.name!r} has no axis "
                                         f"{axis} (batch_axis)")
        dims = {v.shape[axis] for v in base.inputs} if axis is not None else set()
        if axis is not None and len(dims) != 1:
            raise ModelLoadError(f"model {name!r}: the inputs disagree on the batch axis {axis}: {sorted(map(str, dims))}")
        dim = next(iter(dims)) if dims else None
        self.static_batch = dim if isinstance(dim, int) else None
        self.resizes = axis is not None and self.static_batch is not None
        self.sizes = variant_sizes(settings, self.static_batch) if self.resizes else []
        if self.resizes and self.source.onnx is None:
            self.note_once("a static-shape .fgm cannot be recompiled per batch size; batches run request by "
                           "request (serve the ONNX model to batch it)")
        self.batch_axis = axis
        self.inputs = _specs(base.inputs, axis)
        self.outputs = _specs(base.outputs, axis)
        self.instances = [Instance(self, 0, base)]
        for i in range(1, self.instance_count):
            self.instances.append(Instance(self, i, self.source.base()))
        self.ready = threading.Event()

    def note_once(self, text: str) -> None:
        if text not in self._notes:
            self._notes.add(text)
            log.warning(text, extra={"model": self.name})

    def metadata(self) -> dict:
        return {"name": self.name, "versions": ["1"], "platform": self.platform,
                "inputs": [s.to_json() for s in self.inputs], "outputs": [s.to_json() for s in self.outputs]}

    def close(self) -> None:
        for inst in self.instances:
            inst.close()
