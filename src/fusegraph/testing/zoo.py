"""Real model topologies without downloads: the onnx package's light models, given weights.

The onnx package ships model-zoo topologies (``onnx/backend/test/data/light``) whose weights
are ``ConstantOfShape`` nodes filled with 0.02. Every expected output of those is a constant
vector, which hides wrong ops, so ``randomize_weights`` substitutes random initializers
chosen by each weight's role: He-scaled conv / linear weights, small biases, and
BatchNormalization statistics that keep activations O(1): each BatchNormalization's running
mean and variance are set to the statistics its input actually has on a calibration input
(found in one run of an auxiliary model where every BatchNormalization is an
InstanceNormalization, which is what a calibrated BN computes at batch 1). ``expose_logits`` adds the input
of the final Softmax as an extra graph output, so tests compare logits, not only
probabilities. ``random_light_model`` draws a light model's weights once per process and hands
out parsed copies: drawing the large ones (vgg19, zfnet512) costs far more than parsing them.
"""
from __future__ import annotations

import atexit
import functools
import shutil
import tempfile
import threading
from pathlib import Path

import numpy as np
import onnx
from onnx import helper, numpy_helper

from ..ops import Movement, movement_ops

LIGHT_MODELS = ("bvlc_alexnet", "densenet121", "inception_v1", "inception_v2", "resnet50",
                "shufflenet", "squeezenet", "vgg19", "zfnet512")
# the light models but the two large chains, vgg19 and zfnet512 (548 and 349 MB of weights),
# whose ops are a subset of bvlc_alexnet's, a chain too: for checks that a larger model of the
# same ops in the same shape of graph adds nothing to
LIGHT_MODELS_BUT_LARGE_CHAINS = tuple(n for n in LIGHT_MODELS if n not in ("vgg19", "zfnet512"))
# ops a weight's role is read through: those that keep every one of its values (a view, a
# permutation, a cast), so the weight plays the role of what reads them; a selection, a join
# or a pad would make it part of something else
LOOK_THROUGH = (Movement.VIEW, Movement.PERMUTE, Movement.CAST)


def light_model_path(name: str) -> Path:
    """Path of ``light_<name>.onnx`` inside the installed onnx package."""
    base = Path(onnx.__file__).parent / "backend" / "test" / "data" / "light"
    path = base / f"light_{name}.onnx"
    if not path.is_file():
        raise FileNotFoundError(f"no light model {name!r}; known: {', '.join(LIGHT_MODELS)}")
    return path


_DRAWN: dict[tuple[str, int, bool], Path] = {}    # (name, seed, calibrate) -> its serialized copy
_DRAWN_LOCK = threading.RLock()   # one draw at a time (a calibrated one draws the uncalibrated first)


@functools.cache
def _drawn_dir() -> Path:
    folder = Path(tempfile.mkdtemp(prefix="fusegraph-light-"))
    atexit.register(shutil.rmtree, folder, ignore_errors=True)
    return folder


def random_light_model(name: str, seed: int = 0, calibrate: bool = True) -> onnx.ModelProto:
    """``randomize_weights(onnx.load(light_model_path(name)), seed, calibrate)``, drawn once per
    process: the first call saves the model to a temporary folder (removed at exit), later calls
    parse a fresh copy of it, so a caller may change what it gets. Safe to call from threads."""
    key = (name, int(seed), bool(calibrate))
    with _DRAWN_LOCK:
        path = _DRAWN.get(key)
        if path is None:
            if calibrate:   # randomize_weights' calibration is a last step over the uncalibrated draw
                uncalibrated = random_light_model(name, seed, calibrate=False)
                model = calibrate_batchnorm(uncalibrated, random_feeds(uncalibrated, seed))
            else:
                model = randomize_weights(onnx.load(light_model_path(name)), seed, calibrate=False)
            path = _drawn_dir() / f"{name}-{key[1]}-{int(calibrate)}.onnx"
            path.write_bytes(model.SerializeToString())
            _DRAWN[key] = path
            return model
    return onnx.load_from_string(path.read_bytes())


def _consumers(graph: onnx.GraphProto) -> dict[str, list[tuple[onnx.NodeProto, int]]]:
    users: dict[str, list] = {}
    for node in graph.node:
        for i, name in enumerate(node.input):
            users.setdefault(name, []).append((node, i))
    return users


def _role(name: str, users: dict, depth: int = 0) -> tuple[str, onnx.NodeProto | None]:
    """The first real consumer of a weight (looking through ``LOOK_THROUGH``: Reshape, Transpose ...)."""
    for node, idx in users.get(name, []):
        key = ("" if node.domain == "ai.onnx" else node.domain, node.op_type)
        if key in movement_ops(*LOOK_THROUGH) and idx == 0 and depth < 4:
            return _role(node.output[0], users, depth + 1)
        return f"{node.op_type}:{idx}", node
    return "unused", None


def _fan_in(shape: tuple[int, ...], role: str, node) -> int:
    if role == "Conv:1":
        return int(np.prod(shape[1:]))
    if role == "Gemm:1":  # the weight may reach Gemm through a Reshape: use its trailing dims
        trans_b = next((a.i for a in node.attribute if a.name == "transB"), 0)
        return shape[-1] if trans_b else shape[-2]
    return shape[-2]


def _random_weight(shape: tuple[int, ...], role: str, node, rng: np.random.Generator) -> np.ndarray:
    if role in ("Conv:1", "Gemm:1", "MatMul:1") and len(shape) >= 2:
        std = np.sqrt(2.0 / max(_fan_in(shape, role, node), 1))
        return rng.normal(0.0, std, shape)
    if role in ("BatchNormalization:1", "Mul:1", "Mul:0"):
        return rng.uniform(0.8, 1.2, shape)
    if role == "BatchNormalization:4":
        return rng.uniform(0.5, 1.5, shape)
    if role in ("BatchNormalization:2", "BatchNormalization:3", "Conv:2", "Gemm:2", "Add:1", "Add:0"):
        return rng.normal(0.0, 0.1, shape)
    return rng.normal(0.0, 0.1, shape)


def randomize_weights(model: onnx.ModelProto, seed: int = 0, calibrate: bool = True) -> onnx.ModelProto:
    """A copy of ``model`` whose ConstantOfShape weights and float initializers are random.

    With ``calibrate``, BatchNormalization statistics are then fitted to a random N(0, 1)
    input (seed ``seed``), so activations stay O(1) through deep and residual networks.
    """
    model = _copy(model)
    g = model.graph
    rng = np.random.default_rng(seed)
    users = _consumers(g)
    inits = {t.name: t for t in g.initializer}
    new_inits: list[onnx.TensorProto] = []
    keep_nodes = []
    for node in g.node:
        if node.op_type == "ConstantOfShape" and node.input and node.input[0] in inits:
            shape = tuple(int(d) for d in numpy_helper.to_array(inits[node.input[0]]).reshape(-1))
            value = next((a.t for a in node.attribute if a.name == "value"), None)
            dtype = numpy_helper.to_array(value).dtype if value is not None else np.float32
            if np.issubdtype(dtype, np.floating):
                role, consumer = _role(node.output[0], users)
                arr = _random_weight(shape, role, consumer, rng).astype(dtype)
                new_inits.append(numpy_helper.from_array(arr, node.output[0]))
                continue
        keep_nodes.append(node)
    for t in g.initializer:
        arr = numpy_helper.to_array(t)
        if np.issubdtype(arr.dtype, np.floating) and arr.size > 0:
            role, consumer = _role(t.name, users)
            arr = _random_weight(arr.shape, role, consumer, rng).astype(arr.dtype)
            new_inits.append(numpy_helper.from_array(arr, t.name))
        else:
            new_inits.append(t)
    del g.node[:]
    g.node.extend(keep_nodes)
    used = {name for node in keep_nodes for name in node.input} | {o.name for o in g.output}
    new_inits = [t for t in new_inits if t.name in used]
    del g.initializer[:]
    g.initializer.extend(new_inits)
    init_names = {t.name for t in new_inits}
    declared_inputs = [i for i in g.input if i.name in used]
    del g.input[:]
    g.input.extend(declared_inputs)
    if model.ir_version < 4:  # IR < 4: every initializer must also be a graph input
        declared = {i.name for i in g.input}
        for t in new_inits:
            if t.name not in declared:
                g.input.append(helper.make_tensor_value_info(t.name, t.data_type, list(t.dims)))
    else:
        kept = [i for i in g.input if i.name not in init_names]
        del g.input[:]
        g.input.extend(kept)
    if calibrate:
        model = calibrate_batchnorm(model, random_feeds(model, seed))
    return model


def calibrate_batchnorm(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> onnx.ModelProto:
    """Set every BatchNormalization's mean/var to its input's statistics on ``feeds`` (batch 1)."""
    import fusegraph as fg

    model = _copy(model)
    g = model.graph
    bns = [n for n in g.node if n.op_type == "BatchNormalization"]
    if not bns:
        return model
    aux = _copy(model)
    ag = aux.graph
    del ag.output[:]
    for node in ag.node:
        if node.op_type == "BatchNormalization":
            eps = next((a.f for a in node.attribute if a.name == "epsilon"), 1e-5)
            inputs = list(node.input[:3])
            del node.attribute[:]
            del node.input[:]
            node.input.extend(inputs)
            node.op_type = "InstanceNormalization"
            node.attribute.append(helper.make_attribute("epsilon", eps))
            del node.output[1:]
    for node in bns:
        ag.output.append(helper.make_tensor_value_info(node.input[0], onnx.TensorProto.FLOAT, None))
    stats = fg.compile(aux, fg.Config(level="O0")).run(feeds)
    inits = {t.name: k for k, t in enumerate(g.initializer)}
    for node in bns:
        x = stats[node.input[0]].astype(np.float64)
        axes = (0,) + tuple(range(2, x.ndim))
        for name, value in ((node.input[3], x.mean(axis=axes)), (node.input[4], x.var(axis=axes))):
            g.initializer[inits[name]].CopyFrom(numpy_helper.from_array(value.astype(np.float32), name))
    return model


def expose_logits(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy with the input of the last Softmax added as an output named ``logits``.

    Models without a Softmax (densenet121 ends in a pooling) already output their logits.
    """
    model = _copy(model)
    g = model.graph
    soft = [n for n in g.node if n.op_type == "Softmax"]
    if not soft:
        return model
    name = soft[-1].input[0]
    g.node.append(helper.make_node("Identity", [name], ["logits"], name="expose_logits"))
    g.output.append(helper.make_tensor_value_info("logits", onnx.TensorProto.FLOAT, None))
    return model


def real_inputs(model: onnx.ModelProto) -> list[onnx.ValueInfoProto]:
    """Graph inputs that are not initializers."""
    inits = {t.name for t in model.graph.initializer}
    return [i for i in model.graph.input if i.name not in inits]


def random_feeds(model: onnx.ModelProto, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    feeds = {}
    for vi in real_inputs(model):
        tt = vi.type.tensor_type
        shape = [d.dim_value if d.HasField("dim_value") else 1 for d in tt.shape.dim]
        dtype = helper.tensor_dtype_to_np_dtype(tt.elem_type)
        if np.issubdtype(dtype, np.floating):
            feeds[vi.name] = rng.standard_normal(shape).astype(dtype)
        else:
            feeds[vi.name] = rng.integers(0, 10, shape).astype(dtype)
    return feeds


def _copy(model: onnx.ModelProto) -> onnx.ModelProto:
    out = onnx.ModelProto()
    out.CopyFrom(model)
    return out
