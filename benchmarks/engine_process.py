"""One engine per fresh process, and what the process's memory says: shared by the dynamic-shape
benchmarks (``variable_length.py``, ``decode.py``).

A benchmark script runs itself again as a child (``run_child``: ``python SCRIPT --child
SPEC.json``), so each engine's compile caches, allocator state and resident memory are its
own. The child reads ``/proc/self/status`` after its imports (``memory_status``), clears the
peak (``reset_peak``: ``/proc/self/clear_refs``, so VmHWM restarts from the current RSS), runs,
and reports its figures as JSON in a file the parent names (never on stdout, which libraries
may print to). Also: percentiles of a latency list, and the machine line every table carries
(``lscpu``'s model name and the SIMD flags that decide the kernels, the load average).
The engines both scripts share are made here the same way: an onnxruntime session
(``ort_session``: ORT_ENABLE_ALL, or ORT_DISABLE_ALL as the oracle; 2 intra-op threads,
sequential) and a fusegraph ``.fgm`` (``save_fgm``); ``close_enough`` is the oracle check
(rtol 1e-4, atol 1e-5 x max(1, largest |value|), as ``tests/oracle.py``) with the error it
reports (largest |difference| over largest |value|). ``zero_step_feeds``: a decoder step's
feeds of zeros at a past and a new length (what frame and page benchmarks run: no data read).

Nothing here times a run; engines are imported where a function needs them.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

RTOL, ATOL = 1e-4, 1e-5
RELEVANT_FLAGS = ("avx2", "fma", "avx512f", "avx512bw", "avx512vl", "avx512_vnni", "avx512_bf16",
                  "amx_tile", "amx_bf16", "amx_int8")


def memory_status() -> dict[str, float]:
    """RssAnon, RssFile, VmRSS and VmHWM of this process, MiB."""
    out = {}
    with open("/proc/self/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key in ("RssAnon", "RssFile", "VmRSS", "VmHWM"):
                out[key] = int(value.split()[0]) / 1024
    return out


def reset_peak() -> bool:
    """Restart VmHWM from the current RSS (Linux ``clear_refs`` 5); False where refused."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def memory_delta(base: dict[str, float], end: dict[str, float], peak_anon: float | None = None) -> dict[str, float]:
    """What a run added: RssAnon after minus before; VmHWM (reset at ``base``) minus VmRSS
    before: the peak of the whole RSS, file-backed pages included; with ``peak_anon`` (the
    largest RssAnon sampled between requests), that minus before too."""
    out = {"rss_anon_mib": end["RssAnon"] - base["RssAnon"], "vm_hwm_growth_mib": end["VmHWM"] - base["VmRSS"],
           "rss_file_mib": end["RssFile"] - base["RssFile"]}
    if peak_anon is not None:
        out["rss_anon_peak_sampled_mib"] = peak_anon - base["RssAnon"]
    return out


def percentiles(ms: list[float]) -> dict[str, float]:
    """p50 / p90 / p99 (numpy's linear interpolation), mean, min, max of a latency list (ms)."""
    a = np.asarray(ms, dtype=np.float64)
    return {"p50_ms": float(np.percentile(a, 50)), "p90_ms": float(np.percentile(a, 90)),
            "p99_ms": float(np.percentile(a, 99)), "mean_ms": float(a.mean()), "min_ms": float(a.min()),
            "max_ms": float(a.max())}


def run_child(script: str | Path, spec: dict, timeout_s: float) -> dict:
    """Run ``python SCRIPT --child SPEC`` in a fresh process and return the JSON it wrote; a
    failed or silent child raises RuntimeError with its stderr's tail."""
    with tempfile.TemporaryDirectory(prefix="fg-engine-") as tmp:
        spec_path, result_path = Path(tmp) / "spec.json", Path(tmp) / "result.json"
        spec_path.write_text(json.dumps({**spec, "result_path": str(result_path)}))
        t0 = time.perf_counter()
        got = subprocess.run([sys.executable, str(script), "--child", str(spec_path)], capture_output=True,
                             text=True, timeout=timeout_s, check=False)
        if got.returncode != 0 or not result_path.exists():
            tail = (got.stderr or got.stdout)[-3000:]
            raise RuntimeError(f"engine {spec.get('engine')!r} failed (exit {got.returncode}) after "
                               f"{time.perf_counter() - t0:.1f} s:\n{tail}")
        return json.loads(result_path.read_text())


def child_spec(argv: list[str]) -> dict | None:
    """The spec when this process is a child (``--child SPEC``), else None."""
    if len(argv) >= 2 and argv[0] == "--child":
        return json.loads(Path(argv[1]).read_text())
    return None


def write_result(spec: dict, result: dict) -> None:
    Path(spec["result_path"]).write_text(json.dumps(result))


def machine_line() -> str:
    """``lscpu``'s model name, the flags among ``RELEVANT_FLAGS`` it has, the core count."""
    model, flags = "unknown CPU", set()
    try:
        text = subprocess.run(["lscpu"], capture_output=True, text=True, timeout=10, check=False).stdout
    except (OSError, subprocess.SubprocessError):
        text = ""
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "Model name":
            model = value.strip()
        elif key.strip() == "Flags":
            flags = set(value.split())
    have = [f for f in RELEVANT_FLAGS if f in flags]
    return f"{model}, {os.cpu_count()} cores; flags: {' '.join(have) or 'none of ' + ', '.join(RELEVANT_FLAGS)}"


def load_average() -> str:
    try:
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return "unknown"


def ort_session(path: str, optimized: bool = True, threads: int = 2):
    """An onnxruntime CPU session: ORT_ENABLE_ALL, or ORT_DISABLE_ALL (the oracle)."""
    import onnxruntime as ort
    so = ort.SessionOptions()
    so.graph_optimization_level = (ort.GraphOptimizationLevel.ORT_ENABLE_ALL if optimized
                                   else ort.GraphOptimizationLevel.ORT_DISABLE_ALL)
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    so.log_severity_level = 3
    return ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])


def close_enough(got: np.ndarray, want: np.ndarray) -> tuple[bool, float]:
    """(same shape and within rtol 1e-4 / atol 1e-5 x max(1, scale), largest error over the
    largest value)."""
    got, want = np.asarray(got), np.asarray(want)
    if got.shape != want.shape:
        return False, float("inf")
    if not want.size:
        return True, 0.0
    scale = float(np.abs(want).max())
    err = float(np.abs(got.astype(np.float64) - want).max() / max(scale, 1e-30))
    return bool(np.allclose(got, want, rtol=RTOL, atol=ATOL * max(1.0, scale))), err


def save_fgm(onnx_path: str, fgm_path: str | Path, threads: int) -> dict:
    """Compile ``onnx_path`` (``Config(threads=...)``) and save its ``.fgm``: the seconds each
    took and the file's size."""
    import fusegraph as fg
    t = time.perf_counter()
    model = fg.compile(str(onnx_path), config=fg.Config(threads=threads))
    compiled = time.perf_counter() - t
    t = time.perf_counter()
    model.save(fgm_path)
    saved = time.perf_counter() - t
    model.close()
    return {"compile_s": compiled, "save_s": saved, "fgm_mib": Path(fgm_path).stat().st_size / 2 ** 20}


def zero_step_feeds(names: list[str], past: int, seq: int, heads: int = 12, head: int = 64) -> dict:
    """Feeds of the ``decode.py`` decoder's step: ``input_ids`` of ``seq`` zeros, an
    ``attention_mask`` of ones over ``past + seq``, and every other input a cache of zeros of
    ``past`` positions."""
    feeds = {}
    for name in names:
        if name == "input_ids":
            feeds[name] = np.zeros((1, seq), np.int64)
        elif name == "attention_mask":
            feeds[name] = np.ones((1, past + seq), np.int64)
        else:
            feeds[name] = np.zeros((1, heads, past, head), np.float32)
    return feeds
