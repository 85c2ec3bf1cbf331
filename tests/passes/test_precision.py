"""The mixed-precision pass (passes/precision.py) graph in / graph out, for every entry of its
policy table (the classes the ops register, read by passes/precision_policy.py policy()): each op
reads the output of a reduced
(bf16) convolution, and its compute dtype, the casts around it, the converted weights and its
log entry are asserted exactly. Then the cast properties (none between two reduced ops, one
per value and type, weights converted once, broadcast constants kept stride 0), the
op_precision overrides, the logits rule, and one model through the public API against
onnxruntime at a bf16 tolerance.

Every graph here starts ``x (fp32 input) -> Cast -> Conv "conv0" (bf16)`` and ends with a
``fusegraph.LayerNorm`` "tail" (a normalisation: conv0 is not the logits), whose fp32 output
``y`` is the graph output."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from onnx import TensorProto
from oracle import ort_run
from passes_util import const, model, node

import fusegraph as fg
from fusegraph.ir import DType, Graph
from fusegraph.ops import infer_graph, infer_node
from fusegraph.passes import precision_policy as pp
from fusegraph.passes.precision import PrecisionPass, precision_summary

FP, BF, H, I64 = DType.FLOAT, DType.BFLOAT16, DType.FLOAT16, DType.INT64
SHAPE = (1, 4, 6, 6)
POLICY = pp.policy()
CONV_WHY = POLICY[("", "Conv")][1]
R = pp.Reason
FG = "fusegraph"
REDUCE, FOLLOW, KEEP, ANY = pp.REDUCE, pp.FOLLOW, pp.KEEP, pp.ANY


def _w(*shape, seed=0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(shape, generator=gen, dtype=torch.float32) * 0.3


def _i64(values) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.int64)


def _f32(values) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.float32)


def _conv(g: Graph, x, name: str, weight=None, **attrs):
    w = weight if weight is not None else g.add_constant(f"{name}_w", _w(4, 4, 3, 3, seed=len(g.nodes)))
    return g.add_node("Conv", [x, w], attrs={"pads": [1, 1, 1, 1], **attrs}, name=name)


def _graph():
    g = Graph("t", opset={"": 18})
    x = g.add_input("x", FP, SHAPE)
    conv = _conv(g, x, "conv0")
    return g, x, conv


def _tail(g: Graph, v, name="tail", out="y"):
    ln = g.add_node("LayerNorm", [v], attrs={"epsilon": 1e-5}, domain=FG, name=name, outputs=[out])
    g.outputs.append(ln.outputs[0])
    return ln


def _c(g, name, t):
    return g.add_constant(name, t)


def _op(op, *extra_consts, domain="", outputs=1, **attrs):
    """A builder for ``op(a, consts...)``: ``extra_consts`` are (name, tensor) made per graph."""
    def build(g, a, b):
        ins = [a] + [_c(g, n, t()) for n, t in extra_consts]
        return g.add_node(op, ins, attrs=attrs, domain=domain, name="op", outputs=outputs)
    return build


def _op2(op, domain="", **attrs):
    """A builder for the binary ``op(a, b)``."""
    return lambda g, a, b: g.add_node(op, [a, b], attrs=attrs, domain=domain, name="op")


def _gemm(g, a, b):
    flat = g.add_node("Flatten", [a], attrs={"axis": 1}, name="flat")
    return g.add_node("Gemm", [flat.outputs[0], _c(g, "gw", _w(144, 5, seed=3)), _c(g, "gb", _w(5, seed=4))],
                      name="op")


def _where(g, a, b):
    cond = g.add_input("cond", DType.BOOL, SHAPE)
    return g.add_node("Where", [cond, a, b], name="op")


def _shape(g, a, b):
    s = g.add_node("Shape", [a], name="op")
    r = g.add_node("Reshape", [a, s.outputs[0]], name="reshape")
    return s, r.outputs[0]


def _size(g, a, b):
    s = g.add_node("Size", [a], name="op")
    u = g.add_node("Unsqueeze", [s.outputs[0], _c(g, "ax", _i64([0]))], name="unsq")
    r = g.add_node("Reshape", [a, u.outputs[0]], name="reshape")
    return s, r.outputs[0]


def _reduce(op):
    return _op(op, ("axes", lambda: _i64([3])), keepdims=1)


def _recurrent(op, gates, domain=""):
    """``op`` over ``a`` seen as 4 steps of 6 rows of 6 features, hidden 5, with W, R and B."""
    def build(g, a, b):
        x = g.add_node("Reshape", [a, _c(g, "steps", _i64([4, 6, 6]))], name="to_steps").outputs[0]
        ins = [x, _c(g, "rw", _w(1, gates * 5, 6, seed=5)), _c(g, "rr", _w(1, gates * 5, 5, seed=6)),
               _c(g, "rb", _w(1, 2 * gates * 5, seed=7))]
        return g.add_node(op, ins, attrs={"hidden_size": 5}, domain=domain, name="op")
    return build


_LN = {"epsilon": 1e-5}

# one graph builder per policy entry: (g, a, b) -> the node under test (or (node, value the
# tail LayerNorm reads)); ``a`` and ``b`` are float [1, 4, 6, 6] values
BUILDERS = {
    # REDUCE
    (FG, "FusedConv"): _op("FusedConv", ("fw", lambda: _w(4, 4, 3, 3, seed=5)), ("fb", lambda: _w(4, seed=6)),
                           domain=FG, pads=[1, 1, 1, 1], activation="relu"),
    ("", "Conv"): _op("Conv", ("cw", lambda: _w(4, 4, 3, 3, seed=5)), pads=[1, 1, 1, 1]),
    ("", "ConvTranspose"): _op("ConvTranspose", ("cw", lambda: _w(4, 4, 3, 3, seed=5))),
    (FG, "LinearAct"): _op("LinearAct", ("lw", lambda: _w(6, 5, seed=5)), ("lb", lambda: _w(5, seed=6)),
                           domain=FG, activation="relu"),
    (FG, "Linear"): _op("Linear", ("lw", lambda: _w(5, 6, seed=5)), domain=FG, trans_b=1),
    (FG, "GatedLinear"): _op("GatedLinear", ("gw", lambda: _w(5, 6, seed=5)), ("uw", lambda: _w(5, 6, seed=7)),
                             ("gb", lambda: _w(5, seed=6)), ("ub", lambda: _w(5, seed=8)), domain=FG,
                             activation="silu"),
    (FG, "BatchMatMul"): _op2("BatchMatMul", domain=FG, trans_b=1),
    ("", "MatMul"): _op("MatMul", ("mw", lambda: _w(6, 5, seed=5))),
    ("", "Gemm"): _gemm,
    ("", "RNN"): _recurrent("RNN", 1),
    ("", "GRU"): _recurrent("GRU", 3),
    ("", "LSTM"): _recurrent("LSTM", 4),
    (FG, "LSTM"): _recurrent("LSTM", 4, domain=FG),
    (FG, "ScaledDotProductAttention"): lambda g, a, b: g.add_node(
        "ScaledDotProductAttention", [a, b, a], attrs={"scale": 0.5}, domain=FG, name="op"),
    # FOLLOW: data movement
    ("", "Reshape"): _op("Reshape", ("shape", lambda: _i64([1, 4, 36]))),
    ("", "Flatten"): _op("Flatten", axis=1),
    ("", "Squeeze"): _op("Squeeze", ("axes", lambda: _i64([0]))),
    ("", "Unsqueeze"): _op("Unsqueeze", ("axes", lambda: _i64([0]))),
    ("", "Transpose"): _op("Transpose", perm=[0, 1, 3, 2]),
    ("", "Identity"): _op("Identity"),
    ("", "Concat"): _op2("Concat", axis=1),
    ("", "Split"): _op("Split", ("split", lambda: _i64([3, 3])), outputs=2, axis=3),
    ("", "Slice"): _op("Slice", ("starts", lambda: _i64([0])), ("ends", lambda: _i64([3])),
                       ("sl_axes", lambda: _i64([3]))),
    ("", "Gather"): _op("Gather", ("idx", lambda: _i64([0, 2])), axis=1),
    ("", "Expand"): _op("Expand", ("to", lambda: _i64([2, 4, 6, 6]))),
    ("", "Tile"): _op("Tile", ("reps", lambda: _i64([1, 1, 1, 2]))),
    ("", "Pad"): _op("Pad", ("pads", lambda: _i64([0, 0, 1, 1, 0, 0, 1, 1]))),
    ("", "DepthToSpace"): _op("DepthToSpace", blocksize=2),
    ("", "SpaceToDepth"): _op("SpaceToDepth", blocksize=2),
    (FG, "ChannelShuffle"): _op("ChannelShuffle", domain=FG, groups=2),
    (FG, "Roll"): _op("Roll", domain=FG, shifts=[2], axes=[3]),
    ("", "MaxPool"): _op("MaxPool", kernel_shape=[2, 2]),
    ("", "GlobalMaxPool"): _op("GlobalMaxPool"),
    ("", "AveragePool"): _op("AveragePool", kernel_shape=[2, 2]),
    ("", "GlobalAveragePool"): _op("GlobalAveragePool"),
    # FOLLOW: interpolation (the scales stay float32: coordinates, not data)
    ("", "Resize"): lambda g, a, b: g.add_node(
        "Resize", [a, None, _c(g, "rs", torch.tensor([1.0, 1.0, 1.5, 2.0]))], attrs={"mode": "linear"}, name="op"),
    ("", "Upsample"): lambda g, a, b: g.add_node(
        "Upsample", [a, _c(g, "us", torch.tensor([1.0, 1.0, 2.0, 2.0]))], attrs={"mode": "nearest"}, name="op",
        version=9),
    # FOLLOW: elementwise
    **{("", op): _op2(op) for op in ("Add", "Sub", "Mul", "Div", "Max", "Min")},
    **{("", op): _op(op) for op in ("Neg", "Abs", "Relu", "Sigmoid", "Tanh", "HardSigmoid", "HardSwish",
                                    "Elu", "Selu", "Softplus", "Mish", "Erf")},
    ("", "LeakyRelu"): _op("LeakyRelu", alpha=0.1),
    ("", "PRelu"): _op("PRelu", ("slope", lambda: _w(4, 1, 1, seed=7))),
    ("", "Clip"): _op("Clip", ("lo", lambda: _f32(0.0)), ("hi", lambda: _f32(6.0))),
    ("", "Where"): _where,
    ("", "Gelu"): lambda g, a, b: g.add_node("Gelu", [a], name="op", version=20),
    (FG, "Gelu"): _op("Gelu", domain=FG, approximate="none"),
    (FG, "ElementwiseChain"): lambda g, a, b: g.add_node(
        "ElementwiseChain", [a, b], attrs={"steps": ["Mul i0 i1", "Relu p"]}, domain=FG, name="op"),
    (FG, "GatedActivation"): _op("GatedActivation", domain=FG, activation="silu"),
    (FG, "RotaryEmbedding"): lambda g, a, b: g.add_node("RotaryEmbedding", [a, b, b], domain=FG, name="op"),
    # ANY
    ("", "Shape"): _shape,
    ("", "Size"): _size,
    # KEEP
    ("", "Softmax"): _op("Softmax", axis=-1),
    ("", "LogSoftmax"): _op("LogSoftmax", axis=-1),
    (FG, "MaskedSoftmax"): _op("MaskedSoftmax", ("mask", lambda: _w(1, 1, 1, 6, seed=8)), domain=FG, scale=0.5),
    (FG, "LayerNorm"): _op("LayerNorm", ("gamma", lambda: _w(6, seed=9)), ("beta", lambda: _w(6, seed=10)),
                           domain=FG, **_LN),
    (FG, "SkipLayerNorm"): lambda g, a, b: g.add_node(
        "SkipLayerNorm", [a, b, _c(g, "gamma", _w(6, seed=9)), _c(g, "beta", _w(6, seed=10))], attrs=_LN,
        domain=FG, name="op"),
    (FG, "RMSNorm"): _op("RMSNorm", ("gamma", lambda: _w(6, seed=9)), domain=FG, epsilon=1e-6),
    (FG, "SkipRMSNorm"): lambda g, a, b: g.add_node(
        "SkipRMSNorm", [a, b, _c(g, "gamma", _w(6, seed=9))], attrs={"epsilon": 1e-6}, domain=FG, name="op"),
    ("", "LayerNormalization"): _op("LayerNormalization", ("gamma", lambda: _w(6, seed=9)),
                                    ("beta", lambda: _w(6, seed=10)), axis=-1, **_LN),
    ("", "BatchNormalization"): _op("BatchNormalization", *[(n, lambda s=s: _w(4, seed=s).abs() + 0.5)
                                                            for s, n in enumerate(("sc", "bb", "mu", "var"))]),
    ("", "InstanceNormalization"): _op("InstanceNormalization", ("sc", lambda: _w(4, seed=11)),
                                       ("bb", lambda: _w(4, seed=12))),
    ("", "GroupNormalization"): _op("GroupNormalization", ("sc", lambda: _w(2, seed=11)),
                                    ("bb", lambda: _w(2, seed=12)), num_groups=2),
    (FG, "ChannelLayerNorm"): _op("ChannelLayerNorm", ("gamma", lambda: _w(4, seed=11)),
                                  ("beta", lambda: _w(4, seed=12)), domain=FG, epsilon=1e-5),
    (FG, "GroupNorm"): _op("GroupNorm", ("sc", lambda: _w(4, seed=11)), ("bb", lambda: _w(4, seed=12)),
                           domain=FG, groups=2, epsilon=1e-5),
    ("", "LRN"): _op("LRN", size=3),
    **{("", op): _reduce(op) for op in ("ReduceMean", "ReduceSum", "ReduceSumSquare", "ReduceL1", "ReduceL2",
                                        "ReduceLogSum", "ReduceLogSumExp", "ReduceProd", "ReduceMax",
                                        "ReduceMin")},
    ("", "CumSum"): _op("CumSum", ("axis", lambda: torch.tensor(3, dtype=torch.int64))),
    (FG, "ScaledReduce"): _op("ScaledReduce", domain=FG, rank=4, axes=[3], mode="sum", keepdims=1, scale=1.0),
    **{("", op): _op(op) for op in ("Exp", "Log", "Sqrt", "Reciprocal")},
    ("", "Pow"): _op("Pow", ("two", lambda: _f32(2.0))),
}


def test_every_policy_entry_has_a_graph_test():
    assert set(BUILDERS) == set(POLICY)


def _casts(g: Graph) -> list:
    return [n for n in g.nodes if n.op_type == "Cast" and n.meta.get("rule") == "precision"]


def _float_consts(n) -> list:
    return list({id(v): v for v in n.inputs if v is not None and v.is_const and v.dtype == FP}.values())


def _run(g, precision="bf16", overrides=()):
    log = []
    res = PrecisionPass(precision, tuple(overrides), log).run(g)
    g.verify(infer_node)
    return res, {r["node"]: r for r in log}


def _build(key, scenario):
    """``scenario``: "reduced" (a = b = conv0's bf16 output) or "fp32" (a = Exp(conv0) in fp32,
    b = conv0's output)."""
    g, _x, conv = _graph()
    c = conv.outputs[0]
    a = g.add_node("Exp", [c], name="exp").outputs[0] if scenario == "fp32" else c
    built = BUILDERS[key](g, a, c)
    op, tail_in = built if isinstance(built, tuple) else (built, built.outputs[0])
    _tail(g, tail_in)
    infer_graph(g)
    return g, conv, op


def _assert_output_kept(g):
    assert [(v.name, v.dtype) for v in g.outputs] == [("y", FP)]
    assert g.outputs[0].producer.name == "tail"      # the tail computes in fp32: no final cast


def _float_ins(op):
    return [v for v in op.inputs if v is not None and v.dtype in (FP, BF)]


@pytest.mark.parametrize("key", sorted(POLICY), ids=lambda k: f"{k[0] or 'onnx'}.{k[1]}")
def test_policy_entry_graph_in_graph_out(key):
    cls, why = POLICY[key]
    g, conv, op = _build(key, "reduced")
    consts = _float_consts(op)
    res, log = _run(g)
    assert log["conv0"]["dtype"] == "bf16" and conv.outputs[0].dtype == BF
    casts = _casts(g)
    # x -> bf16 before conv0, and one cast back to fp32 (before the op, or before the tail)
    assert len(casts) == 2 == res.stats["casts"], [str(n) for n in casts]
    assert casts[0].inputs[0].name == "x" and casts[0].outputs[0].dtype == BF
    back = casts[1]
    assert back.outputs[0].dtype == FP and back.inputs[0].dtype == BF
    produced_by_cast = [v for v in op.inputs if v is not None and v.producer is not None
                        and v.producer.op_type == "Cast"]
    kept = {id(op.inputs[i]) for i in pp.FLOAT32_BIAS.get(key, ())      # a product's constant biases stay float32
            if len(op.inputs) > i and op.inputs[i] is not None and op.inputs[i].is_const}
    if key in pp.FLOAT32_CONSTANTS:          # every float constant stays float32 (a Resize's scales)
        kept |= {id(v) for v in op.inputs if v is not None and v.is_const and v.dtype == FP}
    if cls in (REDUCE, FOLLOW):
        assert all(v.dtype == (FP if id(v) in kept else BF) for v in _float_ins(op)), [str(v) for v in op.inputs]
        assert {v.dtype for v in op.outputs if v.dtype in (FP, BF)} == {BF}
        assert not produced_by_cast
        assert g.nodes[g.nodes.index(back) + 1].name == "tail"      # the cast back feeds the tail
        assert res.stats["weights_converted"] == 1 + len(consts) - len(kept)
        assert all(c.dtype == FP and (c.name in g.constants) == (id(c) in kept) for c in consts)   # old fp32 ones removed
        assert log["op"] == {"node": "op", "op": key[1], "dtype": "bf16", "class": cls, "why": why,
                             "code": pp.classify(*key).code}
    elif cls == KEEP:
        assert all(v.dtype == FP for v in _float_ins(op)), [str(v) for v in op.inputs]
        assert all(v.dtype == FP for v in op.outputs)
        assert produced_by_cast and all(v.producer is back for v in produced_by_cast)
        assert back.inputs[0] is conv.outputs[0]
        assert res.stats["weights_converted"] == 1
        assert all(g.constants[c.name] is c and c.dtype == FP for c in consts)   # untouched
        assert log["op"] == {"node": "op", "op": key[1], "dtype": "fp32", "class": cls, "why": why,
                             "code": pp.classify(*key).code}
    else:
        assert cls == ANY
        assert op.inputs[0] is conv.outputs[0] and not produced_by_cast      # read as it is
        assert op.outputs[0].dtype == I64
        assert "op" not in log
    _assert_output_kept(g)


@pytest.mark.parametrize("key", sorted(k for k, (c, _) in POLICY.items() if c == FOLLOW),
                         ids=lambda k: f"{k[0] or 'onnx'}.{k[1]}")
def test_follow_op_with_an_fp32_input_stays_fp32(key):
    """A FOLLOW op whose live float input (Exp's, fp32) is fp32 computes in fp32; where it also
    reads conv0's bf16 output, it reads it through the one cast back Exp reads it through."""
    g, conv, op = _build(key, "fp32")
    res, log = _run(g)
    casts = _casts(g)
    assert len(casts) == 2 == res.stats["casts"]
    back = casts[1]
    assert back.inputs[0] is conv.outputs[0] and back.outputs[0].dtype == FP
    assert all(v.dtype == FP for v in _float_ins(op)), [str(v) for v in op.inputs]
    assert all(v.dtype == FP for v in op.outputs)
    for v in op.inputs:
        if v is not None and v.producer is not None and v.producer.op_type == "Cast":
            assert v.producer is back
    assert res.stats["weights_converted"] == 1           # conv0's weight only
    assert log["op"] == {"node": "op", "op": key[1], "dtype": "fp32", "class": FOLLOW,
                         "why": POLICY[key][1], "code": R.MOVEMENT if POLICY[key][1] == pp.MOVE_WHY else R.POLICY}
    _assert_output_kept(g)


def test_elementwise_chain_with_an_exp_step_stays_fp32():
    g, _, conv = _graph()
    c = conv.outputs[0]
    op = g.add_node("ElementwiseChain", [c, c], attrs={"steps": ["Mul i0 i1", "Exp p"]}, domain=FG, name="op")
    _tail(g, op.outputs[0])
    infer_graph(g)
    res, log = _run(g)
    assert [v.dtype for v in op.inputs] == [FP, FP] and op.inputs[0] is op.inputs[1]
    assert op.inputs[0].producer.op_type == "Cast" and op.outputs[0].dtype == FP
    assert res.stats["casts"] == len(_casts(g)) == 2
    assert (log["op"]["dtype"], log["op"]["class"]) == ("fp32", KEEP)
    assert log["op"]["why"] == pp.classify(FG, "ElementwiseChain", ["Exp p"])[1] != POLICY[(FG, "ElementwiseChain")][1]


# ---------------------------------------------------------------- casts

def _reduced_compute(n) -> bool:
    return any(v.dtype in (BF, H) for v in n.outputs) and n.op_type != "Cast"


def test_no_cast_between_two_reduced_ops_on_a_chain():
    g, _x, conv = _graph()
    v = conv.outputs[0]
    for name, op, attrs in [("r0", "Relu", {}), ("mp", "MaxPool", {"kernel_shape": [2, 2], "strides": [1, 1]}),
                            ("conv1", "Conv", None), ("r1", "Relu", {}), ("conv2", "Conv", None),
                            ("tr", "Transpose", {"perm": [0, 1, 3, 2]}), ("r2", "Relu", {})]:
        v = (_conv(g, v, name) if attrs is None else g.add_node(op, [v], attrs=attrs, name=name)).outputs[0]
    _tail(g, v)
    infer_graph(g)
    res, log = _run(g)
    assert [n.name for n in g.nodes] == ["x_to_bf16", "conv0", "r0", "mp", "conv1", "r1", "conv2", "tr", "r2",
                                         "r2_to_fp32", "tail"]
    assert res.stats == {"casts": 2, "weights_converted": 3, "reduced_nodes": 8}
    assert all(log[n]["dtype"] == "bf16" for n in ("conv0", "r0", "mp", "conv1", "r1", "conv2", "tr", "r2"))
    for cast in _casts(g):          # never reduced -> cast -> reduced
        src = cast.inputs[0].producer
        assert not (src is not None and _reduced_compute(src)
                    and any(_reduced_compute(u) for u in cast.outputs[0].users)), str(cast)
    _assert_output_kept(g)


def test_casts_are_shared_one_per_value_and_type():
    g, x, conv_a = _graph()
    conv_b, conv_c = _conv(g, x, "conv_b"), _conv(g, x, "conv_c")
    s = g.add_node("Add", [conv_a.outputs[0], conv_b.outputs[0]], name="s")       # bf16
    c = conv_c.outputs[0]
    keeps = [g.add_node("Softmax", [c], attrs={"axis": -1}, name="sm"), g.add_node("Exp", [c], name="ex"),
             g.add_node("Sigmoid", [g.add_node("Sqrt", [c], name="sq").outputs[0]], name="sg")]
    t = g.add_node("Add", [keeps[0].outputs[0], keeps[1].outputs[0]], name="t")    # fp32
    w = g.add_node("Add", [s.outputs[0], t.outputs[0]], name="w")                  # mixed: fp32
    w2 = g.add_node("Mul", [w.outputs[0], s.outputs[0]], name="w2")                # s cast back again: shared
    _tail(g, g.add_node("Add", [w2.outputs[0], keeps[2].outputs[0]], name="w3").outputs[0])
    infer_graph(g)
    res, log = _run(g)
    casts = _casts(g)
    assert res.stats["casts"] == len(casts) == 3, [str(n) for n in casts]
    by_src = {n.inputs[0].name: n for n in casts}
    assert set(by_src) == {"x", "conv_c", "s"}
    assert [u.name for u in by_src["x"].outputs[0].users] == ["conv0", "conv_b", "conv_c"]
    assert sorted(u.name for u in by_src["conv_c"].outputs[0].users) == ["ex", "sm", "sq"]
    assert sorted(u.name for u in by_src["s"].outputs[0].users) == ["w", "w2"]
    assert [log[n]["dtype"] for n in ("s", "t", "w", "w2", "sg", "w3")] == ["bf16"] + ["fp32"] * 5
    assert log["sg"]["class"] == FOLLOW      # reads Sqrt's fp32 output: follows it
    _assert_output_kept(g)


def test_a_shared_weight_is_converted_once_and_the_fp32_one_removed():
    g, _x, conv0 = _graph()
    w = conv0.inputs[1]
    conv1 = _conv(g, conv0.outputs[0], "conv1", weight=w)
    _tail(g, conv1.outputs[0])
    infer_graph(g)
    res, _ = _run(g)
    assert res.stats["weights_converted"] == 1
    assert conv0.inputs[1] is conv1.inputs[1]
    new = conv0.inputs[1]
    assert new.dtype == BF and new.const.dtype == torch.bfloat16 and new.name == "conv0_w_bf16"
    assert torch.equal(new.const, w.const.to(torch.bfloat16))
    assert list(g.constants) == ["conv0_w_bf16"]          # the fp32 weight is gone


def test_a_weight_also_read_in_fp32_keeps_its_fp32_copy():
    g, _x, conv0 = _graph()
    w = conv0.inputs[1]
    head = _conv(g, conv0.outputs[0], "head", weight=w)          # the logits: fp32
    g.outputs.append(head.outputs[0])
    infer_graph(g)
    res, log = _run(g)
    assert log["head"]["why"] == pp.LOGITS_WHY and head.inputs[1] is w
    assert conv0.inputs[1].dtype == BF and res.stats["weights_converted"] == 1
    assert sorted(g.constants) == ["conv0_w", "conv0_w_bf16"]


def test_a_broadcast_constant_stays_stride_0():
    g, _x, conv = _graph()
    fill = torch.tensor([0.5]).expand(*SHAPE)
    assert fill.stride() == (0, 0, 0, 0)
    dense = _w(*SHAPE, seed=20)
    a = g.add_node("Add", [conv.outputs[0], g.add_constant("fill", fill)], name="a")
    m = g.add_node("Mul", [a.outputs[0], g.add_constant("dense", dense)], name="m")
    _tail(g, m.outputs[0])
    infer_graph(g)
    res, _ = _run(g)
    assert res.stats["weights_converted"] == 3
    cf, cd = a.inputs[1].const, m.inputs[1].const
    assert cf.dtype == torch.bfloat16 and tuple(cf.shape) == SHAPE and cf.stride() == (0, 0, 0, 0)
    assert torch.equal(cf, torch.full(SHAPE, 0.5, dtype=torch.bfloat16))
    assert cd.dtype == torch.bfloat16 and cd.is_contiguous() and torch.equal(cd, dense.to(torch.bfloat16))
    assert sorted(g.constants) == ["conv0_w_bf16", "dense_bf16", "fill_bf16"]


# ---------------------------------------------------------------- op_precision

def _three_convs():
    """x -> conv0 -> conv1 -> conv2 -> tail."""
    g, _x, conv0 = _graph()
    conv1 = _conv(g, conv0.outputs[0], "conv1")
    conv2 = _conv(g, conv1.outputs[0], "conv2")
    _tail(g, conv2.outputs[0])
    infer_graph(g)
    return g, (conv0, conv1, conv2)


def test_override_by_name_fp32_keeps_a_reduce_op_fp32():
    g, (c0, c1, c2) = _three_convs()
    res, log = _run(g, overrides=[("conv1", "fp32")])
    assert log["conv1"] == {"node": "conv1", "op": "Conv", "dtype": "fp32", "class": KEEP,
                            "why": "Config.op_precision: fp32", "code": R.OP_PRECISION}
    assert [c.outputs[0].dtype for c in (c0, c1, c2)] == [BF, FP, BF]
    assert c1.inputs[1].dtype == FP and c1.inputs[0].producer.op_type == "Cast"
    assert res.stats == {"casts": 4, "weights_converted": 2, "reduced_nodes": 2}
    assert [(n.inputs[0].dtype, n.outputs[0].dtype) for n in _casts(g)] == [(FP, BF), (BF, FP), (FP, BF), (BF, FP)]


def test_override_by_op_type():
    g, _, conv0 = _graph()
    sm = g.add_node("Softmax", [conv0.outputs[0]], attrs={"axis": -1}, name="sm")
    _tail(g, sm.outputs[0])
    infer_graph(g)
    res, log = _run(g, overrides=[("Softmax", "bf16")])
    assert (log["sm"]["dtype"], log["sm"]["class"], log["sm"]["why"]) == ("bf16", REDUCE, "Config.op_precision: bf16")
    assert sm.inputs[0] is conv0.outputs[0] and sm.outputs[0].dtype == BF
    assert res.stats["casts"] == 2


def test_a_name_beats_a_type():
    g, _ = _three_convs()
    _, log = _run(g, overrides=[("Conv", "fp32"), ("conv2", "bf16")])
    assert [log[n]["dtype"] for n in ("conv0", "conv1", "conv2")] == ["fp32", "fp32", "bf16"]


@pytest.mark.parametrize("key", ["orig_relu", "Relu"])
def test_override_by_a_node_fused_into_a_fused_node(key):
    g, _, conv0 = _graph()
    fused = g.add_node("FusedConv", [conv0.outputs[0], g.add_constant("fw", _w(4, 4, 3, 3, seed=5))],
                       attrs={"pads": [1, 1, 1, 1], "activation": "relu"}, domain=FG, name="fused")
    fused.meta["fused_from"], fused.meta["fused_types"] = ["orig_conv", "orig_relu"], ["Conv", "Relu"]
    _tail(g, fused.outputs[0])
    infer_graph(g)
    _, log = _run(g, overrides=[(key, "fp32")])
    assert (log["fused"]["dtype"], log["fused"]["why"]) == ("fp32", "Config.op_precision: fp32")
    assert fused.outputs[0].dtype == FP and fused.inputs[1].dtype == FP and log["conv0"]["dtype"] == "bf16"


def test_override_names_a_fused_away_node_through_compile():
    """Conv + Relu compile into one FusedConv; op_precision names the Relu node."""
    rng = np.random.default_rng(0)
    m = model([node("Conv", ["x", "w0"], "c0", pads=[1, 1, 1, 1], name="conv_a"),
               node("Relu", ["c0"], "r0", name="relu_a"),
               node("Conv", ["r0", "w1"], "c1", pads=[1, 1, 1, 1], name="conv_b"),
               node("Relu", ["c1"], "r1", name="relu_b"),
               node("LayerNormalization", ["r1", "g"], "y", axis=-1, name="ln")],
              [("x", TensorProto.FLOAT, list(SHAPE))], ["y"],
              [const("w0", rng.standard_normal((4, 4, 3, 3)) * 0.3), const("w1", rng.standard_normal((4, 4, 3, 3)) * 0.3),
               const("g", np.ones(6))])
    report = fg.compile(m, fg.Config(precision="bf16", op_precision={"relu_b": "fp32"})).report.precision
    rows = {r["node"]: r for r in report["nodes"] if r["op"] == "FusedConv"}
    assert len(rows) == 2, report["nodes"]
    dtypes = sorted((r["dtype"], r["why"]) for r in rows.values())
    assert dtypes == [("bf16", POLICY[(FG, "FusedConv")][1]), ("fp32", "Config.op_precision: fp32")]
    assert [k["why"] for k in report["kept_fp32"] if k["op"] == "FusedConv"] == ["Config.op_precision: fp32"]


@pytest.mark.parametrize("key, expect_fp32", [("conv_b", True), ("bn_b", True), ("Mul", False)])
def test_override_names_a_conv_whose_batchnorm_was_folded(key, expect_fp32):
    """Conv + BatchNormalization + Relu compile into one FusedConv through a BatchNorm fold
    (the norm becomes a Mul and an Add the conv absorbs, each making a new conv): the model's
    Conv is still named by it, and the compiler's own Mul is not the model's Mul (``scale``)."""
    rng = np.random.default_rng(0)
    c = SHAPE[1]
    bn = [const(n, v) for n, v in (("s", rng.uniform(0.5, 1.5, c)), ("b", rng.standard_normal(c)),
                                   ("mu", rng.standard_normal(c)), ("var", rng.uniform(0.5, 1.5, c)))]
    m = model([node("Conv", ["x", "w0"], "c0", pads=[1, 1, 1, 1], name="conv_a"),
               node("Relu", ["c0"], "r0", name="relu_a"),
               node("Conv", ["r0", "w1"], "c1", pads=[1, 1, 1, 1], name="conv_b"),
               node("BatchNormalization", ["c1", "s", "b", "mu", "var"], "n1", name="bn_b"),
               node("Relu", ["n1"], "r1", name="relu_b"),
               node("Mul", ["r1", "two"], "m1", name="scale"),
               node("LayerNormalization", ["m1", "g"], "y", axis=-1, name="ln")],
              [("x", TensorProto.FLOAT, list(SHAPE))], ["y"],
              [const("w0", rng.standard_normal((4, 4, 3, 3)) * 0.3), const("w1", rng.standard_normal((4, 4, 3, 3)) * 0.3),
               const("g", np.ones(6)), const("two", np.float32(2.0)), *bn])
    report = fg.compile(m, fg.Config(precision="bf16", op_precision={key: "fp32"})).report.precision
    rows = [r for r in report["nodes"] if r["op"] == "FusedConv"]
    assert len(rows) == 2, report["nodes"]
    assert [r["dtype"] for r in rows] == ["bf16", "fp32" if expect_fp32 else "bf16"]


def test_an_entry_naming_a_folded_node_is_reported_as_unmatched():
    """A product of two constants is folded at compile time: op_precision may name it (the
    model has it), the report says it changed nothing; the fused conv's name matched."""
    rng = np.random.default_rng(0)
    m = model([node("MatMul", ["a", "b"], "ab", name="const_mm"),
               node("Conv", ["x", "w0"], "c0", pads=[1, 1, 1, 1], name="conv_a"),
               node("Relu", ["c0"], "r0", name="relu_a"),
               node("Add", ["r0", "ab"], "s", name="add"),
               node("LayerNormalization", ["s", "g"], "y", axis=-1, name="ln")],
              [("x", TensorProto.FLOAT, list(SHAPE))], ["y"],
              [const("a", rng.standard_normal((6, 6))), const("b", rng.standard_normal((6, 6))),
               const("w0", rng.standard_normal((4, 4, 3, 3)) * 0.3), const("g", np.ones(6))])
    report = fg.compile(m, fg.Config(precision="bf16", op_precision={"const_mm": "fp32", "conv_a": "fp32"})).report
    assert report.precision["op_precision_unmatched"] == ["const_mm"]
    from fusegraph.cli.common import precision_line
    assert "op_precision entries that changed nothing (no run-time node): const_mm" in precision_line(report)
    assert fg.compile(m, fg.Config(precision="bf16")).report.precision["op_precision_unmatched"] == []


def test_fp16_override_alongside_bf16():
    g, (c0, c1, c2) = _three_convs()
    res, log = _run(g, overrides=[("conv1", "fp16")])
    assert [log[n]["dtype"] for n in ("conv0", "conv1", "conv2")] == ["bf16", "fp16", "bf16"]
    assert log["conv1"]["class"] == REDUCE and c1.inputs[1].dtype == H and c1.outputs[0].dtype == H
    casts = [(n.inputs[0].dtype, n.outputs[0].dtype) for n in _casts(g)]
    assert casts == [(FP, BF), (BF, H), (H, BF), (BF, FP)] and res.stats["casts"] == 4
    assert c1.inputs[0].producer.inputs[0] is c0.outputs[0] and c2.inputs[0].producer.inputs[0] is c1.outputs[0]
    assert res.stats["weights_converted"] == 3
    _assert_output_kept(g)


def test_a_follow_op_reading_bf16_and_fp16_computes_in_fp32():
    g, _, conv0 = _graph()
    conv1 = _conv(g, conv0.outputs[0], "conv1")
    add = g.add_node("Add", [conv0.outputs[0], conv1.outputs[0]], name="add")
    _tail(g, add.outputs[0])
    infer_graph(g)
    res, log = _run(g, overrides=[("conv1", "fp16")])
    assert log["add"]["dtype"] == "fp32" and add.outputs[0].dtype == FP
    assert [(v.producer.op_type, v.producer.inputs[0].dtype, v.dtype) for v in add.inputs] == \
        [("Cast", BF, FP), ("Cast", H, FP)]
    assert res.stats["casts"] == 4       # x -> bf16, conv0 -> fp16, and the two casts back


def test_fp32_policy_with_one_override_reduces_just_that_op():
    g, (c0, c1, c2) = _three_convs()
    res, log = _run(g, "fp32", overrides=[("conv1", "bf16")])
    assert [c.outputs[0].dtype for c in (c0, c1, c2)] == [FP, BF, FP]
    assert [(log[n]["dtype"], log[n]["why"]) for n in ("conv0", "conv2")] == [("fp32", "precision fp32")] * 2
    assert res.stats == {"casts": 2, "weights_converted": 1, "reduced_nodes": 1}
    assert [n.inputs[0].name for n in _casts(g)] == ["conv0", "conv1"]


# ---------------------------------------------------------------- the logits

def _cnn_head(through=None):
    """x -> conv0 -> Relu -> conv1 -> Flatten -> Gemm "head" [-> ``through``] -> output."""
    g, _x, conv0 = _graph()
    r = g.add_node("Relu", [conv0.outputs[0]], name="r")
    conv1 = _conv(g, r.outputs[0], "conv1")
    flat = g.add_node("Flatten", [conv1.outputs[0]], attrs={"axis": 1}, name="flat")
    head = g.add_node("Gemm", [flat.outputs[0], _c(g, "hw", _w(144, 10, seed=30))], name="head",
                      outputs=["logits" if through is None else "h"])
    out = head
    if through is not None:
        attrs = {"Softmax": {"axis": -1}, "LayerNorm": _LN}.get(through, {})
        out = g.add_node(through, [head.outputs[0]], name="after", outputs=["logits"], attrs=attrs,
                         domain=FG if through == "LayerNorm" else "")
    g.outputs.append(out.outputs[0])
    infer_graph(g)
    return g, head


@pytest.mark.parametrize("through", [None, "Softmax", "Relu"])
def test_the_last_heavy_op_before_an_output_stays_fp32(through):
    g, head = _cnn_head(through)
    res, log = _run(g)
    assert log["head"] == {"node": "head", "op": "Gemm", "dtype": "fp32", "class": KEEP, "why": pp.LOGITS_WHY,
                           "code": R.LOGITS_FP32}
    assert all(v.dtype == FP for v in head.inputs + head.outputs)
    assert [log[n]["dtype"] for n in ("conv0", "r", "conv1", "flat")] == ["bf16"] * 4
    assert [n.inputs[0].name for n in _casts(g)] == ["x", "flat"] and res.stats["casts"] == 2
    assert [(v.name, v.dtype) for v in g.outputs] == [("logits", FP)] and g.outputs[0].producer.op_type != "Cast"


def _linear_head(op="Linear", relu=False):
    """x -> conv0 -> Flatten -> fusegraph ``op`` "head" (a Linear, or a FusedConv 1x1) -> output."""
    g, _x, conv0 = _graph()
    flat = g.add_node("Flatten", [conv0.outputs[0]], attrs={"axis": 1}, name="flat")
    if op == "Linear":
        head = g.add_node("Linear", [flat.outputs[0], _c(g, "hw", _w(144, 10, seed=30))], name="head",
                          domain=FG, outputs=["logits"])
    else:
        head = g.add_node("FusedConv", [conv0.outputs[0], _c(g, "hw", _w(10, 4, 1, 1, seed=30))], name="head",
                          domain=FG, outputs=["logits"], attrs={"activation": "relu" if relu else ""})
    g.outputs.append(head.outputs[0])
    infer_graph(g)
    return g, head


@pytest.mark.parametrize("op", ["Linear", "FusedConv"])
def test_bf16_logits_of_a_product_read_bf16_and_write_fp32(op):
    g, head = _linear_head(op)
    w = head.inputs[1]
    res, log = _run(g)
    assert log["head"] == {"node": "head", "op": op, "dtype": "bf16", "class": REDUCE, "why": pp.LOGITS_OUT_WHY,
                           "code": R.LOGITS_FP32_OUTPUT}
    assert [v.dtype for v in head.inputs] == [BF, BF] and head.inputs[1].const.dtype == torch.bfloat16
    assert torch.equal(head.inputs[1].const, w.const.to(torch.bfloat16))
    assert head.attrs["out_dtype"] == int(FP) and head.outputs[0].dtype == FP
    assert [(v.name, v.dtype, v.producer) for v in g.outputs] == [("logits", FP, head)]   # no Cast after it
    assert [n.inputs[0].name for n in _casts(g)] == ["x"] and res.stats["casts"] == 1   # none around the head
    report = precision_summary(g, fg.Config(precision="bf16"), list(log.values()))
    assert report["fp32_logits"] == [{"node": "head", "op": op, "why": pp.LOGITS_OUT_WHY, "code": R.LOGITS_FP32_OUTPUT}]
    assert report["kept_fp32"] == [] and report["casts_folded"] == 0


def test_fp32_logits_keep_fp32_operands_when_asked_or_under_fp16():
    g, head = _linear_head()
    _, log = _run(g, overrides=[("head", "fp32")])
    assert (log["head"]["dtype"], "out_dtype" in head.attrs) == ("fp32", False)
    assert all(v.dtype == FP for v in head.inputs + head.outputs)
    g, head = _linear_head()
    _, log = _run(g, "fp16")      # the fp16 products do not write fp32: the logits stay fp32 throughout
    assert (log["head"]["dtype"], log["head"]["why"], "out_dtype" in head.attrs) == ("fp32", pp.LOGITS_WHY, False)


def test_a_residual_convolution_as_the_logits_stays_fp32():
    g, _x, conv0 = _graph()
    head = g.add_node("FusedConv", [conv0.outputs[0], _c(g, "hw", _w(4, 4, 1, 1, seed=30)), None,
                                    conv0.outputs[0]], name="head", domain=FG, outputs=["logits"])
    g.outputs.append(head.outputs[0])
    infer_graph(g)
    _, log = _run(g)
    assert (log["head"]["dtype"], log["head"]["why"]) == ("fp32", pp.LOGITS_WHY) and "out_dtype" not in head.attrs


def test_a_heavy_op_before_a_layernorm_is_reduced():
    g, _head = _cnn_head("LayerNorm")
    _, log = _run(g)
    assert (log["head"]["dtype"], log["head"]["why"]) == ("bf16", POLICY[("", "Gemm")][1])
    assert log["after"]["dtype"] == "fp32"


def test_op_precision_reduces_the_logits_and_the_output_keeps_its_name_and_type():
    g, head = _cnn_head()
    res, log = _run(g, overrides=[("head", "bf16")])
    assert (log["head"]["dtype"], log["head"]["why"]) == ("bf16", "Config.op_precision: bf16")
    assert head.outputs[0].dtype == BF and head.outputs[0].name != "logits"
    out = g.outputs[0]
    assert (out.name, out.dtype) == ("logits", FP) and out.producer.op_type == "Cast"
    assert out.producer.inputs[0] is head.outputs[0] and res.stats["casts"] == 2


def test_two_outputs_two_logits():
    g, _x, conv0 = _graph()
    for name in ("head_a", "head_b"):
        g.outputs.append(g.add_node("MatMul", [conv0.outputs[0], _c(g, f"{name}_w", _w(6, 3, seed=40))],
                                    name=name, outputs=[f"{name}_out"]).outputs[0])
    infer_graph(g)
    _, log = _run(g)
    assert [log[n]["why"] for n in ("head_a", "head_b")] == [pp.LOGITS_WHY] * 2
    assert log["conv0"]["dtype"] == "bf16"


def test_a_shape_reader_does_not_make_its_input_the_logits():
    g, _x, conv0 = _graph()
    _tail(g, conv0.outputs[0])
    g.outputs.append(g.add_node("Shape", [conv0.outputs[0]], name="shp", outputs=["s"]).outputs[0])
    infer_graph(g)
    _, log = _run(g)
    assert log["conv0"]["dtype"] == "bf16"


# ---------------------------------------------------------------- numerics, public API

def _he(rng, *shape):
    fan_in = int(np.prod(shape[1:])) if len(shape) > 2 else shape[0]
    return rng.standard_normal(shape) * np.sqrt(2.0 / fan_in)


def test_bf16_model_matches_onnxruntime_at_bf16_tolerance():
    rng = np.random.default_rng(7)
    nodes = [node("Conv", ["x", "w0", "b0"], "c0", pads=[1, 1, 1, 1]), node("Relu", ["c0"], "r0"),
             node("MaxPool", ["r0"], "p0", kernel_shape=[2, 2], strides=[2, 2]),
             node("Conv", ["p0", "w1", "b1"], "c1", pads=[1, 1, 1, 1]), node("Relu", ["c1"], "r1"),
             node("Conv", ["r1", "w2"], "c2", pads=[1, 1, 1, 1]), node("Add", ["c2", "p0"], "s2"),
             node("Relu", ["s2"], "r2"),
             node("GlobalAveragePool", ["r2"], "gap"), node("Flatten", ["gap"], "f"),
             node("Gemm", ["f", "wf", "bf"], "h", transB=1), node("Relu", ["h"], "hr"),
             node("Gemm", ["hr", "wl", "bl"], "logits", transB=1)]
    inits = [const("w0", _he(rng, 16, 3, 3, 3)), const("b0", rng.standard_normal(16) * 0.1),
             const("w1", _he(rng, 16, 16, 3, 3)), const("b1", rng.standard_normal(16) * 0.1),
             const("w2", _he(rng, 16, 16, 3, 3)),
             const("wf", _he(rng, 32, 16)), const("bf", rng.standard_normal(32) * 0.1),
             const("wl", _he(rng, 10, 32)), const("bl", rng.standard_normal(10) * 0.1)]
    m = model(nodes, [("x", TensorProto.FLOAT, [2, 3, 16, 16])], ["logits"], inits)
    feeds = {"x": rng.standard_normal((2, 3, 16, 16)).astype(np.float32)}
    compiled = fg.compile(m, fg.Config(precision="bf16"))
    got = compiled.run(feeds)["logits"]
    want = ort_run(m, feeds)["logits"]
    assert got.dtype == np.float32 and got.shape == want.shape == (2, 10)
    rel = float(np.linalg.norm(got - want) / np.linalg.norm(want))
    assert rel < 2e-2, rel
    assert rel > 1e-4, "nothing ran in bf16"   # fp32 gives ~2e-7: the check measures a reduced model
    prec = compiled.report.precision
    assert prec["by_dtype"].get("bf16", 0) >= 4, prec["nodes"]
    assert [k["why"] for k in prec["fp32_logits"]] == [pp.LOGITS_OUT_WHY]     # the last Gemm only
    assert prec["kept_fp32"] == []


def test_one_value_listed_twice_as_an_output_is_restored_once():
    g, _x, conv0 = _graph()
    _tail(g, conv0.outputs[0])
    r = g.add_node("Relu", [conv0.outputs[0]], name="r", outputs=["r"]).outputs[0]
    g.outputs += [r, r]
    infer_graph(g)
    res, _ = _run(g)
    casts = [n for n in g.nodes if n.op_type == "Cast"]
    assert res.stats["casts"] == len(casts) and all(n.outputs[0].uses or n.outputs[0].is_graph_output for n in casts)
    assert [v.name for v in g.outputs][-2:] == ["r", "r"] and g.outputs[-1].dtype == DType.FLOAT


def test_decisions_read_the_reason_code_not_the_text(monkeypatch):
    """Both logits texts made one: the pass still gives only the product that writes float32
    its ``out_dtype``; and a log whose texts were all reworded summarises the same."""
    import fusegraph.passes.precision as precision_pass
    monkeypatch.setattr(precision_pass, "LOGITS_OUT_WHY", pp.LOGITS_WHY)
    g, head = _linear_head("Linear")
    _, log = _run(g)
    assert head.attrs["out_dtype"] == int(FP) and log["head"]["code"] == R.LOGITS_FP32_OUTPUT
    assert log["head"]["why"] == pp.LOGITS_WHY
    report = precision_summary(g, fg.Config(precision="bf16"), list(log.values()))
    reworded = precision_summary(g, fg.Config(precision="bf16"), [{**r, "why": "?"} for r in log.values()])
    assert [k["node"] for k in report["fp32_logits"]] == [k["node"] for k in reworded["fp32_logits"]] == ["head"]
    assert report["kept_fp32"] == reworded["kept_fp32"] == []
    g, head = _linear_head("Linear")
    _, log = _run(g, overrides=[("head", "fp32")])
    reworded = precision_summary(g, fg.Config(precision="bf16"), [{**r, "why": "?"} for r in log.values()])
    assert [(k["node"], k["code"]) for k in reworded["kept_fp32"]] == [("head", R.OP_PRECISION)]


def test_every_decision_has_a_code():
    """Each per-node entry carries a code of ``Reason``; the policy's own and a body owner's
    among them."""
    g, _x, conv = _graph()
    _tail(g, conv.outputs[0])
    infer_graph(g)
    _, log = _run(g, "fp32")
    assert {r["code"] for r in log.values()} <= {c.value for c in pp.Reason}
    assert log["conv0"]["code"] == R.PRECISION_FP32 and log["tail"]["code"] == R.POLICY
