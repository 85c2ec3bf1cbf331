"""A per-channel constant Mul / Add after a Conv folds into its weights (so Conv+BN is one Conv)."""
import numpy as np
import pytest

from passes_util import F, check, const, model, node, ops

C_IN, C_OUT = 3, 4


def _conv(after, inits_after, bias=True, group=1):
    rng = np.random.default_rng(0)
    w = rng.normal(0, 0.5, (C_OUT, C_IN // group, 3, 3))
    inits = [const("w", w)] + ([const("b", rng.normal(0, 0.1, C_OUT))] if bias else []) + list(inits_after)
    conv = node("Conv", ["x", "w", "b"] if bias else ["x", "w"], "c", pads=[1, 1, 1, 1], group=group)
    return model([conv] + after + [node("Relu", ["t"], "y")],
                 [("x", F, [1, C_IN if group == 1 else C_IN, 5, 5])], ["y"], inits)


def _bn_inits():
    rng = np.random.default_rng(1)
    return [const("s", rng.uniform(0.5, 1.5, C_OUT)), const("bb", rng.normal(0, 1, C_OUT)),
            const("mu", rng.normal(0, 1, C_OUT)), const("var", rng.uniform(0.5, 2, C_OUT))]


@pytest.mark.parametrize("bias", [True, False])
def test_conv_batchnorm_becomes_one_conv(bias):
    m = _conv([node("BatchNormalization", ["c", "s", "bb", "mu", "var"], "t")], _bn_inits(), bias)
    compiled = check(m, level="O1", oracle="ort")
    assert ops(compiled) == ["Conv", "Relu"]


@pytest.mark.parametrize("shape", [(C_OUT, 1, 1), (1, C_OUT, 1, 1), (), (1,)])
def test_per_channel_mul_and_add_fold(shape):
    rng = np.random.default_rng(2)
    m = _conv([node("Mul", ["k", "c"], "m"), node("Add", ["m", "a"], "t")],
              [const("k", rng.uniform(0.5, 2, shape)), const("a", rng.normal(0, 1, shape))])
    assert ops(check(m, level="O1")) == ["Conv", "Relu"]


def test_spatially_varying_constant_is_kept():
    m = _conv([node("Mul", ["c", "k"], "t")], [const("k", np.linspace(0.5, 2, 25).reshape(1, 1, 5, 5))])
    assert ops(check(m, level="O1")) == ["Conv", "Mul", "Relu"]


def test_conv_output_with_two_users_is_kept():
    m = model([node("Conv", ["x", "w"], "c"), node("Mul", ["c", "k"], "m"), node("Add", ["c", "m"], "y")],
              [("x", F, [1, 2, 4, 4])], ["y"],
              [const("w", np.ones((2, 2, 1, 1)) * 0.3), const("k", np.array([2.0, 3.0]).reshape(2, 1, 1))])
    assert ops(check(m, level="O1")) == ["Conv", "Mul", "Add"]
