"""Loading an ONNX file without a second copy of its weights (frontends/onnx_weights.py): large
inline initializers are read straight from the file into their tensors, bit for bit what
onnx's own reader gives; unusual files fall back to the ordinary parse; a fresh process that
imports a model holds about one copy of its weights at the peak."""
import os
import subprocess
import sys

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import fusegraph as fg
from fusegraph.errors import ModelLoadError
from fusegraph.frontends.onnx import import_onnx
from fusegraph.frontends.onnx_weights import parse_without_weights

BIG = 1 << 16


def _identity_model(arrays: dict, extra_inits=()) -> onnx.ModelProto:
    inits = [numpy_helper.from_array(a, n) for n, a in arrays.items()] + list(extra_inits)
    nodes = [helper.make_node("Identity", [t.name], [f"{t.name}_out"]) for t in inits]
    outs = [helper.make_tensor_value_info(f"{t.name}_out", t.data_type, list(t.dims)) for t in inits]
    g = helper.make_graph(nodes, "weights", [], outs, initializer=inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def _arrays(rng):
    return {
        "f32": rng.standard_normal((64, 300)).astype(np.float32),
        "f16": rng.standard_normal((70000,)).astype(np.float16),
        "f64": rng.standard_normal((3, 5000)).astype(np.float64),
        "i64": rng.integers(-2**40, 2**40, (9000,), dtype=np.int64),
        "u8": rng.integers(0, 255, (2, 40000), dtype=np.uint8),
        "b": rng.random((BIG + 7,)) < 0.5,
        "c64": (rng.standard_normal(9000) + 1j * rng.standard_normal(9000)).astype(np.complex64),
        "small": rng.standard_normal((4, 4)).astype(np.float32),
    }


def test_large_initializers_are_read_from_the_file_bit_for_bit(tmp_path):
    arrays = _arrays(np.random.default_rng(0))
    path = tmp_path / "m.onnx"
    onnx.save(_identity_model(arrays), str(path))
    light = onnx.ModelProto.FromString(parse_without_weights(path))
    moved = {t.name for t in light.graph.initializer if t.data_location == TensorProto.EXTERNAL}
    assert moved == {n for n, a in arrays.items() if a.nbytes >= BIG}
    assert len(light.SerializeToString()) < 4096
    graph = import_onnx(str(path))
    for name, want in arrays.items():
        got = graph.constants[name].const.numpy()
        assert got.dtype == want.dtype and got.shape == want.shape
        np.testing.assert_array_equal(got, want)
        assert got.flags.writeable


def test_a_compiled_model_runs_on_weights_read_from_the_file(tmp_path):
    w = np.random.default_rng(1).standard_normal((128, 256)).astype(np.float32)
    g = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "mm",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 128])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 256])],
                          initializer=[numpy_helper.from_array(w, "w")])
    path = tmp_path / "mm.onnx"
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    x = np.random.default_rng(2).standard_normal((2, 128)).astype(np.float32)
    np.testing.assert_allclose(fg.compile(str(path)).run({"x": x})["y"], x @ w, rtol=1e-4, atol=1e-4)


def test_unusual_files_fall_back_to_the_ordinary_parse(tmp_path):
    arrays = {"f32": np.ones((BIG,), np.float32)}
    path = tmp_path / "m.onnx"
    onnx.save(_identity_model(arrays), str(path))
    data = path.read_bytes()
    cut = tmp_path / "cut.onnx"
    cut.write_bytes(data[: len(data) // 2])
    assert parse_without_weights(cut) is None
    with pytest.raises(ModelLoadError):
        fg.compile(str(cut))
    link = tmp_path / "link.onnx"
    os.symlink(path, link)
    assert parse_without_weights(link) is None
    np.testing.assert_array_equal(import_onnx(str(link)).constants["f32"].const.numpy(), arrays["f32"])
    small = tmp_path / "small.onnx"
    onnx.save(_identity_model({"s": np.ones((8,), np.float32)}), str(small))
    assert parse_without_weights(small) is None  # nothing worth moving


def test_packed_sub_byte_types_stay_inline(tmp_path):
    """INT4 packs two elements per byte: never read through the byte-per-element path."""
    vals = np.resize(np.arange(-8, 8, dtype=np.int8), 2 * BIG + 2)
    int4 = helper.make_tensor("q", TensorProto.INT4, [vals.size], vals.tolist())
    path = tmp_path / "q.onnx"
    onnx.save(_identity_model({"f": np.ones((BIG,), np.float32)}, extra_inits=[int4]), str(path))
    light = onnx.ModelProto.FromString(parse_without_weights(path))
    kept = {t.name: t.data_location for t in light.graph.initializer}
    assert kept == {"f": TensorProto.EXTERNAL, "q": TensorProto.DEFAULT}


def test_declared_size_mismatch_is_refused(tmp_path):
    t = numpy_helper.from_array(np.ones((BIG,), np.float32), "w")
    t.dims[0] = BIG + 1
    path = tmp_path / "bad.onnx"
    path.write_bytes(_identity_model({}, extra_inits=[t]).SerializeToString())
    with pytest.raises(ModelLoadError, match="declares"):
        import_onnx(str(path))


_CHILD = """
import sys
import fusegraph
from fusegraph.frontends.onnx import import_onnx


def peak():  # VmHWM starts afresh at exec (ru_maxrss would carry the parent's peak over)
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmHWM"))


before = peak()
g = import_onnx(sys.argv[1])
print((peak() - before) * 1024)
"""


@pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="reads VmHWM from /proc")
def test_importing_holds_about_one_copy_of_the_weights(tmp_path):
    arrays = {f"w{i}": np.full((4 << 20,), i, np.float32) for i in range(6)}  # 6 x 16 MiB
    path = tmp_path / "big.onnx"
    onnx.save(_identity_model(arrays), str(path))
    weights = sum(a.nbytes for a in arrays.values())
    out = subprocess.run([sys.executable, "-c", _CHILD, str(path)], capture_output=True, text=True, check=True)
    grew = int(out.stdout.split()[-1])
    assert grew < 1.3 * weights, f"import grew the peak RSS by {grew / weights:.2f}x the weight bytes"
