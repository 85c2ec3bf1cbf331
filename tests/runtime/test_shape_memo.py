"""Shape-only work runs once per input shapes (runtime/shape_memo.py, shape_functions.py).

The oracle is onnxruntime with ORT_DISABLE_ALL (or the reference evaluator): every run is
checked, including runs that reuse a remembered shape after other shapes, and graphs whose
shapes depend on input *values* (which must never be remembered). For a model with symbolic
input dims the shape-only results are part of each input shape's frame (``frames.py``)."""
import numpy as np
import pytest
from onnx import TensorProto as TP
from onnx import helper
from onnx.reference import ReferenceEvaluator

import fusegraph as fg
from model_builders import transformer_feeds
from oracle import assert_outputs_close, ort_run

GENERIC = fg.Config(shape_cache=0)


def _run_source(model) -> tuple[str, str]:
    """The generated run, and the labels of the nodes done once per input shapes: a static
    model's ``_memo_fill``, a symbolic model's frame (``shape_program.py``'s computed nodes)."""
    src = model._executor.code.source
    run, _, fill = src.partition("def _memo_fill")
    runner = model._executor._runner
    if hasattr(runner, "program"):
        fill = "".join(f"  # {n.op_type!a} {n.name!a}\n" for n in runner.program.computed_nodes)
    return run, fill


def _calls(text: str) -> int:
    return sum(1 for line in text.splitlines() if "  # " in line)


@pytest.mark.parametrize("name, most", [("bert", 25), ("gpt2", 25)])
def test_transformer_runs_shape_work_once_per_shape(transformer_models, name, most):
    path = str(transformer_models[name])
    model = fg.compile(path, GENERIC)
    run, fill = _run_source(model)
    nodes = len(model._executor.binding.calls)
    assert _calls(run) <= most < nodes and _calls(run) + _calls(fill) == nodes
    assert " Shape " not in run          # every Shape, of an input or of an embedding, is remembered
    assert (model.report.kernel_count, model.report.shape_kernels) == (_calls(run), _calls(fill))
    frames = model._executor.frame_runner.frames
    shapes = [(1, 16), (2, 7), (1, 16), (3, 1), (2, 7)]
    for i, (batch, seq) in enumerate(shapes):
        feeds = transformer_feeds(seed=i, batch=batch, seq=seq, pad=min(3, seq - 1))
        assert_outputs_close(model.run(feeds), ort_run(path, feeds))
    assert len(frames.frames) == 3 and frames.stats["frames"] == 3   # once per distinct input shapes


def _nonzero_model():
    """y = x * Shape(NonZero(x))[1]: the shape of NonZero's result depends on x's values."""
    nodes = [helper.make_node("NonZero", ["x"], ["nz"]), helper.make_node("Shape", ["nz"], ["s"]),
             helper.make_node("Gather", ["s", "one"], ["count"], axis=0),
             helper.make_node("Cast", ["count"], ["cf"], to=TP.FLOAT), helper.make_node("Mul", ["x", "cf"], ["y"]),
             helper.make_node("Shape", ["x"], ["sx"]), helper.make_node("Reshape", ["x", "sx"], ["r"]),
             helper.make_node("Shape", ["r"], ["sr"])]
    g = helper.make_graph(nodes, "nonzero", [helper.make_tensor_value_info("x", TP.FLOAT, ["n"])],
                          [helper.make_tensor_value_info("y", TP.FLOAT, None),
                           helper.make_tensor_value_info("sr", TP.INT64, None)],
                          [helper.make_tensor("one", TP.INT64, [], [1])])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def test_value_dependent_shapes_are_never_remembered():
    m = _nonzero_model()
    model = fg.compile(m, GENERIC)
    model.run({"x": np.ones(3, np.float32)})    # the first run probes the shapes: NonZero's needs data
    run, fill = _run_source(model)
    assert "NonZero" in run and "Shape" in run        # Shape(NonZero(x)) stays in the run
    assert "'Shape' 'sr'" in fill                          # Shape(x) (the no-op Reshape folded) is remembered
    path_outputs = []
    for values in ([0, 1, 2, 0], [3, 3, 3, 3], [0, 0, 0, 5], [1, 0, 1, 0]):   # one shape, different counts
        x = np.array(values, np.float32)
        got = model.run({"x": x})
        want = ReferenceEvaluator(m).run(None, {"x": x})
        np.testing.assert_array_equal(got["y"], want[0])
        np.testing.assert_array_equal(got["sr"], want[1])
        path_outputs.append(float(got["y"].sum()))
    assert len(set(path_outputs)) == 4


def test_shape_of_a_value_made_by_a_reshape_stays_in_the_run():
    """Reshape's target is read from values: the shape of its result is not derived."""
    nodes = [helper.make_node("Reshape", ["x", "t"], ["r"]), helper.make_node("Shape", ["r"], ["s"]),
             helper.make_node("Cast", ["s"], ["sf"], to=TP.FLOAT)]
    g = helper.make_graph(nodes, "reshape", [helper.make_tensor_value_info("x", TP.FLOAT, ["n", 4]),
                                             helper.make_tensor_value_info("t", TP.INT64, [2])],
                          [helper.make_tensor_value_info("sf", TP.FLOAT, None)])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    model = fg.compile(m, GENERIC)
    x = np.zeros((3, 4), np.float32)
    for t in ([4, 3], [2, 6], [12, 1]):
        got = model.run({"x": x, "t": np.array(t, np.int64)})
        np.testing.assert_array_equal(got["sf"], np.array(t, np.float32))
    assert "Shape" in _run_source(model)[0] and not model._executor.frame_runner.program.computed_nodes


def test_memo_is_bounded():
    m = _nonzero_model()
    model = fg.compile(m, GENERIC)
    frames = model._executor.frame_runner.frames
    frames.capacity = 8
    for n in range(1, 20):
        x = np.arange(n, dtype=np.float32)
        got = model.run({"x": x})
        np.testing.assert_array_equal(got["sr"], [n])
        assert 1 <= len(frames.frames) <= 8
    # a length growing by one: after two such misses, the next lengths' frames are made ahead
    assert frames.stats["frames"] < 19 <= frames.stats["frames"] + frames.stats["frames_ahead"]



def test_debug_runs_see_every_node(transformer_models):
    model = fg.compile(str(transformer_models["gpt2"]), GENERIC)
    seen = []
    model.run(transformer_feeds(batch=1, seq=4, pad=1), hook=lambda i, phase, outs: phase and seen.append(i))
    assert sorted(seen) == list(range(len(model._executor.binding.calls)))


def test_a_caller_cannot_write_into_a_remembered_value():
    model = fg.compile(_nonzero_model(), GENERIC)
    x = np.arange(5, dtype=np.float32)
    first = model.run({"x": x})["sr"]            # Shape(x): a remembered value, handed out as a copy
    first[0] = 999
    np.testing.assert_array_equal(model.run({"x": x})["sr"], [5])


def test_a_shape_at_the_end_of_a_deep_chain():
    """Deriving a shape follows producers back a bounded distance (no RecursionError on deep
    graphs); beyond it the Shape simply stays in the run."""
    depth = 1500
    nodes = [helper.make_node("Softmax", ["x" if i == 0 else f"s{i - 1}"], [f"s{i}"], axis=-1) for i in range(depth)]
    nodes += [helper.make_node("Shape", [f"s{depth - 1}"], ["shape"]),
              helper.make_node("Cast", ["shape"], ["y"], to=TP.FLOAT)]
    g = helper.make_graph(nodes, "deep", [helper.make_tensor_value_info("x", TP.FLOAT, ["n", 3])],
                          [helper.make_tensor_value_info("y", TP.FLOAT, None)])
    model = fg.compile(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), GENERIC)
    for n in (2, 5):
        np.testing.assert_array_equal(model.run({"x": np.zeros((n, 3), np.float32)})["y"], [n, 3])
