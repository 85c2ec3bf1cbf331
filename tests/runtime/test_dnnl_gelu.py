"""A standalone GELU (ONNX's ``Gelu``; fusegraph's without a bias) runs oneDNN's eltwise
primitive as the fast form of a guarded node (``dnnl/eltwise.py``, ``guard_plan.py``): within
float32 rounding of onnxruntime ORT_DISABLE_ALL while the run's inputs are finite, and the op's
own kernel, NaN and infinities where onnxruntime puts them, when they are not."""
import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import fusegraph as fg
from fusegraph.runtime.backends.cpu.dnnl import available
from cpu_isa import BF16_ARITHMETIC
from oracle import ort_run

pytestmark = pytest.mark.skipif(not available(), reason="oneDNN does not load here")


def _gelu_model(approximate: str) -> onnx.ModelProto:
    g = helper.make_graph([helper.make_node("Gelu", ["x"], ["y"], approximate=approximate)], "gelu",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 64, 96])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 64, 96])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 20)])
    m.ir_version = 9
    return m


def _gelu_call(cm):
    (call,) = [c for c in cm._executor.binding.calls if c.node.op_type == "Gelu"]
    return call.kernel


@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_standalone_gelu_runs_onednn_while_inputs_are_finite(approximate):
    m = _gelu_model(approximate)
    cm = fg.compile(m, fg.Config(threads=2))
    kernel = _gelu_call(cm)
    assert type(kernel).__name__ == "Guarded" and kernel.limit >= 1e32     # every input a run could hold but huge ones
    assert kernel.fast.impl.startswith("jit"), kernel.fast.impl
    x = (np.random.default_rng(0).standard_normal((2, 64, 96)) * 4).astype(np.float32)
    got = cm.run({"x": x})["y"]
    want = ort_run(m, {"x": x})["y"]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("approximate", ["none", "tanh"])
@pytest.mark.parametrize("special", [np.nan, np.inf, -np.inf])
def test_standalone_gelu_of_a_non_finite_input_is_the_ops_own(approximate, special):
    m = _gelu_model(approximate)
    cm = fg.compile(m, fg.Config(threads=2))
    x = np.random.default_rng(1).standard_normal((2, 64, 96)).astype(np.float32)
    x.reshape(-1)[::97] = special
    got = cm.run({"x": x})["y"]
    own = fg.compile(m, fg.Config(threads=2, cpu_kernels="portable")).run({"x": x})["y"]
    assert np.array_equal(got, own, equal_nan=True)
    want = ort_run(m, {"x": x})["y"]
    assert np.array_equal(np.isnan(got), np.isnan(want)) and np.array_equal(np.isinf(got), np.isinf(want))
    finite = np.isfinite(want)
    np.testing.assert_allclose(got[finite], want[finite], rtol=1e-4, atol=1e-6)


def _bf16_gelu_model() -> onnx.ModelProto:
    """MatMul, GELU, MatMul: under bf16 the GELU between the products follows their bfloat16."""
    rng = np.random.default_rng(2)
    w1 = helper.make_tensor("w1", TensorProto.FLOAT, [96, 128], (rng.standard_normal((96, 128)) * 0.15).ravel())
    w2 = helper.make_tensor("w2", TensorProto.FLOAT, [128, 64], (rng.standard_normal((128, 64)) * 0.12).ravel())
    g = helper.make_graph([helper.make_node("MatMul", ["x", "w1"], ["h"]), helper.make_node("Gelu", ["h"], ["a"]),
                           helper.make_node("MatMul", ["a", "w2"], ["y"])], "bf16_gelu",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 64, 96])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 64, 64])], [w1, w2])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 20)])
    m.ir_version = 9
    return m


def test_a_bfloat16_gelu_runs_onednn_while_inputs_are_finite():
    """Under bf16 a GELU between two products is guarded too: oneDNN's bf16 eltwise where this
    CPU has bf16 arithmetic (the op's own kernel otherwise), within bf16's error of the fp32 oracle, and
    the op's own kernel's numbers (its float32 arithmetic inside, rounded once) to bf16's
    rounding of a value; NaN where onnxruntime has it."""
    m = _bf16_gelu_model()
    cm = fg.compile(m, fg.Config(threads=2, precision="bf16"))
    kernel = _gelu_call(cm)
    assert [c.node.inputs[0].dtype.name for c in cm._executor.binding.calls
            if c.node.op_type == "Gelu"] == ["BFLOAT16"]
    if BF16_ARITHMETIC:          # else oneDNN has no bf16 eltwise kernel here: the op's own kernel alone
        assert type(kernel).__name__ == "Guarded" and kernel.fast.impl.startswith("jit"), kernel
    x = np.random.default_rng(3).standard_normal((2, 64, 96)).astype(np.float32)
    got = cm.run({"x": x})["y"]
    want = ort_run(m, {"x": x})["y"]
    assert np.linalg.norm(got - want) / np.linalg.norm(want) < 1e-2
    own = fg.compile(m, fg.Config(threads=2, precision="bf16", cpu_kernels="portable")).run({"x": x})["y"]
    assert np.linalg.norm(got - own) / np.linalg.norm(own) < 1e-2
    x.reshape(-1)[::101] = np.nan
    got = cm.run({"x": x})["y"]
    assert np.array_equal(np.isnan(got), np.isnan(ort_run(m, {"x": x})["y"]))
