"""ONNX frontend: hostile and malformed files, external data confinement, IR < 4 models,
unsupported ops refused at compile time."""
import os

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import fusegraph as fg
from fusegraph.errors import ModelLoadError, UnsupportedOpError


def _model(nodes, inputs, outputs, inits=(), opset=17, ir_version=None):
    g = helper.make_graph(nodes, "m", inputs, outputs, initializer=list(inits))
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    if ir_version is not None:
        m.ir_version = ir_version
    return m


def _vi(name, shape, t=TensorProto.FLOAT):
    return helper.make_tensor_value_info(name, t, shape)


def _add_model_with_weight(weight):
    return _model([helper.make_node("Add", ["x", "w"], ["y"])], [_vi("x", [4])], [_vi("y", [4])],
                  inits=[numpy_helper.from_array(weight, "w")])


def test_garbage_and_truncated_files(tmp_path):
    junk = tmp_path / "junk.onnx"
    junk.write_bytes(os.urandom(2048))
    with pytest.raises(ModelLoadError, match="junk.onnx"):
        fg.compile(str(junk))
    good = _add_model_with_weight(np.arange(4, dtype=np.float32)).SerializeToString()
    cut = tmp_path / "cut.onnx"
    cut.write_bytes(good[: len(good) // 2])
    with pytest.raises(ModelLoadError):
        fg.compile(str(cut))
    with pytest.raises(ModelLoadError, match="does not exist"):
        fg.compile(str(tmp_path / "missing.onnx"))
    with pytest.raises(ModelLoadError):
        fg.compile(b"")


def _external(tmp_path, location, data=None, length=None):
    w = np.arange(4, dtype=np.float32)
    m = _add_model_with_weight(w)
    t = m.graph.initializer[0]
    t.ClearField("raw_data")
    t.data_location = TensorProto.EXTERNAL
    entries = {"location": location}
    if length is not None:
        entries["length"] = str(length)
    for k, v in entries.items():
        e = t.external_data.add()
        e.key, e.value = k, v
    folder = tmp_path / "model"
    folder.mkdir(exist_ok=True)
    if data is not None:
        target = folder / location
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)
    path = folder / "m.onnx"
    path.write_bytes(m.SerializeToString())
    return path, w


def test_external_data_inside_the_folder_loads(tmp_path):
    w = np.arange(4, dtype=np.float32)
    path, _ = _external(tmp_path, "weights/w.bin", data=w.tobytes())
    out = fg.compile(str(path)).run({"x": np.ones(4, np.float32)})["y"]
    np.testing.assert_array_equal(out, w + 1)


@pytest.mark.parametrize("location, words", [
    ("/etc/passwd", "absolute"),
    ("../outside.bin", "'..'"),
    ("sub/../../outside.bin", "'..'"),
])
def test_external_data_escapes_are_refused(tmp_path, location, words):
    (tmp_path / "outside.bin").write_bytes(b"\0" * 16)
    path, _ = _external(tmp_path, location)
    with pytest.raises(ModelLoadError, match=words):
        fg.compile(str(path))


def test_external_data_symlink_out_is_refused(tmp_path):
    secret = tmp_path / "secret.bin"
    secret.write_bytes(b"\0" * 16)
    path, _ = _external(tmp_path, "link.bin")
    os.symlink(secret, tmp_path / "model" / "link.bin")
    with pytest.raises(ModelLoadError, match="outside the model's folder"):
        fg.compile(str(path))


def test_external_data_size_mismatch_is_refused(tmp_path):
    path, _ = _external(tmp_path, "w.bin", data=b"\0" * 8)
    with pytest.raises(ModelLoadError, match="declares 16 bytes"):
        fg.compile(str(path))


def test_external_data_without_a_folder_is_refused(tmp_path):
    path, _ = _external(tmp_path, "w.bin", data=b"\0" * 16)
    with pytest.raises(ModelLoadError, match="load it by path"):
        fg.compile(onnx.load(str(path), load_external_data=False))


def test_absurd_declared_dims_are_refused():
    m = _add_model_with_weight(np.zeros(4, np.float32))
    t = m.graph.initializer[0]
    del t.dims[:]
    t.dims.extend([10**7, 10**7])
    with pytest.raises(ModelLoadError, match="declares"):
        fg.compile(m)


def test_ir3_inputs_shadowing_initializers_are_constants():
    w = np.array([1, 2, 3, 4], np.float32)
    m = _model([helper.make_node("Add", ["x", "w"], ["y"])], [_vi("x", [4]), _vi("w", [4])],
               [_vi("y", [4])], inits=[numpy_helper.from_array(w, "w")], opset=7, ir_version=3)
    model = fg.compile(m)
    assert [s.name for s in model.inputs] == ["x"]
    np.testing.assert_array_equal(model.run({"x": np.zeros(4, np.float32)})["y"], w)


def test_constant_node_becomes_a_constant():
    m = _model([helper.make_node("Constant", [], ["c"], value_floats=[1.0, 2.0]),
                helper.make_node("Mul", ["x", "c"], ["y"])], [_vi("x", [2])], [_vi("y", [2])])
    model = fg.compile(m)
    assert [n.op_type for n in model.graph.nodes] == ["Mul"]
    np.testing.assert_array_equal(model.run({"x": np.ones(2, np.float32)})["y"], [1, 2])


def test_unknown_op_fails_at_compile_time_naming_node_and_op():
    m = _model([helper.make_node("FrobnicateTensor", ["x"], ["y"], name="frob1", domain="acme")],
               [_vi("x", [2])], [_vi("y", [2])])
    m.opset_import.append(helper.make_opsetid("acme", 1))
    with pytest.raises(UnsupportedOpError) as info:
        fg.compile(m)
    assert "frob1" in str(info.value) and "FrobnicateTensor" in str(info.value)
    assert info.value.node == "frob1"


def test_control_flow_bodies_are_imported_with_outer_reads():
    from oracle import ort_run
    then_b = helper.make_graph([helper.make_node("Identity", ["x"], ["o"])], "b", [], [_vi("o", [2])])
    else_b = helper.make_graph([helper.make_node("Neg", ["x"], ["n"])], "e", [], [_vi("n", [2])])
    m = _model([helper.make_node("If", ["c"], ["y"], name="branch", then_branch=then_b, else_branch=else_b)],
               [_vi("c", [], TensorProto.BOOL), _vi("x", [2])], [_vi("y", [2])])
    compiled = fg.compile(m)
    for c in (True, False):
        feeds = {"c": np.array(c), "x": np.float32([1, -2])}
        np.testing.assert_array_equal(compiled.run(feeds)["y"], ort_run(m, feeds)["y"])


def test_op_older_than_its_first_implemented_version_is_refused():
    m = _model([helper.make_node("Mod", ["x", "x"], ["y"], name="mod")], [_vi("x", [2])], [_vi("y", [2])],
               opset=9)  # Mod first appears in opset 10
    with pytest.raises(UnsupportedOpError, match="mod.*Mod.*opset 9.*only opset >= 10"):
        fg.compile(m)


def test_invalid_opset_is_refused():
    m = _model([helper.make_node("Relu", ["x"], ["y"])], [_vi("x", [2])], [_vi("y", [2])], opset=0)
    with pytest.raises(ModelLoadError, match="opset 0"):
        fg.compile(m)


def test_undefined_input_reference_is_refused():
    m = _model([helper.make_node("Relu", ["nope"], ["y"], name="r")], [_vi("x", [2])], [_vi("y", [2])])
    with pytest.raises(ModelLoadError, match="'nope'"):
        fg.compile(m)
