"""The TensorFlow frontend (tf2onnx -> ONNX frontend): Keras applications, a SavedModel with a
custom layer and a frozen GraphDef, against TensorFlow's own output (the oracle)."""
from __future__ import annotations

import os
import sys

import numpy as np
import pytest

import fusegraph as fg
from fusegraph.errors import ModelLoadError

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def test_missing_tensorflow_names_the_extra(monkeypatch, tmp_path):
    (tmp_path / "saved_model.pb").write_bytes(b"")
    monkeypatch.setitem(sys.modules, "tensorflow", None)     # import tensorflow -> ImportError
    with pytest.raises(ModelLoadError, match=r"fusegraph\[tensorflow\]"):
        fg.compile(str(tmp_path))


_modules = __import__("fusegraph.frontends.tensorflow", fromlist=["_modules"])._ortools_before_tensorflow
_modules()                    # OR-Tools before TensorFlow (they clash the other way round)
tf = pytest.importorskip("tensorflow")
pytest.importorskip("tf2onnx")
keras = tf.keras


def assert_close(got, ref):
    ref = np.asarray(ref)
    assert got.shape == ref.shape
    np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-4 * float(np.abs(ref).max()))


def calibrated(model, shape, seed=0, batch=16):
    """BatchNorm moving statistics from one random batch, so activations stay O(1) and the
    logits depend on the input (Keras' defaults, mean 0 / variance 1, make deep nets collapse)."""
    bns = [layer for layer in model.layers if isinstance(layer, keras.layers.BatchNormalization)]
    saved = [bn.momentum for bn in bns]
    for bn in bns:
        bn.momentum = 0.0
    model(np.random.default_rng(seed).standard_normal((batch,) + shape).astype(np.float32), training=True)
    for bn, m in zip(bns, saved):
        bn.momentum = m
    return model


@pytest.mark.parametrize("name,size", [("MobileNetV2", 32), ("ResNet50", 64)])
def test_keras_application_matches_tensorflow(name, size):
    keras.utils.set_random_seed(0)
    shape = (size, size, 3)   # ResNet50 at 64: its last BatchNorms see 2x2 maps, not 1x1 (sane statistics)
    model = calibrated(getattr(keras.applications, name)(weights=None, input_shape=shape, classes=10,
                                                         classifier_activation=None), shape)
    compiled = fg.compile(model)
    assert [i.name for i in compiled.inputs] == [model.layers[0].name]
    x = np.random.default_rng(1).standard_normal((2,) + shape).astype(np.float32)
    ref = model(x, training=False).numpy()
    out = compiled.run({compiled.inputs[0].name: x})
    assert list(out) == ["predictions"]
    assert_close(out["predictions"], ref)
    assert np.abs(ref[0] - ref[1]).max() > 1e-2 * np.abs(ref).max()   # not input-independent


class Swishy(keras.layers.Layer):
    """A custom layer: x * sigmoid(a * x) + b, with its own weights."""

    def build(self, shape):
        self.a = self.add_weight(shape=(shape[-1],), initializer="random_normal", name="a")
        self.b = self.add_weight(shape=(shape[-1],), initializer="random_normal", name="b")

    def call(self, x):
        return x * tf.sigmoid(self.a * x) + self.b


def _custom_model():
    keras.utils.set_random_seed(0)
    inp = keras.Input((8,), name="features")
    h = Swishy()(keras.layers.Dense(16)(inp))
    return keras.Model(inp, keras.layers.Dense(4, name="head")(h))


def test_saved_model_with_custom_layer(tmp_path):
    path = str(tmp_path / "saved")
    _custom_model().export(path)
    serve = tf.saved_model.load(path).signatures["serving_default"]
    compiled = fg.compile(path)
    assert [i.name for i in compiled.inputs] == ["features"]
    for batch in (3, 5):                      # the batch dim stays symbolic
        x = np.random.default_rng(batch).standard_normal((batch, 8)).astype(np.float32)
        ref = serve(features=tf.constant(x))
        out = compiled.run({"features": x})
        assert list(out) == list(ref)
        assert_close(out[list(out)[0]], list(ref.values())[0].numpy())


def test_frozen_graph_def():
    from tensorflow.python.framework.convert_to_constants import convert_variables_to_constants_v2
    model = _custom_model()
    fn = tf.function(lambda x: model(x)).get_concrete_function(tf.TensorSpec((None, 8), tf.float32, name="x"))
    graph_def = convert_variables_to_constants_v2(fn).graph.as_graph_def()
    compiled = fg.compile(graph_def)
    x = np.random.default_rng(0).standard_normal((4, 8)).astype(np.float32)
    out = compiled.run({compiled.inputs[0].name: x})
    assert_close(list(out.values())[0], model(x).numpy())


def test_folder_without_saved_model_is_refused(tmp_path):
    with pytest.raises(ModelLoadError):
        fg.compile(str(tmp_path))


def test_cli_runs_a_saved_model_folder(tmp_path, capsys):
    from fusegraph.cli.main import main
    path = str(tmp_path / "saved")
    _custom_model().export(path)
    assert main(["run", path]) == 0
    assert "output_0" in capsys.readouterr().out
