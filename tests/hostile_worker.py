"""Runs hostile cases (``hostile_onnx.py``, ``hostile_fgm.py``) in a child process, one per line.

``python hostile_worker.py SUITE START OUT_JSONL WORK_DIR`` runs cases START.. of SUITE
(``onnx`` | ``fgm`` | ``selftest``: one case per outcome, to check the harness itself), each in its own folder under WORK_DIR, with the process's cwd and HOME
in empty folders (onnxruntime, the oracle, may leave its telemetry id under HOME/.cache before
the first case; anything new after that is a side effect). Before each case it writes ``{"start": i}`` and arms a 20 s
``faulthandler`` watchdog that kills the process on a hang, so the parent
(``test_hostile_inputs.py``) sees a crash, a signal or a hang as a case that started and never
finished, and restarts after it. Each finished case is one line: kind, name and outcome:

- ``typed``: a ``fusegraph.errors`` exception (its type is recorded);
- ``correct``: it ran, and its outputs equal the oracle's (onnxruntime with ORT_DISABLE_ALL on
  the same model, or onnx.reference where onnxruntime lacks the op version; for an artifact edit that must not change the result, the unmutated model);
- ``ran``: an artifact edit that changes the graph ran (no oracle for the edited graph);
- failures: ``lenient`` (it ran, but onnxruntime and onnx.reference refuse the model), ``untyped`` (another exception), ``mismatch`` (wrong output), ``side_effect`` (a
  file appeared in cwd or HOME, or the injection sentinel ``owned`` appeared, or loading an
  artifact changed the process's torch thread count).
"""
from __future__ import annotations

import faulthandler
import json
import os
import shutil
import sys
import traceback
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))

CASE_TIMEOUT_S = float(os.environ.get("FG_HOSTILE_TIMEOUT_S", 20))


def _feeds(specs, seed=0):
    rng = np.random.default_rng(seed)
    feeds = {}
    for spec in specs:
        shape = [d if isinstance(d, int) and 0 <= d <= 64 else 2 for d in (spec.shape or ())]
        try:
            dt = spec.dtype.to_numpy()
        except TypeError:      # bfloat16 and friends: a torch tensor (onnxruntime cannot take it)
            import torch
            feeds[spec.name] = torch.from_numpy(rng.standard_normal(shape).astype(np.float32)).to(spec.dtype.to_torch())
            continue
        if dt == np.bool_:
            arr = rng.random(shape) > 0.5
        elif np.issubdtype(dt, np.integer):
            arr = rng.integers(0, 3, shape).astype(dt)
        else:
            arr = rng.standard_normal(shape).astype(dt)
        feeds[spec.name] = arr
    return feeds


def _close(a: dict, b: dict) -> str | None:
    if set(a) != set(b):
        return f"outputs {sorted(a)} vs {sorted(b)}"
    for k in a:
        x, y = np.asarray(a[k]), np.asarray(b[k])
        if x.shape != y.shape or x.dtype != y.dtype:
            return f"{k}: {x.dtype}{list(x.shape)} vs {y.dtype}{list(y.shape)}"
        if not np.allclose(x, y, rtol=1e-4, atol=1e-5, equal_nan=True):
            return f"{k}: max |diff| {np.nanmax(np.abs(x.astype(np.float64) - y.astype(np.float64)))}"
    return None


def _ort(target, feeds):
    import onnxruntime as ort
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    so.log_severity_level = 4
    src = target.SerializeToString() if hasattr(target, "SerializeToString") else (
        str(target) if isinstance(target, Path) else target)
    sess = ort.InferenceSession(src, so, providers=["CPUExecutionProvider"])
    names = [o.name for o in sess.get_outputs()]
    return dict(zip(names, sess.run(names, feeds)))


def _reference(target, feeds):
    import onnx
    from onnx.reference import ReferenceEvaluator
    model = onnx.load(str(target)) if isinstance(target, Path) else (
        target if hasattr(target, "graph") else onnx.load_from_string(target))
    ref = ReferenceEvaluator(model)
    return dict(zip(ref.output_names, ref.run(None, feeds)))


def run_onnx(make, folder: Path):
    import fusegraph as fg
    target = make(folder)
    model = fg.compile(target)
    feeds = _feeds(model.inputs)
    got = model.run(feeds)
    try:
        want = _ort(target, feeds)
    except Exception as exc:
        try:   # onnxruntime lacks some old op versions: the reference evaluator is the oracle then
            want = _reference(target, feeds)
        except Exception:
            return "lenient", f"onnxruntime refuses: {str(exc)[:160]}"
    why = _close(got, want)
    return ("mismatch", why) if why else ("correct", "")


def fgm_bases(folder: Path) -> dict:
    """Compiled and saved base artifacts, with their feeds and outputs (the oracle)."""
    import fusegraph as fg
    from fusegraph import artifact as A
    from onnx import TensorProto as T, helper as H
    from hostile_onnx import base_models
    f = T.FLOAT
    branches = H.make_model(H.make_graph(
        [H.make_node("Sigmoid", ["x"], ["a"], name="sa"), H.make_node("Tanh", ["x"], ["b"], name="tb"),
         H.make_node("Exp", ["a"], ["a2"], name="ea"), H.make_node("Neg", ["b"], ["b2"], name="nb"),
         H.make_node("Add", ["a2", "b2"], ["y"], name="add")], "branches",
        [H.make_tensor_value_info("x", f, [4, 16])], [H.make_tensor_value_info("y", f, [4, 16])]),
        opset_imports=[H.make_opsetid("", 17)])
    models = base_models()
    todo = {"conv": (models["conv"], fg.Config()), "shape": (models["shape"], fg.Config()),
            "streams": (branches, fg.Config(streams=2, disabled_passes=("elementwise_chain",)))}
    out = {}
    for name, (proto, config) in todo.items():
        model = fg.compile(proto, config)
        path = folder / f"{name}.fgm"
        model.save(path)
        feeds = _feeds(model.inputs, seed=1)
        header, parts = A.unpack(path)
        graph, report = json.loads(parts["graph"]), json.loads(parts["report"])
        w = parts["weights"]
        whead = json.loads(w[8:8 + int.from_bytes(w[:8], "little")])
        consts = set(graph["constants"])
        info = {"values": [v["name"] for v in graph["values"] if v["name"] not in consts][:3],
                "nodes": [n["name"] for n in graph["nodes"]], "order": report["plan"]["order"],
                "weights": [k for k in whead if not k.startswith("__")][:2], "plan": report["plan"]}
        out[name] = {"path": path, "info": info, "feeds": feeds, "outputs": model.run(feeds)}
        model.close()
    return out


def run_fgm(make, folder: Path, base: dict, same: bool):
    import torch
    import fusegraph as fg
    path = make(base["path"], folder)
    threads = torch.get_num_threads()
    try:
        model = fg.load(path)
        try:
            str(model.report)         # what a loaded report says must render (every part typed)
            got = model.run(base["feeds"])
        finally:
            model.close()
    finally:
        now = torch.get_num_threads()
        torch.set_num_threads(threads)
    if now != threads:     # an artifact must not steer the host process (issue 14, item 4)
        return "side_effect", f"torch.get_num_threads() changed from {threads} to {now}"
    if not same:
        return "ran", ""
    why = _close(got, base["outputs"])
    return ("mismatch", why) if why else ("correct", "")


def _selftest_cases():
    """The harness's own check: one case of each outcome it must tell apart."""
    import ctypes
    import time
    from fusegraph.errors import ModelLoadError

    def typed(folder):
        raise ModelLoadError("a typed error")

    def untyped(folder):
        raise ValueError("an untyped error")

    def segfault(folder):
        ctypes.string_at(0)

    def hang(folder):
        time.sleep(CASE_TIMEOUT_S * 5)

    def owned(folder):
        Path("owned").write_text("")
        return "correct", ""

    def fine(folder):
        return "correct", ""
    return [("self", f.__name__, f, None, None) for f in (typed, untyped, segfault, hang, owned, fine)]


def cases(suite: str, work: Path):
    if suite == "selftest":
        return _selftest_cases()
    if suite == "onnx":
        from hostile_onnx import onnx_cases
        return [(k, n, m, None, None) for k, n, m in onnx_cases()]
    from hostile_fgm import fgm_cases
    folder = work / "bases"
    folder.mkdir(exist_ok=True)
    bases = fgm_bases(folder)
    return [(k, n, m, bases[b], same) for k, n, b, m, same in fgm_cases(bases)]


def _listing(dirs) -> set[str]:
    return {str(p) for d in dirs for p in Path(d).iterdir()}


def _warm_oracle() -> None:
    """onnxruntime writes its telemetry id under ~/.cache on first use: let it, before watching."""
    try:
        from onnx import TensorProto as T, helper as H
        m = H.make_model(H.make_graph([H.make_node("Relu", ["x"], ["y"])], "w", [H.make_tensor_value_info("x", T.FLOAT, [1])],
                                      [H.make_tensor_value_info("y", T.FLOAT, [1])]), opset_imports=[H.make_opsetid("", 17)])
        _ort(m, {"x": np.ones(1, np.float32)})
    except Exception:
        pass


def main(suite: str, start: int, out_path: str, work: str) -> None:
    from fusegraph.errors import FusegraphError
    work_dir = Path(work)
    watched = [Path.cwd(), Path(os.environ["HOME"])]
    faulthandler.enable()
    _warm_oracle()
    all_cases = cases(suite, work_dir)
    baseline = _listing(watched)
    with open(out_path, "a") as out:
        def emit(record):
            out.write(json.dumps(record) + "\n")
            out.flush()
        emit({"total": len(all_cases)})
        for i in range(start, len(all_cases)):
            kind, name, make, base, same = all_cases[i]
            emit({"start": i, "kind": kind, "name": name})
            folder = work_dir / f"case{i}"
            folder.mkdir(exist_ok=True)
            faulthandler.dump_traceback_later(CASE_TIMEOUT_S, exit=True)
            try:
                outcome = (make(folder) if suite == "selftest" else run_onnx(make, folder) if suite == "onnx"
                           else run_fgm(make, folder, base, same))
            except FusegraphError as exc:
                outcome = "typed", f"{type(exc).__name__}: {str(exc)[:200]}"
            except BaseException as exc:  # noqa: BLE001 - any other exception is the failure we look for
                frames = traceback.extract_tb(exc.__traceback__)
                tb = next((f for f in reversed(frames) if "fusegraph" in f.filename), frames[-1])
                outcome = "untyped", f"{type(exc).__name__}: {str(exc)[:200]} at {tb.filename}:{tb.lineno}"
            faulthandler.cancel_dump_traceback_later()
            strays = sorted(_listing(watched) - baseline) + [str(p) for p in work_dir.rglob("owned")]
            if strays:
                outcome = "side_effect", f"files written: {strays[:5]}"
                for p in strays:
                    Path(p).unlink(missing_ok=True) if not Path(p).is_dir() else shutil.rmtree(p)
            shutil.rmtree(folder, ignore_errors=True)
            emit({"i": i, "kind": kind, "name": name, "outcome": outcome[0], "detail": outcome[1]})
        emit({"done": True})


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4])
