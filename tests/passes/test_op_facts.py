"""Op facts in the registry (``ops/registry.py``: data-movement class, precision class,
value-range transfer) drive their consumers: a new op registered with a movement class is
looked through by the rewrite engine's stand-in search and by the zoo's weight-role search,
followed by the precision pass and passed through by the bound analysis, without editing any
of them; an op registered with a precision class is classed so by the pass. And nothing
changed by accident when the lists moved into the registry: the policy table, the movement
lists and the elementwise chain's step table are compared with frozen copies of the old ones.
"""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from onnx import TensorProto, helper, numpy_helper

from fusegraph.ir import DType, Graph
from fusegraph.ops import Movement, Precision, infer_graph, lookup, movement_ops, register, registered_ops
from fusegraph.ops.common import same_as_input
from fusegraph.ops.fused_transformer import BINARY, UNARY
from fusegraph.ops.registry import unregister
from fusegraph.ops.value_range import UNKNOWN, Fact, chain_fact
from fusegraph.passes import precision_policy as pp
from fusegraph.passes.precision import PrecisionPass
from fusegraph.passes.rewrite import record_sources
from fusegraph.runtime.backends.cpu.finite import propagate
from fusegraph.runtime.backends.cpu.guard_plan import deep, shallow
from fusegraph.testing import zoo

FG = "fusegraph"
TEST_DOMAIN = "test.opfacts"
SHAPE = (1, 4, 6, 6)

# --------------------------------------------------------------------- frozen copies of the old lists

_MATMUL = "a product: the reduced-type GEMM accumulates in float32 and rounds the result once"
_CONV = "a convolution: the reduced-type kernel accumulates in float32 and rounds the result once"
_MOVE = "data movement: exact in any type"
_ELEMENTWISE = "one elementwise step: rounded once, as in float32 then cast"
_ACTIVATION = "an activation: torch computes it in float32 inside and rounds once"
OLD_POLICY = {    # passes/precision_policy.POLICY before the classes moved onto the ops
    (FG, "FusedConv"): ("reduce", _CONV), ("", "Conv"): ("reduce", _CONV), ("", "ConvTranspose"): ("reduce", _CONV),
    (FG, "LinearAct"): ("reduce", _MATMUL), (FG, "Linear"): ("reduce", _MATMUL),
    (FG, "BatchMatMul"): ("reduce", _MATMUL), ("", "MatMul"): ("reduce", _MATMUL), ("", "Gemm"): ("reduce", _MATMUL),
    (FG, "ScaledDotProductAttention"): (
        "reduce", "attention products in the reduced type; its softmax runs in float32 inside"),
    **{("", op): ("follow", _MOVE) for op in (
        "Reshape", "Flatten", "Squeeze", "Unsqueeze", "Transpose", "Identity", "Concat", "Split",
        "Slice", "Gather", "Expand", "Tile", "Pad", "DepthToSpace", "SpaceToDepth")},
    (FG, "ChannelShuffle"): ("follow", _MOVE),
    ("", "MaxPool"): ("follow", "a window maximum: exact in any type"),
    ("", "GlobalMaxPool"): ("follow", "a maximum: exact in any type"),
    ("", "AveragePool"): ("follow", "a small window mean: torch accumulates in float32 and rounds once"),
    **{("", op): ("follow", _ELEMENTWISE) for op in (
        "Add", "Sub", "Mul", "Div", "Neg", "Abs", "Relu", "LeakyRelu", "PRelu", "Clip", "Max", "Min", "Where")},
    **{("", op): ("follow", _ACTIVATION) for op in (
        "Sigmoid", "Tanh", "HardSigmoid", "HardSwish", "Gelu", "Elu", "Selu", "Softplus", "Mish", "Erf")},
    (FG, "Gelu"): ("follow", _ACTIVATION),
    (FG, "ElementwiseChain"): ("follow", "a fused elementwise chain: reads and writes the reduced type, computes "
                                         "every step in float32 with its float32 constants and rounds once (a "
                                         "chain with a KEEP step stays float32)"),
    ("", "Shape"): ("any", "reads only the shape"), ("", "Size"): ("any", "reads only the shape"),
    ("", "Softmax"): ("keep", "exponentials and a sum: float32"),
    ("", "LogSoftmax"): ("keep", "exponentials, a sum and a log: float32"),
    (FG, "MaskedSoftmax"): ("keep", "exponentials and a sum: float32"),
    (FG, "LayerNorm"): ("keep", "normalisation statistics (mean, variance): float32"),
    (FG, "SkipLayerNorm"): ("keep", "a residual sum and normalisation statistics: float32"),
    ("", "LayerNormalization"): ("keep", "normalisation statistics: float32"),
    ("", "BatchNormalization"): ("keep", "normalisation statistics: float32"),
    ("", "InstanceNormalization"): ("keep", "normalisation statistics: float32"),
    ("", "GroupNormalization"): ("keep", "normalisation statistics: float32"),
    ("", "LRN"): ("keep", "a windowed sum of squares and a power: float32"),
    **{("", op): ("keep", "a reduction: float32") for op in (
        "ReduceMean", "ReduceSum", "ReduceSumSquare", "ReduceL1", "ReduceL2", "ReduceLogSum",
        "ReduceLogSumExp", "ReduceProd", "ReduceMax", "ReduceMin", "CumSum")},
    (FG, "ScaledReduce"): ("keep", "a reduction: float32"),
    **{("", op): ("keep", "exp / log / pow / sqrt: float32") for op in ("Exp", "Log", "Pow", "Sqrt", "Reciprocal")},
}
OLD_CHAIN_KEEP_STEPS = {"Exp", "Log", "Pow", "Sqrt", "Reciprocal"}
OLD_REWRITE_MOVES = {"Reshape", "Transpose", "Flatten", "Squeeze", "Unsqueeze", "Identity", "Concat", "Split",
                     "Slice", "Gather", "Expand", "Cast"}
OLD_ZOO_PASS_THROUGH = {"Unsqueeze", "Reshape", "Squeeze", "Identity", "Flatten", "Transpose", "Cast"}
OLD_GUARD_SHALLOW = {("", "Concat"), ("", "Reshape"), ("", "Flatten"), ("", "Squeeze"), ("", "Unsqueeze"),
                     ("", "Identity")}
OLD_GUARD_DEEP = OLD_GUARD_SHALLOW | {(FG, "ElementwiseChain"), ("", "Cast"), ("", "Relu")}
OLD_FINITE_PASS_THROUGH = {"Reshape", "Flatten", "Squeeze", "Unsqueeze", "Identity", "Transpose", "ChannelShuffle",
                           "MaxPool", "AveragePool", "GlobalAveragePool", "GlobalMaxPool", "Slice", "Split", "Gather",
                           "Expand", "Dropout", "Tile", "Pad", "SpaceToDepth", "DepthToSpace"}


# classes changed since, each on purpose (GlobalAveragePool was KEEP: a bf16 image cast whole to
# float32 before its mean, the mean cast back before the next convolution; Resize and Upsample
# were unclassified, float32: SegFormer's decode head cast to float32 and back around each)
_INTERPOLATION = "an interpolation of a few pixels: computed in float32, rounded once"
CHANGED_POLICY = {
    ("", "GlobalAveragePool"): ("follow", "a mean over the plane: its kernels sum in float32 and round once, "
                                          "as AveragePool's"),
    ("", "Resize"): ("follow", _INTERPOLATION), ("", "Upsample"): ("follow", _INTERPOLATION),
}


@pytest.mark.parametrize("key", sorted({**OLD_POLICY, **CHANGED_POLICY}), ids=lambda k: f"{k[0] or 'onnx'}.{k[1]}")
def test_every_op_the_old_policy_named_keeps_its_class_and_reason_or_its_changed_one(key):
    got = pp.classify(*key)
    assert (got.cls, got.why) == {**OLD_POLICY, **CHANGED_POLICY}[key]
    assert got.code == (pp.Reason.MOVEMENT if got.why == _MOVE else pp.Reason.POLICY)


# ops registered since (issue 40's fused decoder, conv-net norm and movement ops), with their classes
NEW_POLICY = {
    (FG, "RMSNorm"): ("keep", "normalisation statistics (mean square): float32"),
    (FG, "SkipRMSNorm"): ("keep", "a residual sum and normalisation statistics: float32"),
    (FG, "RotaryEmbedding"): ("follow", "a rotation by float32 cos / sin tables: float32 inside, rounded once"),
    (FG, "GatedActivation"): ("follow", "an activation times the up projection: float32 inside, rounded once"),
    (FG, "GatedLinear"): ("reduce", "two products and their gating: the reduced-type GEMMs accumulate in float32, "
                                    "the gating is float32, the result rounded once"),
    (FG, "ChannelLayerNorm"): ("keep", "normalisation statistics: float32"),
    (FG, "GroupNorm"): ("keep", "normalisation statistics: float32"),
    (FG, "Roll"): ("follow", _MOVE),
    # the recurrent layers, reduced since the eleventh session's bf16 cells
    **{key: ("reduce", "a recurrent layer: its products read the reduced type (oneDNN's round the hidden state "
                       "to it at each step, as their input) and accumulate in float32; the gates and the cell "
                       "state in float32") for key in (("", "RNN"), ("", "GRU"), ("", "LSTM"), (FG, "LSTM"))},
}


def test_no_other_registered_op_gained_a_class():
    assert pp.policy() == {k: (Precision(c), w) for k, (c, w) in {**OLD_POLICY, **CHANGED_POLICY, **NEW_POLICY}.items()}


def test_every_opset_of_an_op_has_the_same_classes():
    """Consumers without a version (the precision policy, the movement queries) read the
    newest registration: every registration of an op must agree on its classes."""
    by_op: dict = {}
    for domain, op, since in registered_ops():
        d = lookup(domain, op, since)
        by_op.setdefault((domain, op), set()).add((d.movement, d.precision, d.precision_why))
    assert {k: v for k, v in by_op.items() if len(v) > 1} == {}


def test_the_chain_steps_that_keep_a_chain_fp32_are_the_old_ones():
    keeping = {op for op in {**UNARY, **BINARY} if pp.classify(FG, "ElementwiseChain", [f"{op} p"]).cls == pp.KEEP}
    assert keeping == OLD_CHAIN_KEEP_STEPS
    assert pp.classify(FG, "ElementwiseChain", ["Mul i0 i1", "Pow p i1"]).code == pp.Reason.CHAIN_KEEP_STEP
    assert pp.classify(FG, "ElementwiseChain", ["Mul i0 i1", "Div p i1"]).code == pp.Reason.POLICY
    assert pp.classify(FG, "ElementwiseChain", ["Bogus p"]).cls == pp.FOLLOW     # an unknown step keeps nothing


def test_each_consumer_derives_its_movement_list_from_the_registry():
    """The derived sets against the old lists: the precision policy's and the guard plan's are
    the same; the rewrite engine now also looks through the copies it did not list (Tile, Pad
    and the channel rearrangements: a rewrite that emits one no longer takes it for its
    computing node), the zoo through the channel rearrangements (they keep every value); Roll
    (issue 40's windowed attention) is a permutation of its input."""
    onnx_ops = {op for d, op in movement_ops()}
    assert {k for k, (c, w) in {**OLD_POLICY, **CHANGED_POLICY, **NEW_POLICY}.items() if w == _MOVE} == \
        movement_ops(*pp.FOLLOWING_MOVES)
    assert shallow() == OLD_GUARD_SHALLOW and deep() == OLD_GUARD_DEEP
    assert onnx_ops == OLD_REWRITE_MOVES | {"Tile", "Pad", "DepthToSpace", "SpaceToDepth", "ChannelShuffle", "Roll"}
    assert {op for d, op in movement_ops(*zoo.LOOK_THROUGH)} == \
        OLD_ZOO_PASS_THROUGH | {"DepthToSpace", "SpaceToDepth", "ChannelShuffle", "Roll"}


@pytest.mark.parametrize("op", sorted(OLD_FINITE_PASS_THROUGH | {"Cast"}))
def test_the_old_pass_through_ops_still_pass_their_input_bound(op):
    """Every op the bound analysis passed through still does, by its own or its movement
    class's transfer (Pad: also its fill, 0 here; Dropout: in inference)."""
    domain = FG if op == "ChannelShuffle" else ""
    g = Graph("g", opset={"": 18, FG: 1})
    x = g.add_input("x", DType.FLOAT, SHAPE)
    extra = {"Pad": [g.add_constant("pads", torch.zeros(8, dtype=torch.int64))]}.get(op, [])
    n = g.add_node(op, [x, *extra], domain=domain, name="op", attrs={"to": int(DType.FLOAT)} if op == "Cast" else {})
    for o in n.outputs:
        o.dtype = DType.FLOAT
    facts = propagate(g, 7.0)
    assert all(facts[id(o)] == Fact(7.0) for o in n.outputs)


def test_the_chain_steps_are_bounded_as_before():
    """The elementwise chain's step table (once ``finite._chain``), now each step op's own
    registered law: the same fact for every step the chain kernel knows."""
    a, b = Fact(2.0), Fact(3.0, nan=True)
    old = {"Relu": a, "Neg": a, "Abs": a, "Sigmoid": Fact(1.0), "Tanh": Fact(1.0), "Erf": Fact(1.0),
           "Add": Fact(5.0, True), "Sub": Fact(5.0, True), "Mul": Fact(6.0, True), "Max": Fact(3.0, True),
           "Min": Fact(3.0, True)}
    for op in {**UNARY, **BINARY}:
        steps = [f"{op} i0 i1"] if op in BINARY else [f"{op} i0"]
        assert chain_fact(steps, [a, b]) == old.get(op, UNKNOWN), op


# --------------------------------------------------------------------- a new op, registered with facts

@pytest.fixture
def new_ops():
    """Two test ops: ``Shuffled`` (data movement, PERMUTE) and ``Careful`` (KEEP with a reason
    of its own), each with an identity kernel; removed again afterwards."""
    register("Shuffled", domain=TEST_DOMAIN, since=1, infer=same_as_input(0), movement=Movement.PERMUTE)(
        lambda ctx: lambda x: x)
    register("Careful", domain=TEST_DOMAIN, since=1, infer=same_as_input(0),
             precision=(Precision.KEEP, "a test op that wants float32"))(lambda ctx: lambda x: x)
    yield
    unregister("Shuffled", domain=TEST_DOMAIN, since=1)
    unregister("Careful", domain=TEST_DOMAIN, since=1)
    assert (TEST_DOMAIN, "Shuffled") not in movement_ops()


def test_the_rewrite_engine_looks_through_a_new_movement_op_to_the_computing_node(new_ops):
    """A rewrite replaced "mm" by a Relu and a data movement after it: the model's node name
    goes on the Relu (the computing node), looked through the new op, not on the movement."""
    def rewritten(mover_domain):
        g = Graph("g", opset={"": 18})
        x = g.add_input("x", DType.FLOAT, SHAPE)
        mm = g.add_node("Relu", [x], name="mm")
        comp = g.add_node("Relu", [x], name="comp")
        mover = g.add_node("Shuffled", [comp.outputs[0]], domain=mover_domain, name="mover")
        for n in (comp, mover):
            n.meta["rule"] = "test"
        record_sources([mover.outputs[0]], [mm], [], [comp, mover])
        return comp.meta.get("fused_from"), mover.meta.get("fused_from")
    assert rewritten(TEST_DOMAIN) == (["mm"], None)
    assert rewritten("test.unregistered") == (None, ["mm"])      # an op the registry does not know computes


def _weight_through(op_domain):
    """x -> Conv(w') where w' = op(w): the weight's role is read through the op."""
    w = np.zeros((16, 2, 1, 1), np.float32)
    nodes = [helper.make_node("Shuffled", ["w"], ["w2"], domain=op_domain),
             helper.make_node("Conv", ["x", "w2"], ["y"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2, 4, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              [numpy_helper.from_array(w, "w")])
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(op_domain, 1)])
    out = zoo.randomize_weights(m, seed=0, calibrate=False)
    return float(np.std(numpy_helper.to_array(next(t for t in out.graph.initializer if t.name == "w"))))


def test_the_zoo_reads_a_weight_role_through_a_new_movement_op(new_ops):
    """He-scaled as a convolution weight (fan-in 2: std 1) through the movement op; through an
    op the registry does not know, a plain small tensor (std 0.1)."""
    assert _weight_through(TEST_DOMAIN) == pytest.approx(1.0, rel=0.3)
    assert _weight_through("test.unregistered") == pytest.approx(0.1, rel=0.3)


def _precision_graph(op, domain):
    g = Graph("g", opset={"": 18, FG: 1, TEST_DOMAIN: 1})
    x = g.add_input("x", DType.FLOAT, SHAPE)
    conv = g.add_node("Conv", [x, g.add_constant("w", torch.randn(4, 4, 3, 3) * 0.3)], attrs={"pads": [1] * 4},
                      name="conv0")
    mid = g.add_node(op, [conv.outputs[0]], domain=domain, name="op")
    tail = g.add_node("LayerNorm", [mid.outputs[0]], attrs={"epsilon": 1e-5}, domain=FG, name="tail")
    g.outputs.append(tail.outputs[0])
    infer_graph(g)
    log = []
    PrecisionPass("bf16", (), log).run(g)
    return {r["node"]: r for r in log}, mid


def test_the_precision_pass_reads_a_new_op_class_from_the_registry(new_ops):
    log, mid = _precision_graph("Shuffled", TEST_DOMAIN)
    assert (log["op"]["dtype"], log["op"]["class"], log["op"]["why"], log["op"]["code"]) == \
        ("bf16", "follow", pp.MOVE_WHY, "movement")
    assert mid.outputs[0].dtype == DType.BFLOAT16
    log, mid = _precision_graph("Careful", TEST_DOMAIN)
    assert (log["op"]["dtype"], log["op"]["class"], log["op"]["why"], log["op"]["code"]) == \
        ("fp32", "keep", "a test op that wants float32", "policy")
    assert mid.inputs[0].producer.op_type == "Cast" and mid.outputs[0].dtype == DType.FLOAT


def test_the_bound_analysis_passes_a_new_movement_op(new_ops):
    g = Graph("g", opset={"": 18, TEST_DOMAIN: 1})
    x = g.add_input("x", DType.FLOAT, SHAPE)
    moved = g.add_node("Shuffled", [x], domain=TEST_DOMAIN, name="moved").outputs[0]
    kept = g.add_node("Careful", [x], domain=TEST_DOMAIN, name="kept").outputs[0]
    for v in (moved, kept):
        v.dtype = DType.FLOAT
    facts = propagate(g, 3.0)
    assert facts[id(moved)] == Fact(3.0)
    assert math.isinf(facts[id(kept)].bound) and facts[id(kept)].nan     # no transfer: unknown


def test_a_precision_class_needs_its_reason():
    with pytest.raises(TypeError, match="precision must be"):
        register("Unexplained", domain=TEST_DOMAIN, precision=(Precision.KEEP, ""))
