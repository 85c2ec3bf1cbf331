"""Ray Serve and Ray Data on a local Ray instance (loopback, 2 CPUs, no dashboard): the
deployment returns what ``model.run`` returns, and a Ray Data job over 1 000 rows matches
one ``model.run`` of all rows. Ray starts once for the module (the slow part, several seconds)."""
from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

ray = pytest.importorskip("ray")
pytest.importorskip("ray.serve")
pytest.importorskip("ray.data")

import fusegraph as fg  # noqa: E402
from fusegraph.serve import ray as fgray  # noqa: E402


def _mlp(path):
    """x[batch, 8] -> MatMul -> Add -> Relu -> MatMul -> y[batch, 4] (a symbolic batch axis)."""
    rng = np.random.default_rng(0)
    w1, b1, w2 = (rng.standard_normal(s).astype(np.float32) for s in ((8, 16), (16,), (16, 4)))
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w1"], ["h"]), helper.make_node("Add", ["h", "b1"], ["a"]),
         helper.make_node("Relu", ["a"], ["r"]), helper.make_node("MatMul", ["r", "w2"], ["y"])],
        "mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 4])],
        [numpy_helper.from_array(w1, "w1"), numpy_helper.from_array(b1, "b1"), numpy_helper.from_array(w2, "w2")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    fg.compile(model, config=fg.Config(threads=1)).save(path)
    return path


@pytest.fixture(scope="module")
def local_ray(tmp_path_factory):
    ray.init(num_cpus=2, include_dashboard=False, _node_ip_address="127.0.0.1", log_to_driver=False,
             configure_logging=False, object_store_memory=200 << 20)
    yield
    try:
        from ray import serve
        serve.shutdown()
    finally:
        ray.shutdown()


@pytest.fixture(scope="module")
def mlp(tmp_path_factory):
    path = _mlp(tmp_path_factory.mktemp("ray") / "mlp.fgm")
    return path, fg.load(path)


def test_ray_serve_deployment_equal_results(local_ray, mlp):
    from ray import serve
    path, ref = mlp
    serve.start(http_options={"host": "127.0.0.1", "port": 0}, proxy_location="Disabled")
    app = fgray.deployment(path, name="mlp", threads=1, ray_actor_options={"num_cpus": 0.5},
                           autoscaling_config={"min_replicas": 1, "max_replicas": 1})
    handle = serve.run(app, name="mlp", route_prefix=None)
    x = np.random.default_rng(1).standard_normal((3, 8)).astype(np.float32)
    got = handle.infer.remote({"x": x}).result(timeout_s=60)
    np.testing.assert_array_equal(got["y"], ref.run({"x": x})["y"])
    assert handle.metadata.remote().result(timeout_s=60)["inputs"][0][0] == "x"
    serve.delete("mlp")


def test_ray_data_map_batches_1000_rows(local_ray, mlp):
    path, ref = mlp
    x = np.random.default_rng(2).standard_normal((1000, 8)).astype(np.float32)
    ds = fgray.map_batches(ray.data.from_numpy(x).rename_columns({"data": "x"}), path, batch_size=100,
                           concurrency=1, num_cpus=1, threads=1)
    rows = ds.take_all()
    assert len(rows) == 1000
    got = np.stack([r["y"] for r in rows])
    want = np.concatenate([ref.run({"x": x[i:i + 100]})["y"] for i in range(0, 1000, 100)])
    np.testing.assert_array_equal(got, want)   # the same batches, the same kernels
    np.testing.assert_allclose(got, ref.run({"x": x})["y"], rtol=1e-5, atol=1e-6)


def test_batch_predictor_feeds_whole_static_batches(tmp_path):
    """issue 39 #7: a model compiled with a static batch of 4 ([4, 8]) gets whole batches of 4
    from ``BatchPredictor`` (a Ray Data batch of 10 rows: 4 + 4 + 2 padded to 4), not rows of
    [1, 8] (an InputError per batch before); the rows' outputs equal a NumPy reference."""
    from small_models import mlp, mlp_reference
    path = tmp_path / "mlp4.fgm"
    fg.compile(mlp(batch=4), config=fg.Config(threads=1)).save(path)
    predictor = fgray.BatchPredictor(str(path), keep_inputs=True)   # (threads would set this process's)
    x = np.random.default_rng(3).standard_normal((10, 8)).astype(np.float32)
    out = predictor({"x": x})
    assert out["y"].shape == (10, 4) and out["x"] is x
    np.testing.assert_allclose(out["y"], mlp_reference(x), rtol=1e-5, atol=1e-5)


def test_ray_data_map_batches_static_batch(local_ray, tmp_path):
    """issue 39 #7 through Ray Data: 30 rows in batches of 10 on the static batch-4 model."""
    from small_models import mlp, mlp_reference
    path = tmp_path / "mlp4.fgm"
    fg.compile(mlp(batch=4), config=fg.Config(threads=1)).save(path)
    x = np.random.default_rng(4).standard_normal((30, 8)).astype(np.float32)
    ds = fgray.map_batches(ray.data.from_numpy(x).rename_columns({"data": "x"}), path, batch_size=10,
                           concurrency=1, num_cpus=1, threads=1)
    got = np.stack([r["y"] for r in ds.take_all()])
    np.testing.assert_allclose(got, mlp_reference(x), rtol=1e-5, atol=1e-5)
