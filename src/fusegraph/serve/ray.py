"""Ray Serve and Ray Data for fusegraph models: more than one machine (the ``ray`` extra).

    from fusegraph.serve import ray as fgray
    app = fgray.deployment("model.fgm", autoscaling_config={"min_replicas": 1, "max_replicas": 4})
    handle = ray.serve.run(app)                         # one model per replica, loaded once
    outputs = handle.infer.remote({"x": batch}).result()  # dict name -> numpy array

    ds = fgray.map_batches(ray.data.from_numpy(x), "model.fgm", batch_size=64)   # offline

Each replica (and each Ray Data actor) loads the ``.fgm`` once (``fg.load``; an ``.onnx`` is
compiled) with ``threads`` intra-op threads. The options ``num_replicas``, ``autoscaling_config``,
``ray_actor_options``, ``max_ongoing_requests`` go to ``serve.deployment`` unchanged. Over HTTP
the deployment takes ``{"inputs": {name: nested list}}`` and answers ``{"outputs": {...}}``; the
KServe protocol itself is the job of ``fusegraph serve``. A model whose batch axis is static
(``4x64``) runs a Ray Data batch as whole batches of that size (the last padded with its last
row, whose outputs are dropped). Nothing here starts or configures Ray.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np


def load_model(path: str | Path, threads: int | None = None):
    """An ``.fgm`` loaded (or an ``.onnx`` compiled), with ``threads`` set on this process."""
    import torch

    import fusegraph as fg
    if threads:
        torch.set_num_threads(threads)
    path = Path(path)
    return fg.load(path) if path.suffix == ".fgm" else fg.compile(str(path), config=fg.Config(threads=threads))


def _static_batch(model) -> int | None:
    """The batch (dim 0) the model's inputs fix, or None when it is symbolic."""
    sizes = {spec.shape[0] for spec in model.inputs if spec.shape and isinstance(spec.shape[0], int)}
    return sizes.pop() if len(sizes) == 1 else (min(sizes) if sizes else None)


class FusegraphModel:
    """A Ray Serve replica: one fusegraph model, loaded when the replica starts."""

    def __init__(self, path: str, threads: int | None = None):
        self.model = load_model(path, threads)

    def infer(self, feeds: dict[str, Any]) -> dict[str, np.ndarray]:
        return self.model.run({k: np.asarray(v) for k, v in feeds.items()})

    def metadata(self) -> dict:
        return {"inputs": [(s.name, s.dtype.name, list(s.shape)) for s in self.model.inputs],
                "outputs": [(s.name, s.dtype.name, list(s.shape)) for s in self.model.outputs]}

    async def __call__(self, request):
        from starlette.responses import JSONResponse
        try:
            body = await request.json()
        except ValueError as exc:
            return JSONResponse({"error": f"request body is not valid JSON: {exc}"}, 400)
        inputs = body.get("inputs") if isinstance(body, dict) else None
        if not isinstance(inputs, dict):
            return JSONResponse({"error": "expected a JSON object {\"inputs\": {name: nested list}}"}, 400)
        dtypes = {s.name: s.dtype.to_numpy() for s in self.model.inputs}
        try:
            feeds = {k: np.asarray(v, dtype=dtypes.get(k)) for k, v in inputs.items()}
            outputs = self.model.run(feeds)
        except Exception as exc:  # noqa: BLE001 - the reason goes back to the caller
            return JSONResponse({"error": str(exc)}, 400)
        return {"outputs": {k: v.tolist() for k, v in outputs.items()}}


def deployment(path: str | Path, *, name: str = "fusegraph", threads: int | None = None,
               num_replicas: int | str | None = None, autoscaling_config: dict | None = None,
               ray_actor_options: dict | None = None, max_ongoing_requests: int | None = None, **options):
    """A Ray Serve application serving the model at ``path``; options pass through unchanged."""
    from ray import serve
    given = {"name": name, "num_replicas": num_replicas, "autoscaling_config": autoscaling_config,
             "ray_actor_options": ray_actor_options, "max_ongoing_requests": max_ongoing_requests, **options}
    return serve.deployment(FusegraphModel).options(
        **{k: v for k, v in given.items() if v is not None}).bind(str(path), threads)


class BatchPredictor:
    """A Ray Data ``map_batches`` callable: input columns in, output columns added."""

    def __init__(self, path: str, threads: int | None = None, keep_inputs: bool = False):
        self.model = load_model(path, threads)
        self.static_batch = _static_batch(self.model)
        self.keep_inputs = keep_inputs

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        feeds = {s.name: np.asarray(batch[s.name]) for s in self.model.inputs}
        size = self.static_batch
        if size is None:
            outputs = self.model.run(feeds)
        else:       # whole static batches; the last one padded with its last row, the padding dropped
            rows = len(next(iter(feeds.values())))
            parts = []
            for start in range(0, rows, size):
                take = min(size, rows - start)
                chunk = {k: v[start:start + take] for k, v in feeds.items()}
                if take < size:
                    chunk = {k: np.concatenate([v] + [v[-1:]] * (size - take)) for k, v in chunk.items()}
                parts.append({k: v[:take] for k, v in self.model.run(chunk).items()})
            outputs = {k: np.concatenate([p[k] for p in parts]) for k in parts[0]} if parts else {}
        return {**(batch if self.keep_inputs else {}), **outputs}


def map_batches(dataset, path: str | Path, *, batch_size: int = 64, concurrency: int = 1,
                num_cpus: float = 1, threads: int | None = None, keep_inputs: bool = False, **options):
    """``dataset.map_batches`` running the model at ``path`` in ``concurrency`` actors.

    The dataset's columns named like the model's inputs are fed; the outputs become columns
    (with the inputs too when ``keep_inputs``). Extra ``options`` go to ``map_batches``."""
    return dataset.map_batches(BatchPredictor, fn_constructor_kwargs={"path": str(path), "threads": threads,
                                                                      "keep_inputs": keep_inputs},
                               batch_size=batch_size, batch_format="numpy", concurrency=concurrency,
                               num_cpus=num_cpus, **options)
