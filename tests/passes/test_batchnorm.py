"""Inference BatchNormalization becomes Mul + Add (checked against onnxruntime: the reference
evaluator applies training momentum to BatchNormalization-9)."""
import numpy as np
import pytest

from passes_util import F, check, const, model, node, ops


def _bn_model(opset, rank=4, const_mean=True):
    rng = np.random.default_rng(0)
    c = 3
    inits = [const("scale", rng.uniform(0.5, 1.5, c)), const("bias", rng.normal(0, 1, c)),
             const("var", rng.uniform(0.5, 2, c))]
    inputs = [("x", F, [2, c] + [4] * (rank - 2))]
    if const_mean:
        inits.append(const("mean", rng.normal(0, 1, c)))
    else:
        inputs.append(("mean", F, [c]))
    nodes = [node("BatchNormalization", ["x", "scale", "bias", "mean", "var"], "b", epsilon=1e-3),
             node("Relu", ["b"], "y")]
    return model(nodes, inputs, ["y"], inits, opset)


@pytest.mark.parametrize("opset, rank", [(9, 4), (15, 4), (15, 2), (15, 3)])
def test_batchnorm_becomes_mul_add(opset, rank):
    compiled = check(_bn_model(opset, rank), level="O1", oracle="ort")
    assert ops(compiled) == ["Mul", "Add", "Relu"]
    assert compiled.graph.nodes[0].meta["rule"] == "batchnorm_to_affine"
    assert tuple(compiled.graph.nodes[0].inputs[1].shape) == (3,) + (1,) * (rank - 2)


def test_batchnorm_with_runtime_statistics_is_kept():
    compiled = check(_bn_model(15, const_mean=False), level="O1", oracle="ort")
    assert ops(compiled) == ["BatchNormalization", "Relu"]
    (rec,) = [p for p in compiled.report.passes if p.name == "batchnorm_to_affine" and "declined" in p.stats][:1]
    assert rec.stats["declined"] == {"batchnorm_to_affine": 1}
