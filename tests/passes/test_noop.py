"""No-op elimination: each rule removes its node when exact, and declines when not."""
import numpy as np
import pytest

from passes_util import F, I64, check, const, model, node, ops

X = [("x", F, [2, 3, 4])]


def _wrap(op_nodes, inits=(), opset=18, inputs=X):
    """x -> Relu -> <nodes under test, reading r, writing t> -> Neg -> y."""
    nodes = [node("Relu", ["x"], "r")] + op_nodes + [node("Neg", ["t"], "y")]
    return model(nodes, inputs, ["y"], inits, opset)


CASES = {
    "identity": ([node("Identity", ["r"], "t")], ()),
    "dropout_opset18": ([node("Dropout", ["r"], "t")], ()),
    "dropout_train_false": ([node("Dropout", ["r", "ratio", "train"], "t")],
                            (const("ratio", 0.3), const("train", False, np.bool_))),
    "cast_same": ([node("Cast", ["r"], "t", to=F)], ()),
    "reshape_same": ([node("Reshape", ["r", "s"], "t")], (const("s", [2, 3, -1], np.int64),)),
    "expand_same": ([node("Expand", ["r", "s"], "t")], (const("s", [3, 1], np.int64),)),
    "transpose_identity": ([node("Transpose", ["r"], "t", perm=[0, 1, 2])], ()),
    "slice_whole": ([node("Slice", ["r", "st", "en", "ax"], "t")],
                    (const("st", [0, -3], np.int64), const("en", [9223372036854775807, 3], np.int64),
                     const("ax", [2, 1], np.int64))),
    "pad_zero": ([node("Pad", ["r", "p"], "t", mode="reflect")], (const("p", [0] * 6, np.int64),)),
    "concat_single": ([node("Concat", ["r"], "t", axis=1)], ()),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_noop_removed(case):
    nodes, inits = CASES[case]
    compiled = check(_wrap(nodes, inits), level="O1")
    assert ops(compiled) == ["Relu", "Neg"]


@pytest.mark.parametrize("opset", [7, 10])
def test_old_opset_dropout_and_slice(opset):
    nodes = [node("Dropout", ["r"], "d", ratio=0.5)]
    if opset == 7:
        nodes.append(node("Slice", ["d"], "t", starts=[0], ends=[100], axes=[1]))
        inits = ()
    else:
        nodes.append(node("Slice", ["d", "st", "en"], "t"))
        inits = (const("st", [0, 0], np.int64), const("en", [2, 3], np.int64))
    compiled = check(_wrap(nodes, inits, opset=opset), level="O1")
    assert ops(compiled) == ["Relu", "Neg"]


DECLINED = {
    "dropout_training": ([node("Dropout", ["r", "ratio", "train"], "t")],
                         (const("ratio", 0.0), const("train", True, np.bool_)), "Dropout"),
    "cast_other": ([node("Cast", ["r"], "i", to=I64), node("Cast", ["i"], "t", to=F)], (), "Cast"),
    "slice_partial": ([node("Slice", ["r", "st", "en", "ax"], "t")],
                      (const("st", [1], np.int64), const("en", [3], np.int64), const("ax", [1], np.int64)),
                      "Slice"),
    "slice_step": ([node("Slice", ["r", "st", "en", "ax", "sp"], "t")],
                   (const("st", [0], np.int64), const("en", [4], np.int64), const("ax", [2], np.int64),
                    const("sp", [2], np.int64)), "Slice"),
    "pad_nonzero": ([node("Pad", ["r", "p"], "t")], (const("p", [0, 0, 1, 0, 0, 0], np.int64),), "Pad"),
    "expand_bigger": ([node("Expand", ["r", "s"], "t")], (const("s", [2, 2, 3, 4], np.int64),), "Expand"),
    "transpose_real": ([node("Transpose", ["r"], "t", perm=[0, 2, 1])], (), "Transpose"),
}


@pytest.mark.parametrize("case", sorted(DECLINED))
def test_noop_kept_when_not_a_noop(case):
    nodes, inits, kept = DECLINED[case]
    compiled = check(_wrap(nodes, inits), level="O1")
    assert kept in ops(compiled)


def test_dropout_mask_used_is_kept():
    m = model([node("Dropout", ["x"], ["t", "mask"]), node("Cast", ["mask"], "mf", to=F),
               node("Add", ["t", "mf"], "y")], X, ["y"])
    assert "Dropout" in ops(check(m, level="O1"))


def test_identity_between_two_graph_outputs_is_kept():
    """Bypassing it would make two graph outputs one tensor."""
    m = model([node("Relu", ["x"], "a"), node("Identity", ["a"], "b")], X, ["a", "b"])
    compiled = check(m, level="O1")
    assert ops(compiled) == ["Relu", "Identity"]


def test_identity_to_output_keeps_output_name():
    m = model([node("Relu", ["x"], "a"), node("Identity", ["a"], "y")], X, ["y"])
    compiled = check(m, level="O1")
    assert ops(compiled) == ["Relu"] and list(compiled.run({"x": np.ones((2, 3, 4), np.float32)})) == ["y"]


def test_symbolic_slice_whole():
    m = model([node("Slice", ["x", "st", "en"], "t"), node("Neg", ["t"], "y")], [("x", F, ["N", 4])],
              ["y"], (const("st", [0], np.int64), const("en", [2147483647], np.int64)))
    assert ops(check(m, level="O1")) == ["Neg"]
