"""``fusegraph bench DECODER --decode N``: a greedy decode loop, milliseconds per token.

A decoder exported with its KV cache as graph inputs and outputs (``past_*`` in, ``present_*``
out, ``present = Concat(past, new)``: ``runtime/kv_cache.kv_pairs``) runs a prompt of
``prompt`` random tokens, then ``tokens`` steps, each feeding the argmax of the last logits
back: with the cache kept inside fusegraph (``model.kv_cache()``), with fusegraph's plain runs
(the presents handed out and fed back, as a caller of ``run`` does), and with onnxruntime
(ORT_ENABLE_ALL, the presents fed back as NumPy arrays), at the same thread count, engine by
engine. Reported: the prompt's milliseconds, the median and p90 per generated token, the total,
and whether every engine chose the same tokens. The decoder's token input is the int64 input
with a symbolic sequence dim; an int64 input with another symbolic dim is its attention mask
(all ones); any other input is an error naming it. onnxruntime is a benchmark peer only.
"""
from __future__ import annotations

import statistics
import time
from dataclasses import asdict, dataclass, field
from typing import Callable

import numpy as np

from ..errors import UsageError


@dataclass
class DecodeResult:
    model: str
    threads: int
    prompt: int
    tokens: int
    engines: dict[str, dict] = field(default_factory=dict)   # name -> prompt_ms, token_ms, p90_ms, total_ms
    same_tokens: bool = True

    def to_dict(self) -> dict:
        return asdict(self)


def _roles(model, pairs) -> tuple[str, str | None, list]:
    """(the token input, the mask input or None, the pairs): the decoder's inputs by role."""
    past = {p.input.name for p in pairs}
    ids = mask = None
    for spec in model.inputs:
        if spec.name in past:
            continue
        symbolic = [d for d in (spec.shape or ()) if not isinstance(d, int)]
        if spec.dtype.to_numpy() != np.int64 or not symbolic:
            raise UsageError(f"{model.name}: bench --decode feeds token ids, an attention mask and the cache; "
                             f"input {spec.name!r} ({spec.dtype.name} {list(spec.shape or ())}) is none of them")
        if ids is None:
            ids = spec.name
        elif mask is None:
            mask = spec.name
        else:
            raise UsageError(f"{model.name}: bench --decode does not know what to feed input {spec.name!r}")
    if ids is None:
        raise UsageError(f"{model.name}: bench --decode found no token-id input")
    return ids, mask, pairs


def _greedy(step: Callable, prompt: np.ndarray, tokens: int) -> tuple[list[int], float, list[float]]:
    """(tokens chosen, the prompt's seconds, each generated token's seconds)."""
    t = time.perf_counter()
    logits = step(prompt)
    first = time.perf_counter() - t
    chosen, times = [], []
    for _ in range(tokens):
        nxt = int(np.asarray(logits)[0, -1].argmax())
        chosen.append(nxt)
        t = time.perf_counter()
        logits = step(np.array([[nxt]], np.int64))
        times.append(time.perf_counter() - t)
    return chosen, first, times


def decode(model_path: str, prompt: int = 32, tokens: int = 64, threads: int = 2, vs: tuple[str, ...] = (),
           capacity: int | None = None, seed: int = 0) -> DecodeResult:
    import fusegraph as fg
    from ..runtime.kv_cache import kv_pairs
    model = fg.load(model_path, threads=threads) if str(model_path).endswith(".fgm") else \
        fg.compile(model_path, fg.Config(threads=threads))
    pairs, _ = kv_pairs(model.graph, [o.name for o in model.outputs])
    if not pairs:
        raise UsageError(f"{model.name}: bench --decode needs a decoder whose presents are Concat(past, new) "
                         f"of its past inputs; this model has none")
    ids_name, mask_name, pairs = _roles(model, pairs)
    ids = np.random.default_rng(seed).integers(0, 1000, (1, prompt)).astype(np.int64)
    session = model.kv_cache(capacity=capacity or prompt + tokens + 1)
    logits_name = next(o.name for o in model.outputs if o.name not in {p.output for p in pairs})

    def feeds_for(new_ids, past_len: int) -> dict:
        f = {ids_name: new_ids}
        if mask_name is not None:
            f[mask_name] = np.ones((1, past_len + new_ids.shape[1]), np.int64)
        return f

    def cached(new_ids):
        return session.run(feeds_for(new_ids, session.length))[logits_name]

    def plain_step():
        state = {}
        for p in pairs:
            shape = [0 if i == p.axis else (1 if not isinstance(d, int) else d) for i, d in enumerate(p.input.shape)]
            state[p.input.name] = np.zeros(shape, p.input.dtype.to_numpy())

        def step(new_ids, run=model.run):
            past_len = next(iter(state.values())).shape[pairs[0].axis]
            out = run({**feeds_for(new_ids, past_len), **state})
            for p in pairs:
                state[p.input.name] = out[p.output]
            return out[logits_name]
        return step
    runs = {"fusegraph kv_cache": cached, "fusegraph run": plain_step()}
    if "onnxruntime" in vs:
        if str(model_path).endswith(".fgm"):
            raise UsageError(f"{model_path}: --vs onnxruntime runs the .onnx model; give the .onnx file")
        import onnxruntime as ort
        so = ort.SessionOptions()
        so.intra_op_num_threads, so.inter_op_num_threads = threads, 1
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        sess = ort.InferenceSession(str(model_path), so, providers=["CPUExecutionProvider"])
        names = [o.name for o in sess.get_outputs()]

        def ort_run(feeds):
            return dict(zip(names, sess.run(None, feeds)))
        ort_step = plain_step()
        runs["onnxruntime"] = lambda new_ids: ort_step(new_ids, run=ort_run)
    result = DecodeResult(model.name, threads, prompt, tokens)
    chosen = {}
    for name, engine in runs.items():
        toks, first, times = _greedy(engine, ids, tokens)
        chosen[name] = toks
        times_sorted = sorted(times)
        result.engines[name] = {"prompt_ms": first * 1e3, "token_ms": statistics.median(times) * 1e3,
                                "p90_ms": times_sorted[int(0.9 * (len(times) - 1))] * 1e3 if times else 0.0,
                                "total_ms": (first + sum(times)) * 1e3}
    result.same_tokens = len({tuple(t) for t in chosen.values()}) == 1
    model.close()
    return result
