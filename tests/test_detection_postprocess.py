"""A detection-style post-processing graph built with onnx.helper: TopK on the scores, the top
boxes gathered, NonMaxSuppression, then an If (no detection: a placeholder box) and a Loop over
the kept detections (per-box areas as a scan output, their running sum carried), against
onnxruntime (ORT_DISABLE_ALL) at rtol 1e-4, compiled and through the .fgm artifact."""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from oracle import check_compiled_and_loaded

F, I64, B = TensorProto.FLOAT, TensorProto.INT64, TensorProto.BOOL
N, K = 32, 12


def _const(name, arr):
    return helper.make_node("Constant", [], [name], value=numpy_helper.from_array(np.asarray(arr), name + "_v"))


def postprocess_model() -> onnx.ModelProto:
    area_body = helper.make_graph(
        [helper.make_node("Identity", ["c"], ["c_out"]),
         helper.make_node("Gather", ["dets", "i"], ["box"], axis=0),
         helper.make_node("Split", ["box", "two"], ["lo", "hi"], axis=0),
         helper.make_node("Sub", ["hi", "lo"], ["wh"]),
         helper.make_node("Abs", ["wh"], ["awh"]),
         helper.make_node("ReduceProd", ["awh"], ["area"], keepdims=0),
         helper.make_node("Add", ["total_in", "area"], ["total_out"])],
        "areas", [helper.make_tensor_value_info("i", I64, []), helper.make_tensor_value_info("c", B, []),
                  helper.make_tensor_value_info("total_in", F, [])],
        [helper.make_tensor_value_info("c_out", B, []), helper.make_tensor_value_info("total_out", F, []),
         helper.make_tensor_value_info("area", F, [])])
    then_g = helper.make_graph([helper.make_node("Identity", ["dets"], ["out_t"])], "found", [],
                               [helper.make_tensor_value_info("out_t", F, [None, 4])])
    else_g = helper.make_graph([_const("out_e", np.zeros((1, 4), np.float32))], "none", [],
                               [helper.make_tensor_value_info("out_e", F, [1, 4])])
    nodes = [
        _const("k", np.int64([K])), _const("two", np.int64([2, 2])), _const("col", np.int64(2)),
        _const("max_out", np.int64([6])), _const("iou", np.float32([0.4])), _const("thr", np.float32([0.2])),
        _const("zero_f", np.float32(0)), _const("zero_i", np.int64(0)), _const("axis0", np.int64([0])),
        helper.make_node("TopK", ["scores", "k"], ["top_s", "top_i"], axis=2),
        helper.make_node("Squeeze", ["top_i", "axis0"], ["top_i2"]),
        helper.make_node("Squeeze", ["top_i2", "axis0"], ["top_i1"]),
        helper.make_node("Gather", ["boxes", "top_i1"], ["top_b"], axis=1),
        helper.make_node("NonMaxSuppression", ["top_b", "top_s", "max_out", "iou", "thr"], ["sel"]),
        helper.make_node("Gather", ["sel", "col"], ["sel_i"], axis=1),
        helper.make_node("Squeeze", ["top_b", "axis0"], ["top_b0"]),
        helper.make_node("Gather", ["top_b0", "sel_i"], ["dets"], axis=0),
        helper.make_node("Shape", ["sel_i"], ["m_shape"]),
        helper.make_node("Squeeze", ["m_shape", "axis0"], ["m"]),
        helper.make_node("Greater", ["m", "zero_i"], ["found"]),
        helper.make_node("If", ["found"], ["detections"], then_branch=then_g, else_branch=else_g),
        helper.make_node("Loop", ["m", "", "zero_f"], ["total_area", "areas"], body=area_body),
    ]
    g = helper.make_graph(nodes, "postprocess",
                          [helper.make_tensor_value_info("boxes", F, [1, N, 4]),
                           helper.make_tensor_value_info("scores", F, [1, 1, N])],
                          [helper.make_tensor_value_info("detections", F, [None, 4]),
                           helper.make_tensor_value_info("total_area", F, []),
                           helper.make_tensor_value_info("areas", F, [None])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    onnx.checker.check_model(m, full_check=True)
    return m


def _feeds(seed: int, score_scale: float = 1.0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    xy = rng.uniform(0, 10, (1, N, 2)).astype(np.float32)
    wh = rng.uniform(0.5, 4, (1, N, 2)).astype(np.float32)
    scores = (rng.uniform(0, 1, (1, 1, N)) * score_scale).astype(np.float32)
    return {"boxes": np.concatenate([xy, xy + wh], axis=2), "scores": scores}


@pytest.mark.parametrize("seed,scale", [(0, 1.0), (1, 1.0), (2, 0.1)])   # scale 0.1: nothing kept
def test_detection_postprocess_matches_onnxruntime(tmp_path, seed, scale):
    model = postprocess_model()
    feeds = _feeds(seed, scale)
    _, want = check_compiled_and_loaded(model, feeds, tmp_path / "post.fgm")
    if scale < 0.2:
        assert want["areas"].shape == (0,) and want["detections"].shape == (1, 4)
    else:
        assert want["areas"].shape[0] > 1
