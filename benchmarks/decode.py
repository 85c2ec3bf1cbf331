"""Greedy KV-cache decoding on a GPT-2-small-shaped decoder with a dynamic past (issue 36).

The model: ``transformers`` GPT2LMHeadModel at ``--hidden`` 768, ``--heads`` 12, ``--layers``
4, ``--vocab`` 50257 (the full vocabulary: the language-model head is a 768 x 50257 product
every token), ``--positions`` 1024, random weights (seed 0), one step of it exported with
``torch.onnx.export(dynamo=False, opset 17)`` as ``tests/model_builders.py``'s
``gpt2_kv_cache_onnx`` does (the cache given to transformers as its cache class): inputs
``input_ids`` [batch, seq], ``attention_mask`` [batch, total], ``past_key_values.{layer}.key``
/ ``.value`` [batch, heads, past, head size]; outputs ``logits`` [batch, seq, vocab] and
``present.{layer}.key`` / ``.value`` [batch, heads, total, head size]. A new export is checked
against PyTorch through onnxruntime (ORT_DISABLE_ALL: a prompt with an empty past, then steps
with the cache fed back; logits and cache) before it is kept in ``--cache``.

The workload, batch 1: a prompt of ``--prompt`` (32) random tokens with an empty past, then
greedy decoding (the argmax of the last position's logits fed back with the cache) until
``--tokens`` (128) tokens are generated: the prompt's run gives the first, each of the
``--tokens`` - 1 steps after it one more (as ``generate(max_new_tokens=...)`` counts them).
Each engine runs in a fresh process (``engine_process.py``):

- ``fusegraph``: ``fg.compile(path, config=fg.Config(threads=2))``, the ``present`` outputs of
  a run fed back as the next run's ``past`` inputs; ``fusegraph-fgm``: the same model saved by
  the parent and ``fg.load``-ed in the child; ``fusegraph-sc8``: ``Config(shape_cache=8)`` (a compile per
  input shape, up to 8 kept: the behaviour before one compile served every shape).
- ``fusegraph-kv``: the cache kept inside fusegraph between steps (``model.kv_cache``,
  ``fusegraph_kv_cache_loop``): only the new token and the mask go in, only the logits come out.
- ``onnxruntime``: ORT_ENABLE_ALL, 2 intra-op threads, the same loop with numpy arrays.
- ``onnxruntime-iobinding``: IOBinding, outputs left for onnxruntime to allocate and the
  ``present`` OrtValues bound as the next step's ``past`` inputs (no copy to numpy; the logits
  read back).
- ``onnxruntime-iobinding-prealloc``: IOBinding into preallocated buffers, as onnxruntime's
  GPT-2 helpers do (``IOBindingHelper``: one buffer per output at the largest shape, bound by
  pointer with the step's exact shape): two sets of cache buffers used in turn (a step reads
  its past from one set and writes its present into the other), the logits and the mask in
  fixed buffers; nothing allocated per step outside onnxruntime.
- ``torch``: transformers' own forward in eager PyTorch (2 threads, its cache class), for
  reference; its build time is the model's construction.

Per engine: the prompt's run (ms), the median and p90 ms of a generated token (the steps after
the prompt: feeds, run, argmax), the total (prompt + steps), build or load time, RssAnon after
the loop minus after the imports, and VmHWM's growth (the whole RSS's peak over the run).

Correctness: the parent runs the same greedy loop on onnxruntime ORT_DISABLE_ALL; every engine's
tokens must be identical (the first divergence is printed with the reference's top-two logit
gap there), its last-position logits at a few steps and its final cache within rtol 1e-4 /
atol 1e-5 x scale; a miss makes the script exit 1 after the table.

``--repeat N``: the engines take turns N times (forwards, then backwards), medians over rounds.
2 threads throughout. Take the shared lock::

    flock /tmp/fusegraph-bench.lock python benchmarks/decode.py [--layers 4] [--json out.json]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "tests"))

from engine_process import (
    ATOL,
    RTOL,
    child_spec,
    close_enough,
    load_average,
    machine_line,
    memory_delta,
    memory_status,
    ort_session,
    percentiles,
    reset_peak,
    run_child,
    save_fgm,
    write_result,
)

ENGINES = ("fusegraph", "fusegraph-fgm", "fusegraph-sc8", "fusegraph-kv", "onnxruntime", "onnxruntime-iobinding",
           "onnxruntime-iobinding-prealloc", "torch")
CHILD_TIMEOUT_S = 3600
SAMPLED_STEPS = (0, 1, 2)        # plus the middle and the last step: their logits are checked


# ----- the model ------------------------------------------------------------------------------------

def decoder_lm(layers: int, hidden: int, heads: int, vocab: int, positions: int):
    """The GPT-2 LM with random weights (seed 0): the same weights on every call."""
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel
    torch.manual_seed(0)
    special = min(50256, vocab - 1)          # GPT-2's end-of-text id, inside a smaller vocabulary
    return GPT2LMHeadModel(GPT2Config(vocab_size=vocab, n_embd=hidden, n_layer=layers, n_head=heads,
                                      n_positions=positions, bos_token_id=special, eos_token_id=special)).eval()


def cache_names(layers: int) -> tuple[list[str], list[str]]:
    """(past input names, present output names), key then value per layer."""
    past = [f"past_key_values.{i}.{kv}" for i in range(layers) for kv in ("key", "value")]
    return past, [n.replace("past_key_values", "present") for n in past]


def export_decoder(folder: Path, layers: int, hidden: int = 768, heads: int = 12, vocab: int = 50257,
                   positions: int = 1024) -> Path:
    """The decoder step's export at these sizes, from ``folder`` if made before; a new one is
    checked against PyTorch through onnxruntime before it is kept."""
    folder = Path(folder)
    path = folder / f"gpt2_kv_L{layers}_H{hidden}_A{heads}_V{vocab}_P{positions}.onnx"
    if path.exists():
        return path
    import torch
    from model_builders import cache_keyword, cache_tensors
    from transformers.cache_utils import DynamicCache

    folder.mkdir(parents=True, exist_ok=True)
    lm = decoder_lm(layers, hidden, heads, vocab, positions)
    keyword = cache_keyword(lm)

    class Step(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lm = lm

        def forward(self, input_ids, attention_mask, *past):
            cache = DynamicCache()
            for i in range(layers):
                cache.update(past[2 * i], past[2 * i + 1], i)
            out = self.lm(input_ids=input_ids, attention_mask=attention_mask, use_cache=True, **{keyword: cache})
            return (out.logits, *cache_tensors(out))

    past_names, present_names = cache_names(layers)
    head = hidden // heads
    past = [torch.randn(1, heads, 3, head) for _ in past_names]
    args = (torch.randint(0, vocab, (1, 5)), torch.ones(1, 8, dtype=torch.int64), *past)
    axes = {"input_ids": {0: "batch", 1: "seq"}, "attention_mask": {0: "batch", 1: "total"},
            "logits": {0: "batch", 1: "seq"}}
    axes.update({n: {0: "batch", 2: "past"} for n in past_names})
    axes.update({n: {0: "batch", 2: "total"} for n in present_names})
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(Step().eval(), args, str(tmp), opset_version=17, dynamo=False,
                          input_names=["input_ids", "attention_mask", *past_names],
                          output_names=["logits", *present_names], dynamic_axes=axes)
    try:
        check_export_against_torch(str(tmp), lm, layers, heads, head, vocab)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path


def check_export_against_torch(path: str, lm, layers: int, heads: int, head: int, vocab: int) -> None:
    """A prompt of 7 with an empty past, then three steps with the cache fed back: onnxruntime
    ORT_DISABLE_ALL on the export against transformers' own cached forward (logits and cache)."""
    import torch
    from model_builders import cache_keyword, cache_tensors
    session = ort_session(path, optimized=False)
    past_names, present_names = cache_names(layers)
    ids = np.random.default_rng(1).integers(0, vocab, (1, 7)).astype(np.int64)
    past = [np.zeros((1, heads, 0, head), np.float32) for _ in past_names]
    cache, total = None, 0
    with torch.no_grad():
        for step in range(4):
            total += ids.shape[1]
            feeds = {"input_ids": ids, "attention_mask": np.ones((1, total), np.int64), **dict(zip(past_names, past))}
            got = dict(zip(["logits", *present_names], session.run(None, feeds)))
            kwargs = {} if cache is None else {cache_keyword(lm): cache}
            out = lm(input_ids=torch.from_numpy(ids), use_cache=True, **kwargs)
            cache = out.cache if getattr(out, "cache", None) is not None else out.past_key_values
            want = {"logits": out.logits.numpy(), **{n: t.numpy() for n, t in zip(present_names, cache_tensors(out))}}
            for name, value in want.items():
                ok, err = close_enough(got[name], value)
                if not ok:
                    raise RuntimeError(f"{Path(path).name}: the export differs from PyTorch at step {step}, "
                                       f"output {name} (largest error over largest value {err:.2e})")
            past = [got[n] for n in present_names]
            ids = np.array([[int(got["logits"][0, -1].argmax())]], np.int64)


def prompt_ids(length: int, vocab: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, vocab, (1, length)).astype(np.int64)


# ----- the loops: each returns (tokens, per-step ms with the prompt's first, sampled logits, cache) ---

def numpy_loop(run, spec: dict, model_shape: dict):
    """``run(feeds) -> {name: array}`` fed back: the past inputs are the previous presents."""
    past_names, present_names = cache_names(model_shape["layers"])
    prompt = prompt_ids(spec["prompt"], spec["vocab"], spec["seed"])
    past = {n: np.zeros((1, model_shape["heads"], 0, model_shape["head"]), np.float32) for n in past_names}
    mask = np.ones((1, spec["prompt"] + spec["tokens"]), np.int64)
    ids, total, tokens, times, logits = prompt, 0, [], [], {}
    for step in range(spec["tokens"]):
        t = time.perf_counter()
        total += ids.shape[1]
        out = run({"input_ids": ids, "attention_mask": mask[:, :total], **past})
        last = out["logits"][0, -1]
        token = int(last.argmax())
        past = {p: out[q] for p, q in zip(past_names, present_names)}
        ids = np.array([[token]], np.int64)
        times.append((time.perf_counter() - t) * 1e3)
        tokens.append(token)
        if step in spec["sample_steps"]:
            logits[step] = last.copy()
    return tokens, times, logits, [past[n] for n in past_names]


def ort_iobinding_loop(sess, spec: dict, model_shape: dict):
    """IOBinding with onnxruntime-allocated outputs: each step's present OrtValues are bound as
    the next step's past inputs (no copy to numpy); the logits are read back to pick the token."""
    past_names, _ = cache_names(model_shape["layers"])
    output_names = [o.name for o in sess.get_outputs()]
    prompt = prompt_ids(spec["prompt"], spec["vocab"], spec["seed"])
    empty = np.zeros((1, model_shape["heads"], 0, model_shape["head"]), np.float32)
    mask = np.ones((1, spec["prompt"] + spec["tokens"]), np.int64)
    io = sess.io_binding()
    ids, total, tokens, times, logits, presents = prompt, 0, [], [], {}, None
    for step in range(spec["tokens"]):
        t = time.perf_counter()
        total += ids.shape[1]
        io.bind_cpu_input("input_ids", ids)
        io.bind_cpu_input("attention_mask", mask[:, :total])
        for i, name in enumerate(past_names):
            if presents is None:
                io.bind_cpu_input(name, empty)
            else:
                io.bind_ortvalue_input(name, presents[i])
        io.clear_binding_outputs()
        for name in output_names:
            io.bind_output(name, "cpu")
        sess.run_with_iobinding(io)
        outs = io.get_outputs()
        last = outs[0].numpy()[0, -1]
        token = int(last.argmax())
        presents = outs[1:]
        ids = np.array([[token]], np.int64)
        times.append((time.perf_counter() - t) * 1e3)
        tokens.append(token)
        if step in spec["sample_steps"]:
            logits[step] = last.copy()
    return tokens, times, logits, [p.numpy() for p in presents]


def ort_iobinding_prealloc_loop(sess, spec: dict, model_shape: dict):
    """IOBinding into preallocated buffers (onnxruntime's GPT-2 helpers' way): the cache in two
    sets of buffers of the largest size, a step reading its past from one and writing its present
    (the same tensors, one position longer, contiguous at the buffer's front) into the other."""
    past_names, present_names = cache_names(model_shape["layers"])
    heads, head, vocab = model_shape["heads"], model_shape["head"], spec["vocab"]
    capacity = spec["prompt"] + spec["tokens"]
    sets = [[np.empty(heads * capacity * head, np.float32) for _ in past_names] for _ in range(2)]
    logits_buf = np.empty(spec["prompt"] * vocab, np.float32)
    mask = np.ones((1, capacity), np.int64)
    ids_buf = np.empty((1, spec["prompt"]), np.int64)
    ids_buf[:] = prompt_ids(spec["prompt"], vocab, spec["seed"])
    io = sess.io_binding()
    f32, i64 = np.float32, np.int64
    seq, past_len, tokens, times, logits = spec["prompt"], 0, [], [], {}
    for step in range(spec["tokens"]):
        t = time.perf_counter()
        src, dst = sets[step % 2], sets[(step + 1) % 2]
        total = past_len + seq
        io.bind_input("input_ids", "cpu", 0, i64, [1, seq], ids_buf.ctypes.data)
        io.bind_input("attention_mask", "cpu", 0, i64, [1, total], mask.ctypes.data)
        for name, buf in zip(past_names, src):
            io.bind_input(name, "cpu", 0, f32, [1, heads, past_len, head], buf.ctypes.data)
        for name, buf in zip(present_names, dst):
            io.bind_output(name, "cpu", 0, f32, [1, heads, total, head], buf.ctypes.data)
        io.bind_output("logits", "cpu", 0, f32, [1, seq, vocab], logits_buf.ctypes.data)
        sess.run_with_iobinding(io)
        last = logits_buf[(seq - 1) * vocab:seq * vocab]
        token = int(last.argmax())
        ids_buf[0, 0] = token
        past_len, seq = total, 1
        times.append((time.perf_counter() - t) * 1e3)
        tokens.append(token)
        if step in spec["sample_steps"]:
            logits[step] = last.copy()
    cache = [b[:heads * past_len * head].reshape(1, heads, past_len, head).copy() for b in sets[spec["tokens"] % 2]]
    return tokens, times, logits, cache


def torch_loop(lm, spec: dict, model_shape: dict):
    """transformers' own greedy loop body in eager PyTorch, its cache class carried over."""
    import torch
    from model_builders import cache_keyword, cache_tensors
    keyword = cache_keyword(lm)
    ids = torch.from_numpy(prompt_ids(spec["prompt"], spec["vocab"], spec["seed"]))
    cache, tokens, times, logits = None, [], [], {}
    with torch.inference_mode():
        for step in range(spec["tokens"]):
            t = time.perf_counter()
            out = lm(input_ids=ids, use_cache=True, **({} if cache is None else {keyword: cache}))
            cache = out.cache if getattr(out, "cache", None) is not None else out.past_key_values
            last = out.logits[0, -1]
            token = int(last.argmax())
            ids = torch.tensor([[token]])
            times.append((time.perf_counter() - t) * 1e3)
            tokens.append(token)
            if step in spec["sample_steps"]:
                logits[step] = last.numpy().copy()
    return tokens, times, logits, [t.numpy() for t in cache_tensors(out)]


# ----- the cache kept inside fusegraph (issue 36, item 8): measured here once the API exists ----------

def fusegraph_kv_cache_loop(model, spec: dict, model_shape: dict):
    """The cache kept inside fusegraph (``CompiledModel.kv_cache``): the session grows one
    buffer per ``present`` output (room for prompt + tokens positions) and feeds it back as the
    next step's ``past`` itself; a step gives only ``input_ids`` and ``attention_mask`` and gets
    the logits back. ``session.cache(name)`` reads a kept cache (for the checks)."""
    _, present_names = cache_names(model_shape["layers"])
    capacity = spec["prompt"] + spec["tokens"]
    session = model.kv_cache(capacity)
    mask = np.ones((1, capacity), np.int64)
    ids = prompt_ids(spec["prompt"], spec["vocab"], spec["seed"])
    total, tokens, times, logits = 0, [], [], {}
    for step in range(spec["tokens"]):
        t = time.perf_counter()
        total += ids.shape[1]
        out = session.run({"input_ids": ids, "attention_mask": mask[:, :total]})
        last = out["logits"][0, -1]
        token = int(last.argmax())
        ids = np.array([[token]], np.int64)
        times.append((time.perf_counter() - t) * 1e3)
        tokens.append(token)
        if step in spec["sample_steps"]:
            logits[step] = np.array(last, copy=True)
    return tokens, times, logits, [session.cache(n) for n in present_names]


# ----- one engine, in its own process -------------------------------------------------------------

def engine_child(spec: dict) -> dict:
    engine, threads = spec["engine"], spec["threads"]
    shape = spec["model_shape"]
    if engine.startswith("onnxruntime"):
        import onnxruntime  # noqa: F401  (imported before the baseline reading)
    else:
        import torch
        torch.set_num_threads(threads)
        if engine.startswith("fusegraph"):
            import fusegraph as fg
        else:
            import transformers  # noqa: F401  (imported before the baseline reading)
    base = memory_status()
    reset_peak()
    t0 = time.perf_counter()
    if engine.startswith("onnxruntime"):
        sess = ort_session(spec["onnx"], threads=threads)
        build_s = time.perf_counter() - t0
        if engine == "onnxruntime":
            names = [o.name for o in sess.get_outputs()]
            result = numpy_loop(lambda feeds: dict(zip(names, sess.run(names, feeds))), spec, shape)
        elif engine == "onnxruntime-iobinding":
            result = ort_iobinding_loop(sess, spec, shape)
        else:
            result = ort_iobinding_prealloc_loop(sess, spec, shape)
    elif engine == "torch":
        lm = decoder_lm(shape["layers"], shape["hidden"], shape["heads"], spec["vocab"], shape["positions"])
        build_s = time.perf_counter() - t0
        result = torch_loop(lm, spec, shape)
    else:
        if engine == "fusegraph-fgm":
            model = fg.load(spec["fgm"])
        else:
            model = fg.compile(spec["onnx"], config=fg.Config(threads=threads,
                                                              **({"shape_cache": 8} if engine == "fusegraph-sc8" else {})))
        build_s = time.perf_counter() - t0
        result = fusegraph_kv_cache_loop(model, spec, shape) if engine == "fusegraph-kv" else \
            numpy_loop(model.run, spec, shape)
    end = memory_status()
    tokens, times, logits, cache = result
    save_dir = Path(spec["save_dir"]) if spec.get("save_dir") else None
    if save_dir is not None:
        np.savez(save_dir / f"{engine}.npz", **{f"logits_{k}": v for k, v in logits.items()},
                 **{f"cache_{i}": c for i, c in enumerate(cache)})
    return {"engine": engine, "build_s": build_s, "tokens": tokens, "step_ms": times,
            "memory": memory_delta(base, end)}


# ----- the parent ---------------------------------------------------------------------------------

def reference_loop(onnx_path: str, spec: dict) -> dict:
    """The greedy loop on onnxruntime ORT_DISABLE_ALL, with every step's last logits kept."""
    sess = ort_session(onnx_path, optimized=False, threads=spec["threads"])
    names = [o.name for o in sess.get_outputs()]
    every = {**spec, "sample_steps": list(range(spec["tokens"]))}
    tokens, _, logits, cache = numpy_loop(lambda feeds: dict(zip(names, sess.run(names, feeds))), every,
                                          spec["model_shape"])
    return {"tokens": tokens, "logits": logits, "cache": cache}


def check_engine(engine: str, run: dict, reference: dict, save_dir: Path, sample_steps: list[int]) -> dict:
    want = reference["tokens"]
    got = run["tokens"]
    diverge = next((i for i, (a, b) in enumerate(zip(got, want)) if a != b), None)
    check = {"tokens_identical": diverge is None and len(got) == len(want), "first_divergence": None,
             "logits_max_rel_err": 0.0, "cache_max_rel_err": None, "misses": []}
    if diverge is not None:
        top2 = np.sort(reference["logits"][diverge])[-2:]
        check["first_divergence"] = {"step": diverge, "got": got[diverge], "want": want[diverge],
                                     "reference_top2_gap": float(top2[1] - top2[0])}
        check["misses"].append(f"tokens differ from step {diverge}: {got[diverge]} against {want[diverge]} "
                               f"(the reference's top-two logit gap there: {top2[1] - top2[0]:.2e})")
    saved = np.load(save_dir / f"{engine}.npz")
    for step in sample_steps:
        if diverge is not None and step > diverge:
            continue                    # a different history: nothing to compare
        ok, err = close_enough(saved[f"logits_{step}"], reference["logits"][step])
        check["logits_max_rel_err"] = max(check["logits_max_rel_err"], err)
        if not ok:
            check["misses"].append(f"logits at step {step}: max rel err {err:.2e}")
    if check["tokens_identical"]:
        errs = []
        for i, want_cache in enumerate(reference["cache"]):
            ok, err = close_enough(saved[f"cache_{i}"], want_cache)
            errs.append(err)
            if not ok:
                check["misses"].append(f"final cache {i}: max rel err {err:.2e}")
        check["cache_max_rel_err"] = max(errs)
    return check


def summarise(runs: list[dict]) -> dict:
    rows = []
    for r in runs:
        steps = r["step_ms"][1:]
        p = percentiles(steps) if steps else {"p50_ms": float("nan"), "p90_ms": float("nan")}
        rows.append({"build_s": r["build_s"], "prompt_ms": r["step_ms"][0], "token_p50_ms": p["p50_ms"],
                     "token_p90_ms": p["p90_ms"], "total_s": sum(r["step_ms"]) / 1e3, **r["memory"]})
    return {k: statistics.median(row[k] for row in rows) for k in rows[0]}


def table(result: dict, engines: list[str]) -> str:
    s, checks = result["summary"], result["checks"]
    ort = s.get("onnxruntime")
    head = ("| engine | build / load s | prompt ms | ms / token (median) | p90 ms / token | median / ORT | total s "
            "| total / ORT | RssAnon MiB | VmHWM growth MiB | tokens vs ORT_DISABLE_ALL | max rel err (logits, cache) |")
    lines = [head, "|---|" + "---:|" * (head.count("|") - 2)]
    for e in engines:
        r, c = s[e], checks[e]
        def rel(k: str, r=r) -> str:
            return f"{r[k] / ort[k]:.2f}" if ort else "-"
        tokens = "identical" if c["tokens_identical"] else f"DIFFER at step {c['first_divergence']['step']}"
        cache = "-" if c["cache_max_rel_err"] is None else f"{c['cache_max_rel_err']:.1e}"
        err = f"{c['logits_max_rel_err']:.1e}, {cache}" + (" MISS" if c["misses"] else "")
        lines.append(f"| {e} | {r['build_s']:.2f} | {r['prompt_ms']:.1f} | {r['token_p50_ms']:.2f} "
                     f"| {r['token_p90_ms']:.2f} | {rel('token_p50_ms')} | {r['total_s']:.2f} | {rel('total_s')} "
                     f"| {r['rss_anon_mib']:.0f} | {r['vm_hwm_growth_mib']:.0f} | {tokens} | {err} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    spec = child_spec(argv)
    if spec is not None:
        write_result(spec, engine_child(spec))
        return 0
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--hidden", type=int, default=768)
    ap.add_argument("--heads", type=int, default=12)
    ap.add_argument("--vocab", type=int, default=50257)
    ap.add_argument("--positions", type=int, default=1024, help="n_positions (prompt + tokens must fit)")
    ap.add_argument("--prompt", type=int, default=32, help="prompt length")
    ap.add_argument("--tokens", type=int, default=128, help="tokens generated (the prompt's run gives the first)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--engines", default=",".join(ENGINES), help=f"comma-separated, of {', '.join(ENGINES)}")
    ap.add_argument("--repeat", type=int, default=1, help="rounds of the engines (medians over rounds)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--cache", default="/work/cache/shapes", help="folder the exports are kept in")
    ap.add_argument("--json", default=None, help="write every figure, every step's latency and the checks here")
    args = ap.parse_args(argv)
    engines = [e for e in args.engines.split(",") if e]
    bad = [e for e in engines if e not in ENGINES]
    if bad or not engines:
        ap.error(f"unknown engine(s) {bad}; choose from {', '.join(ENGINES)}")
    if args.prompt < 1 or args.tokens < 2 or args.prompt + args.tokens > args.positions:
        ap.error(f"need --prompt >= 1, --tokens >= 2 and --prompt + --tokens <= --positions ({args.positions})")
    if args.hidden % args.heads or args.repeat < 1:
        ap.error("--hidden must be a multiple of --heads, --repeat >= 1")

    def log(message: str) -> None:
        print(message, file=sys.stderr, flush=True)

    skipped = {}
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    out = {"started": started, "machine": machine_line(), "load_start": load_average(), "args": vars(args),
           "skipped": skipped}
    path = export_decoder(Path(args.cache), args.layers, args.hidden, args.heads, args.vocab, args.positions)
    sample_steps = sorted({s for s in SAMPLED_STEPS if s < args.tokens} | {args.tokens // 2, args.tokens - 1})
    spec = {"onnx": str(path), "threads": args.threads, "vocab": args.vocab, "seed": args.seed, "prompt": args.prompt,
            "tokens": args.tokens, "sample_steps": sample_steps,
            "model_shape": {"layers": args.layers, "hidden": args.hidden, "heads": args.heads,
                            "head": args.hidden // args.heads, "positions": args.positions}}
    runs: dict[str, list[dict]] = {e: [] for e in engines}
    with tempfile.TemporaryDirectory(prefix="fg-decode-") as tmp:
        save_dir = Path(tmp)
        if "fusegraph-fgm" in engines:
            spec["fgm"] = str(save_dir / "model.fgm")
            out["fgm"] = save_fgm(str(path), spec["fgm"], args.threads)
        order = list(engines)
        for round_ in range(args.repeat):
            for engine in order:
                log(f"  {path.name}: {engine}, round {round_ + 1}/{args.repeat} (load {load_average()})")
                child = {**spec, "engine": engine, "save_dir": str(save_dir) if round_ == 0 else ""}
                runs[engine].append(run_child(__file__, child, CHILD_TIMEOUT_S))
            order.reverse()
        out["load_end"] = load_average()
        log("  the reference loop (onnxruntime ORT_DISABLE_ALL)")
        reference = reference_loop(str(path), spec)
        checks = {e: check_engine(e, runs[e][0], reference, save_dir, sample_steps) for e in engines}
    result = {"model": str(path), "summary": {e: summarise(runs[e]) for e in engines}, "checks": checks,
              "reference_tokens": reference["tokens"], "runs": runs}
    out.update(result)

    print(f"{out['machine']}\nstarted {started}, load average {out['load_start']} at start, {out['load_end']} at end; "
          f"{args.threads} threads, batch 1")
    print(f"\n{path.name}: {args.layers} layer(s), hidden {args.hidden}, {args.heads} heads, vocabulary {args.vocab}; "
          f"prompt {args.prompt}, then greedy to {args.tokens} tokens ({args.tokens - 1} steps after the prompt's run)"
          + (f"; .fgm saved in {out['fgm']['save_s']:.2f} s ({out['fgm']['fgm_mib']:.0f} MiB)" if "fgm" in out else ""))
    print(table(result, engines))
    for message in skipped.values():
        print(message)
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1))
    failed = {e: c["misses"] for e, c in checks.items() if c["misses"]}
    if failed:
        print(f"\nCORRECTNESS FAILURE against onnxruntime ORT_DISABLE_ALL (rtol {RTOL}, atol {ATOL} x scale):",
              file=sys.stderr)
        for e, misses in failed.items():
            for m in misses:
                print(f"  {e}: {m}", file=sys.stderr)
        return 1
    print(f"\nevery engine's {args.tokens} tokens are onnxruntime ORT_DISABLE_ALL's; logits at steps {sample_steps} "
          f"and the final cache within rtol {RTOL}, atol {ATOL} x scale")
    return 0


if __name__ == "__main__":
    sys.exit(main())
