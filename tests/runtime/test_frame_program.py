"""What a model with symbolic input dims computes once per input shape (issue 36):
``shape_program.py``'s computed nodes (a ``Shape`` of an activation and the integer arithmetic
after it), plans made ahead for a growing dim (``frames.py``), and graph outputs made by
their kernels rather than copied out of the arena.

The decoder step below is the shape of a GPT-2 export's attention: the present cache is
``Concat(past, new)``, and a head split reshapes it to a target computed from
``Shape(present)`` — from the values of an activation's shape. The oracle is onnxruntime with
ORT_DISABLE_ALL."""
import numpy as np
import pytest
from onnx import TensorProto as TP
from onnx import helper, numpy_helper

import fusegraph as fg
from fusegraph.errors import InputError
from oracle import assert_outputs_close, ort_run

D, HEADS = 8, 2


def _decoder_step():
    rng = np.random.default_rng(0)
    w = (rng.standard_normal((D, D)) * np.sqrt(2.0 / D)).astype(np.float32)
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["new"]),
        helper.make_node("Concat", ["past", "new"], ["present"], axis=1),
        helper.make_node("Shape", ["present"], ["shape"]),
        helper.make_node("Gather", ["shape", "one"], ["total"], axis=0),
        helper.make_node("Mul", ["total", "heads_scalar"], ["rows"]),
        helper.make_node("Unsqueeze", ["rows", "zero_axis"], ["rows_1d"]),
        helper.make_node("Concat", ["batch", "rows_1d", "head"], ["target"], axis=0),
        helper.make_node("Reshape", ["present", "target"], ["split"]),     # [1, total * heads, head]
        helper.make_node("ReduceSum", ["split", "two_axis"], ["summed"], keepdims=0),    # [1, total * heads]
        helper.make_node("Concat", ["present", "pad"], ["padded"], axis=1),              # [1, total + 5, D]
        helper.make_node("ReduceMax", ["padded"], ["peaks"], axes=[2], keepdims=0),     # [1, total + 5]
        helper.make_node("Relu", ["peaks"], ["peaks_relu"]),
        helper.make_node("Concat", ["summed", "peaks_relu"], ["y"], axis=1),
    ]
    inits = [numpy_helper.from_array(w, "w"),
             numpy_helper.from_array(np.array(1, np.int64), "one"),
             numpy_helper.from_array(np.array([0], np.int64), "zero_axis"),
             numpy_helper.from_array(np.array([2], np.int64), "two_axis"),
             numpy_helper.from_array(rng.standard_normal((1, 5, D)).astype(np.float32), "pad"),
             numpy_helper.from_array(np.array([1], np.int64), "batch"),
             numpy_helper.from_array(np.array(HEADS, np.int64), "heads_scalar"),
             numpy_helper.from_array(np.array([D // HEADS], np.int64), "head")]
    g = helper.make_graph(nodes, "decoder_step",
                          [helper.make_tensor_value_info("x", TP.FLOAT, [1, "seq", D]),
                           helper.make_tensor_value_info("past", TP.FLOAT, [1, "past", D])],
                          [helper.make_tensor_value_info("y", TP.FLOAT, None),
                           helper.make_tensor_value_info("present", TP.FLOAT, None)], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def _feeds(seq: int, past: int, seed: int) -> dict:
    rng = np.random.default_rng(seed)
    return {"x": rng.standard_normal((1, seq, D)).astype(np.float32),
            "past": rng.standard_normal((1, past, D)).astype(np.float32)}


def test_a_shape_of_an_activation_is_computed_with_the_frame():
    m = _decoder_step()
    model = fg.compile(m, fg.Config(threads=1))
    for i, (seq, past) in enumerate([(4, 0), (3, 9), (1, 4), (1, 5), (1, 4)]):
        feeds = _feeds(seq, past, i)
        assert_outputs_close(model.run(feeds), ort_run(m, feeds))
    runner = model._executor.frame_runner
    assert not runner.program.dynamic, runner.program.dynamic     # every shape known before the run
    computed = {n.op_type for n in runner.program.computed_nodes}
    assert {"Shape", "Gather", "Mul", "Unsqueeze", "Concat"} <= computed
    run = model._executor.code.source
    assert "'Shape'" not in run and "'Reshape'" in run           # the reshape runs; its target comes with the frame
    planned = {id(v) for v in runner.frames.planned}
    graph = model._executor.graph
    assert planned and not planned & {id(v) for v in graph.outputs}  # outputs: the kernels' own tensors
    assert runner.frames.stats["frames"] == 4                    # (1, 4) came back: its frame was kept


def test_outputs_outlive_the_next_run():
    """An output is handed over as its kernel made it: the next run must not change it."""
    m = _decoder_step()
    model = fg.compile(m, fg.Config(threads=1))
    first = model.run(_feeds(2, 3, 0))
    kept = {k: v.copy() for k, v in first.items()}
    model.run(_feeds(2, 3, 1))
    model.run(_feeds(1, 6, 2))
    for k in kept:
        np.testing.assert_array_equal(first[k], kept[k])


@pytest.mark.parametrize("prompt", [1, 7])
def test_a_growing_past_plans_ahead(prompt):
    """A past growing a token a step: a plan made ahead (the grown dims at the next power of
    two) serves the steps after it, so the plans grow logarithmically with the steps; each
    plan's arena stays within twice the bytes live at its largest step."""
    m = _decoder_step()
    model = fg.compile(m, fg.Config(threads=1))
    past = 0
    steps = 70
    feeds = _feeds(prompt, past, 0)
    for step in range(steps):
        got = model.run(feeds)
        if step % 17 == 0 or step == steps - 1:
            assert_outputs_close(got, ort_run(m, feeds))
        past += feeds["x"].shape[1]
        feeds = {"x": _feeds(1, 0, step + 1)["x"], "past": got["present"]}
    frames = model._executor.frame_runner.frames
    assert frames.stats["frames"] + frames.stats["frames_ahead"] >= steps
    assert frames.stats["plans"] <= 1 + past.bit_length(), frames.stats       # one per power of two
    for bucket in model.memory_buckets():
        assert 0 < bucket["arena_bytes"] <= 2 * bucket["lower_bound_bytes"], bucket


def test_a_growing_past_makes_its_next_frames_ahead():
    """Past a token a step: after two misses that grew the dims by one amount, a miss makes the
    next steps' frames too (while the kept plan serves them), and the steps after it find them;
    the outputs are onnxruntime's at every step. Frames ahead stop silently at a declared
    range's end: the last step inside it runs, the first outside is refused as before. Lengths
    that do not grow by one amount make none ahead."""
    m = _decoder_step()
    model = fg.compile(m, fg.Config(threads=1, shapes={"past": (0, 40)}))
    frames = model._executor.frame_runner.frames
    feeds, past, made_at_miss = _feeds(3, 0, 0), 0, []
    for step in range(38):
        before = frames.stats["frames"]
        got = model.run(feeds)
        made_at_miss.append(frames.stats["frames"] - before)
        assert_outputs_close(got, ort_run(m, feeds))
        past += feeds["x"].shape[1]
        feeds = {"x": _feeds(1, 0, step + 1)["x"], "past": got["present"]}
    assert past == 40 and frames.stats["frames_ahead"] > 0
    assert sum(made_at_miss) < len(made_at_miss) // 2, made_at_miss
    assert all(k[1][1] <= 40 for k in frames.frames)          # no frame made outside the range
    assert_outputs_close(model.run(feeds), ort_run(m, feeds))   # past 40: the range's last length
    with pytest.raises(InputError, match="declared range"):
        model.run({"x": feeds["x"], "past": np.concatenate([feeds["past"], feeds["past"][:, :1]], axis=1)})

    lengths = fg.compile(m, fg.Config(threads=1))
    for seq in (3, 9, 4, 11, 2, 17, 5):
        lengths.run(_feeds(seq, 2 * seq, seq))
    assert lengths._executor.frame_runner.frames.stats["frames_ahead"] == 0


def test_a_repeated_step_reuses_its_last_result():
    """Between two frames only the steps whose inputs changed run again: a shape step whose
    input shapes and read values are the same objects gives its last result."""
    m = _decoder_step()
    model = fg.compile(m, fg.Config(threads=1))
    model.run(_feeds(1, 3, 0))
    program = model._executor.frame_runner.program
    reshape = [s for s in program.steps if s.node.op_type == "Reshape"][0]
    first = reshape.last
    model.run(_feeds(1, 4, 1))               # the total changes: the target and the reshape again
    assert reshape.last is not first
    matmul = [s for s in program.steps if s.node.op_type in ("MatMul", "Linear", "LinearAct")][0]
    kept = matmul.last
    model.run(_feeds(1, 5, 2))               # the new row's product: the same shapes, its last result
    assert matmul.last is kept
