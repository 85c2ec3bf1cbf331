"""A served model: its protocol specs, its instances, and how a batch of requests runs.

An *instance* is one ``CompiledModel`` (its own arena and executor lock) driven by its own
worker thread (``batcher.py``), with ``torch.set_num_threads`` set on that thread; instances
x threads never exceed the machine's cores (``settings.bound_threads``).

Batch sizes. A model whose batch axis is symbolic (``batch`` in an ONNX export) is one compile
for every batch size (``runtime/frames.py``): a batch of any size runs as it is. With
``Config.shape_cache`` > 0 it instead compiles itself at each batch size it runs
(``compiler/specialize.py``); so that a stream of arbitrary batch sizes does not compile on
every new one, its batches then run as chunks of the same sizes as a static model's below
(``warmup`` compiles them at start when the inputs' other dims are static; a sequence length,
say, waits for the first request). A
static-shape model (resnet50's ``1x3x224x224``) is compiled once per batch size, since fusegraph
plans memory and binds its kernels for fixed shapes: from its ONNX source, lazily (or at start
with ``warmup``), for the sizes 1, 2, 4, ... up to ``max_batch_size`` (and that size itself), or
the config's ``batch_sizes``. A batch runs as chunks of those sizes, the cheapest cover by each
size's measured time per run (``ServedModel.plan``): on a CPU, where a batch of 8 costs nearly 8
batches of 1, 5 rows run as 4 + 1; where a bigger batch is nearly free (a GPU), they run on the
size-8 variant with the last row repeated as padding, and the padding rows are dropped from the
outputs. Each variant is a whole compiled model (weights, oneDNN's prepacked copies, its own
arena: hundreds of MiB for resnet50 at batch 8, benchmarks/RESULTS.md, "Figures moved out of
docstrings"), per instance, so few sizes keep memory down; each instance keeps at most
``batch_variants`` of them (least recently used is closed first). When no variant can be built
(an ``.fgm`` has no source to recompile; a graph that hard-codes its batch in a Reshape), the
batch runs request by request on the base model: correct, just not faster. What happens is
logged once per model.
"""
from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from pathlib import Path

import numpy as np

from ..errors import ConfigError, FusegraphError, ModelLoadError
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
        if size == self.served.static_batch or self.served.static_batch is None:
            return self.base                   # a symbolic batch: the base compiles per size
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
        t0 = time.perf_counter()
        got = model.run(feeds)
        self.served.timed(size, time.perf_counter() - t0, first=True)
        for i in range(size):
            want = self.base.run({k: np.take(v, [i], axis=axis) for k, v in feeds.items()})
            for k, w in want.items():
                g = np.take(got[k], [i], axis=axis)
                if g.shape != w.shape or not np.allclose(g, w, rtol=1e-3, atol=1e-4 * max(1.0, float(np.abs(w).max()))):
                    raise ModelLoadError(f"the batch-{size} variant's output {k!r} row {i} differs from a "
                                         f"run of that row alone")

    def warmup(self) -> None:
        """Compile and check every batch size now, at the intra-op thread count this instance's
        worker runs at: the first run of a model at another count than its last re-tunes its
        kernels (several times a warm run: benchmarks/RESULTS.md, "Serving", its warm-up at
        the wrong thread count), which warming up at the caller's count left to the first requests."""
        from ..runtime.threads import intra_op_threads
        with intra_op_threads(self.served.threads):
            for size in (self.served.sizes if self.served.resizes else []):
                if self.served.static_batch is None:
                    self._specialize(size)
                else:
                    self._model_for(size)

    def _specialize(self, size: int) -> None:
        """A symbolic-batch model's compile at batch ``size``, where its other dims are static."""
        axis = self.served.settings.batch_axis
        shapes = {v.name: tuple(size if i == axis else d for i, d in enumerate(v.shape)) for v in self.base.inputs}
        if self.base.specializations is not None and all(isinstance(d, int) for s in shapes.values() for d in s):
            self.base.specialize(shapes)

    def run(self, feeds: dict[str, np.ndarray], rows: int, cancel=None) -> dict[str, np.ndarray]:
        """Run ``rows`` stacked rows: directly, or as chunks of the compiled batch sizes; every
        run stops once ``cancel`` (a ``CancelToken``) is cancelled or past its deadline."""
        served = self.served
        if not served.resizes:
            return self.base.run(feeds, cancel=cancel)
        axis = served.settings.batch_axis
        lead = (slice(None),) * axis
        parts, start = [], 0
        for size in served.plan(rows, exclude=self.failed):
            take = min(size, rows - start)
            if take <= 0:
                break
            chunk = feeds if take == rows else {
                k: np.ascontiguousarray(v[lead + (slice(start, start + take),)]) for k, v in feeds.items()}
            parts.append(self._run_chunk(chunk, take, size, cancel))
            start += take
        if len(parts) == 1:
            return parts[0]
        return {k: np.concatenate([p[k] for p in parts], axis=axis) for k in parts[0]}

    def _run_chunk(self, feeds: dict[str, np.ndarray], rows: int, size: int, cancel=None) -> dict[str, np.ndarray]:
        """``rows`` rows on the batch-``size`` variant (padded up when ``size > rows``: the last
        row repeated, its outputs dropped), or row by row on the base model when there is none."""
        served = self.served
        axis = served.settings.batch_axis
        model = self._model_for(size)
        if model is None:
            parts = [self.base.run({k: np.take(v, [i], axis=axis) for k, v in feeds.items()}, cancel=cancel)
                     for i in range(rows)]
            return {k: np.concatenate([p[k] for p in parts], axis=axis) for k in parts[0]}
        if size > rows:
            feeds = {k: np.concatenate([v] + [np.take(v, [rows - 1], axis=axis)] * (size - rows), axis=axis)
                     for k, v in feeds.items()}
        specs = getattr(model, "specializations", None)
        compiles = len(specs.compiled) if specs is not None else 0
        t0 = time.perf_counter()
        outputs = model.run(feeds, cancel=cancel)
        compiled = specs is not None and len(specs.compiled) > compiles   # this run compiled its shapes first
        served.timed(size, time.perf_counter() - t0, first=compiled)
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
        self._cost: dict[int, float] = {}  # batch size -> moving average seconds per run
        self._seeded: set[int] = set()  # sizes whose estimate is still a first run's
        self._cost_lock = threading.Lock()
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
        # a symbolic batch that one compile serves (``runtime/frames.py``) runs every batch as it is
        self.resizes = axis is not None and (self.static_batch is not None or base.specializations is not None)
        self.sizes = variant_sizes(settings, self.static_batch) if self.resizes else []
        cache = base.config.shape_cache
        if self.static_batch is None and self.resizes and cache < len(self.sizes):
            self.note_once(f"shape_cache {cache} keeps fewer compiles than the {len(self.sizes)} batch sizes "
                           f"{self.sizes}: batches of the others compile again")
        if self.resizes and self.static_batch is not None and self.source.onnx is None:
            self.note_once("a static-shape .fgm cannot be recompiled per batch size; batches run request by "
                           "request (serve the ONNX model to batch it)")
        self.batch_axis = axis
        self.inputs = _specs(base.inputs, axis)
        self.outputs = _specs(base.outputs, axis)
        if settings.warmup and axis is not None:
            self._check_batch_bytes(name, base)
        self.instances = [Instance(self, 0, base)]
        for i in range(1, self.instance_count):
            self.instances.append(Instance(self, i, self.source.base()))
        self.ready = threading.Event()

    def _check_batch_bytes(self, name: str, base) -> None:
        """``warmup`` prepares every batch size at start: refused (ConfigError) when the inputs
        and outputs of a batch of ``max_batch_size`` alone would pass ``Config.max_arena_bytes``
        (such a batch could never run)."""
        cap = self.settings.compile.max_arena_bytes
        axis, size = self.batch_axis, self.settings.max_batch_size
        total = 0
        for v in list(base.inputs) + list(base.outputs):
            if v.shape is None or not all(isinstance(d, int) or i == axis for i, d in enumerate(v.shape)):
                continue
            n = v.dtype.itemsize * size
            for i, d in enumerate(v.shape):
                n *= 1 if i == axis else d
            total += n
        if cap is not None and total > cap:
            raise ConfigError(f"model {name!r}: warmup would compile batch {size} (max_batch_size), whose inputs "
                              f"and outputs alone take {total} bytes, over Config.max_arena_bytes ({cap}); "
                              f"lower max_batch_size or turn warmup off")

    def timed(self, size: int, seconds: float, first: bool = False) -> None:
        """Record a run of the batch-``size`` variant: a moving average of its time per run,
        shared by the instances. A first run (the check of a new variant), which may still warm
        caches, only seeds the estimate until the size runs for real."""
        with self._cost_lock:
            old = self._cost.get(size)
            if first:
                if old is None:
                    self._cost[size] = seconds
                    self._seeded.add(size)
            elif old is None or size in self._seeded:
                self._cost[size] = seconds
                self._seeded.discard(size)
            else:
                self._cost[size] = 0.8 * old + 0.2 * seconds

    def plan(self, rows: int, exclude=()) -> list[int]:
        """The compiled batch sizes to run ``rows`` rows as, cheapest first by estimated time.

        Chunks of the sizes cover the rows; only the last may be padded. A size's estimate is
        its measured time per run (``timed``), or, before it has run, its rows times the lowest
        measured time per row (rows alone when nothing has run). So a compute-bound CPU model,
        whose time per row hardly falls with the batch, runs 5 rows as 4 + 1 instead of padding
        them to 8 (3 rows of waste), while a model whose batch of 8 costs little more than a
        batch of 1 (a GPU) is padded to 8 in one run."""
        sizes = [s for s in self.sizes if s not in exclude] or [self.sizes[0]]
        with self._cost_lock:
            cost = dict(self._cost)
        per_row = min((t / s for s, t in cost.items()), default=1.0)
        est = {s: cost.get(s, s * per_row) for s in sizes}
        best: list[tuple[float, int, list[int]]] = [(0.0, 0, [])]  # per row count: (time, runs, sizes)
        for r in range(1, rows + 1):
            best.append(min((t + est[s], n + 1, chunks + [s]) for s in sizes
                            for t, n, chunks in [best[max(0, r - s)]]))
        return sorted(best[rows][2], reverse=True)

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
