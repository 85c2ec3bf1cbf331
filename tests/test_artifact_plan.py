"""The .fgm artifact's stored plan and packed weights.

The loaded model binds the compiled model's plan (arena, strides, streams) without a probe
run; a stored plan that could crash, hang or race is refused. Weights that only the CPU
backend's oneDNN kernels read are held once, packed (``runtime/backends/cpu/dnnl/``): the file
stores them in those forms only (``fusegraph.prepacked`` / ``fusegraph.packed_only``, format
version 3), a load on this machine uses the stored forms as they are (no reorder, the graph
keeps shape-only placeholders), a form in another layout than the primitive wants is
reordered, the portable kernels (and a model run elsewhere) get the plain tensors back, and a
stored form or entry that lies is refused with an ``ArtifactError`` naming the weight.
Shared helpers and the ``saved`` fixture come from ``test_artifact.py``.
"""
from __future__ import annotations

import json
import os

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

import fusegraph as fg
from fusegraph import artifact as A
from fusegraph.errors import ArtifactError
from fusegraph.runtime.backends.cpu.dnnl import available as dnnl_available
from fusegraph.runtime.backends.cpu.dnnl import blocked
from fusegraph.runtime.backends.cpu.dnnl import weights as dnnl_weights
from fusegraph.runtime.backends.cpu.dnnl.compute import compute_dtype
from fusegraph.runtime.backends.cpu.dnnl.memory import DTYPES
from test_artifact import FEEDS, _f32, _model, _same, json_part_edit, refused, reseal
from test_artifact import saved  # noqa: F401 - a fixture
from cpu_isa import AVX512


def _views(model):
    """Each call's arena views as (offset in the arena, shape, strides), in plan order."""
    b = model._executor.binding
    return [None if c.out is None else [(v.data_ptr() - b.arena.lo, tuple(v.shape), v.stride()) for v in c.out]
            for c in b.calls]


def test_light_model_round_trip(tmp_path, monkeypatch):
    """The loaded model binds the compiled model's plan: same arena, same views with the
    strides the compile's probe found, and no probe run of its own."""
    from fusegraph.testing import zoo
    from fusegraph.runtime import bind as bind_module
    proto = zoo.random_light_model("squeezenet")
    model = fg.compile(proto)
    model.save(tmp_path / "m.fgm")
    feeds = zoo.random_feeds(proto)
    monkeypatch.setattr(bind_module, "probe_strides", lambda *a: pytest.fail("load ran the layout probe"))
    loaded = fg.load(tmp_path / "m.fgm")
    _same(model.run(feeds), loaded.run(feeds))
    assert loaded.plan.to_dict() == model.plan.to_dict()
    b0, b1 = model._executor.binding, loaded._executor.binding
    assert b1.arena.nbytes == b0.arena.nbytes and b1.strides == b0.strides and b0.strides
    assert _views(loaded) == _views(model)


# ----- packed weights --------------------------------------------------------------------------
class Weights:
    """The weights part of an artifact, decoded for editing: the safetensors header (``head``),
    its ``fusegraph.*`` metadata decoded from JSON (``meta``) and the data section. ``blob()``
    encodes it again with the data section 64-aligned as before, so every entry left alone stays
    where it was."""

    def __init__(self, blob: bytes):
        n = int.from_bytes(blob[:8], "little")
        self.header_bytes = 8 + n
        self.head = json.loads(blob[8:8 + n])
        self.meta = {k: json.loads(v) if k.startswith("fusegraph.") else v
                     for k, v in self.head.pop("__metadata__").items()}
        self.data = bytearray(blob[8 + n:])

    @property
    def forms(self) -> dict:
        return self.meta["fusegraph.prepacked"]

    @property
    def packed_only(self) -> dict:
        return self.meta["fusegraph.packed_only"]

    def entry(self, name: str) -> bytes:
        lo, hi = self.head[name]["data_offsets"]
        return bytes(self.data[lo:hi])

    def put(self, name: str, data: bytes) -> None:
        """Entry ``name`` now holds ``data`` (uint8), appended 64-aligned to the data section."""
        self.data += bytes(-len(self.data) % 64)
        at = len(self.data)
        self.head[name] = {"dtype": "U8", "shape": [len(data)], "data_offsets": [at, at + len(data)]}
        self.data += data

    def desc(self, weight: str) -> dict:
        return json.loads(self.entry(self.forms[weight][0]["md"]))

    def form_bytes(self, weight: str) -> bytes:
        return self.entry(self.forms[weight][0]["data"])

    def set_form(self, weight: str, desc: dict, data: bytes | None = None) -> None:
        """The first stored form of ``weight`` now says ``desc`` (and holds ``data``)."""
        self.put(self.forms[weight][0]["md"], json.dumps(desc).encode())
        if data is not None:
            self.put(self.forms[weight][0]["data"], data)

    def blob(self) -> bytes:
        meta = {k: json.dumps(v) if k.startswith("fusegraph.") else v for k, v in self.meta.items()}
        head = json.dumps({**self.head, "__metadata__": meta}).encode()
        head += b" " * (-(8 + len(head)) % 64)
        return len(head).to_bytes(8, "little") + head + bytes(self.data)


def stored(path) -> Weights:
    return Weights(A.unpack(path)[1]["weights"])


def weights_edit(fn):
    """A ``reseal`` ``parts_fn`` that lets ``fn(Weights)`` edit the weights part."""
    def parts_fn(parts):
        w = Weights(parts["weights"])
        fn(w)
        parts["weights"] = w.blob()
    return parts_fn


TRANSPOSED = {"wt": True, "wsq": True, "wn": False}    # product_model's weights: stored as W^T?


def product_model():
    """A convolution and three weight products: ``wt`` and the square ``wsq`` are ``[N, K]``
    with ``transB`` (oneDNN's operand is their transpose; the square one has the same dims
    either way), ``wn`` is ``[K, N]``."""
    rng = np.random.default_rng(3)

    def w(name, *shape, scale):
        return numpy_helper.from_array((rng.standard_normal(shape) * scale).astype(np.float32), name)
    nodes = [helper.make_node("Conv", ["x", "wc", "bc"], ["a"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["a"], ["ar"]), helper.make_node("GlobalAveragePool", ["ar"], ["p"]),
             helper.make_node("Flatten", ["p"], ["f"]), helper.make_node("Gemm", ["f", "wt", "bt"], ["g"], transB=1),
             helper.make_node("Relu", ["g"], ["gr"]), helper.make_node("Gemm", ["gr", "wsq"], ["h"], transB=1),
             helper.make_node("Gemm", ["h", "wn", "bn"], ["y"])]
    inits = [w("wc", 64, 32, 3, 3, scale=0.08), w("bc", 64, scale=0.1), w("wt", 48, 64, scale=0.2),
             w("bt", 48, scale=0.1), w("wsq", 48, 48, scale=0.2), w("wn", 48, 20, scale=0.2), w("bn", 20, scale=0.1)]
    return _model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 32, 16, 16])],
                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 20])], inits)


def recurrent_model():
    """A bidirectional LSTM feeding a GRU (torch's linear-before-reset form): their weights
    are held packed only, seen through an axis permutation (``dnnl/rnn.py``)."""
    rng = np.random.default_rng(5)

    def w(name, *shape, scale=0.3):
        return numpy_helper.from_array((rng.standard_normal(shape) * scale).astype(np.float32), name)
    nodes = [helper.make_node("LSTM", ["x", "lw", "lr", "lb"], ["ly", "lh"], hidden_size=16, direction="bidirectional"),
             helper.make_node("Transpose", ["ly"], ["lt"], perm=[0, 2, 1, 3]),
             helper.make_node("Reshape", ["lt", "shape"], ["gx"]),
             helper.make_node("GRU", ["gx", "gw", "gr", "gb"], ["y"], hidden_size=12, linear_before_reset=1)]
    inits = [w("lw", 2, 64, 8), w("lr", 2, 64, 16), w("lb", 2, 128, scale=0.1), w("gw", 1, 36, 32),
             w("gr", 1, 36, 12), w("gb", 1, 72, scale=0.1),
             numpy_helper.from_array(np.array([6, 2, 32], np.int64), "shape")]
    return _model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [6, 2, 8])],
                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, [6, 1, 2, 12]),
                   helper.make_tensor_value_info("lh", TensorProto.FLOAT, [2, 2, 16])], inits)


def _compiled(name: str, **config):
    """(onnx model, compiled model, feeds) of ``name`` ("squeezenet", "products" or "recurrent")."""
    from fusegraph.testing import zoo
    if name == "recurrent":
        x = np.random.default_rng(6).standard_normal((6, 2, 8)).astype(np.float32)
        proto, feeds = recurrent_model(), {"x": x}
    elif name == "squeezenet":
        proto = zoo.random_light_model("squeezenet")
        feeds = zoo.random_feeds(proto)
    else:
        x = np.random.default_rng(4).standard_normal((4, 32, 16, 16)).astype(np.float32)
        proto, feeds = product_model(), {"x": x}
    return proto, fg.compile(proto, fg.Config(**config)), feeds


def _released(model) -> dict:
    """The weights whose plain tensor the backend released: name -> meta placeholder."""
    return {n: v.const for n, v in model.graph.constants.items() if v.const.device.type == "meta"}


@pytest.fixture(scope="module", params=["squeezenet", "products", "recurrent"])
def packed(request, tmp_path_factory):
    """A model whose oneDNN kernels hold weights packed only (squeezenet's convolutions,
    products, or recurrent layers), saved; with its feeds and its released weights."""
    if not dnnl_available():
        pytest.skip("the oneDNN library does not load here")
    proto, model, feeds = _compiled(request.param)
    path = tmp_path_factory.mktemp("fgm3") / f"{request.param}.fgm"
    model.save(path)
    released = _released(model)
    assert released, "no weight is held packed only"
    return type("Saved", (), dict(name=request.param, proto=proto, model=model, path=path, feeds=feeds,
                                  released=released))


def _nbytes(t) -> int:
    return t.numel() * t.element_size()


def test_released_weights_are_stored_once(packed):
    """No plain copy of a released weight: ``fusegraph.packed_only`` lists each with its dtype,
    shape and strides, its one packed form holds its bytes, and the weights part is the packed
    forms, their descriptions and the weights kept plain, and nothing else."""
    w = stored(packed.path)
    consts = {n: v.const for n, v in packed.model.graph.constants.items()}
    assert set(w.packed_only) == set(packed.released)
    names = {torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16"}
    for name, t in packed.released.items():
        assert name not in w.head
        assert w.packed_only[name] == {"dtype": names[t.dtype], "shape": list(t.shape), "strides": list(t.stride())}
        keys = [f["key"] for f in w.forms[name]]
        assert len(keys) == 1 and keys[0][0] == "dnnl" and sorted(keys[0][1:]) == list(range(t.dim()))
        assert w.desc(name)["size"] == len(w.form_bytes(name)) >= _nbytes(t)
    plain = {n: t for n, t in consts.items() if n not in packed.released}
    for name, t in plain.items():   # kept plain: stored plain, with no packed form
        assert name in w.head and name not in w.forms and w.head[name]["shape"] == list(t.shape)
    forms = [f for fs in w.forms.values() for f in fs]
    held = (sum(len(w.entry(f["data"])) + len(w.entry(f["md"])) for f in forms)
            + sum(_nbytes(t) for t in plain.values()))
    entries = [k for k in w.head if not k.startswith("__fusegraph_pad")]
    assert set(entries) == set(plain) | {f[k] for f in forms for k in ("data", "md")}
    part = len(A.unpack(packed.path)[1]["weights"])
    assert held <= part - w.header_bytes <= held + 64 * len(entries)     # padding only
    if packed.name == "squeezenet":   # big weights: padded blocks cost little; a second copy would double it
        assert part < 1.1 * sum(_nbytes(t) for t in consts.values())


def test_load_uses_the_stored_forms(packed, monkeypatch):
    """This machine's primitives want the stored layouts: the load reorders nothing, keeps the
    released weights as shape-only placeholders, and computes the compiled model's bits."""
    assert packed.model.report.kernels["weight_reorders"] >= len(packed.released)   # the compile packed
    monkeypatch.setattr(dnnl_weights, "reorder", lambda *a: pytest.fail("load reordered a weight"))
    loaded = fg.load(packed.path)
    assert loaded.load_info["weight_reorders"] == 0
    assert loaded.load_info["backend_state"] == "stored forms used as they are"
    _same(packed.model.run(packed.feeds), loaded.run(packed.feeds))
    assert set(_released(loaded)) == set(packed.released)
    for name, t in packed.released.items():
        c = loaded.graph.constants[name].const
        assert (c.device.type, c.dtype, c.shape, c.stride()) == ("meta", t.dtype, t.shape, t.stride())


def test_resaving_a_loaded_model_round_trips(packed, tmp_path):
    """A loaded model saves the forms it was given: the same graph and weights bytes, and a
    second load computes the same bits, again without a reorder."""
    loaded = fg.load(packed.path)
    loaded.save(tmp_path / "again.fgm")
    _, first = A.unpack(packed.path)
    _, again = A.unpack(tmp_path / "again.fgm")
    assert again["graph"] == first["graph"] and again["weights"] == first["weights"]
    reloaded = fg.load(tmp_path / "again.fgm")
    assert reloaded.load_info["weight_reorders"] == 0
    _same(packed.model.run(packed.feeds), reloaded.run(packed.feeds))


def _plain_layout(desc: dict, data: bytes) -> tuple[dict, bytes]:
    """The same weight in oneDNN's plain layout: row-major over its dims, no padding, no blocks."""
    plain = blocked.unpack(desc, torch.frombuffer(bytearray(data), dtype=torch.uint8)).contiguous()
    raw = plain.reshape(-1).view(torch.uint8).numpy().tobytes()
    return {**desc, "padded": list(desc["dims"]), "strides": _row_major(desc["dims"]), "blocks": [], "idxs": [],
            "size": len(raw)}, raw


def _row_major(dims) -> list[int]:
    strides, acc = [], 1
    for d in reversed(dims):
        strides.insert(0, acc)
        acc *= d
    return strides


def test_a_form_in_another_layout_is_reordered(packed, tmp_path):
    """Stored forms re-described (and re-packed) in the plain layout, which no primitive here
    wants: the load reorders exactly those weights, and computes the compiled model's bits
    (forms already plain, as oneDNN's GEMM-based GRU takes its weights, are left out)."""
    if packed.name == "products" and not AVX512:
        pytest.skip("AVX2's float32 GEMM takes its weights in the plain layout: nothing to reorder")
    w = stored(packed.path)
    names = sorted(n for n in packed.released if w.desc(n)["blocks"])[:3]
    assert names
    plain = {n: _plain_layout(w.desc(n), w.form_bytes(n)) for n in names}
    if packed.name == "products":   # the plain bytes are the weights (transposed where oneDNN's operand is)
        inits = {i.name: numpy_helper.to_array(i) for i in packed.proto.graph.initializer}
        for n, (desc, raw) in plain.items():
            got = np.frombuffer(raw, np.float32).reshape(desc["dims"])
            np.testing.assert_array_equal(got, inits[n].T if TRANSPOSED[n] else inits[n])
        assert any(TRANSPOSED[n] for n in names)

    def edit(w):
        for n, (desc, raw) in plain.items():
            w.set_form(n, desc, raw)
    path = reseal(packed.path, tmp_path / "plain.fgm", parts_fn=weights_edit(edit))
    loaded = fg.load(path)
    assert loaded.load_info["weight_reorders"] == len(names)
    assert loaded.load_info["backend_state"] == f"{len(names)} weight(s) reordered for this machine's kernels"
    _same(packed.model.run(packed.feeds), loaded.run(packed.feeds))


def _set_desc(**changes):
    def edit(w, n):
        w.set_form(n, {**w.desc(n), **changes})
    return edit


def _other_geometry(make):
    """The weight re-stored in the plain layout, then described by ``make(desc)``: a layout
    that fits its bytes, but not the weight."""
    def edit(w, n):
        desc, raw = _plain_layout(w.desc(n), w.form_bytes(n))
        w.set_form(n, make(desc), raw)
    return edit


HOSTILE = {
    "strides_past_the_bytes": (lambda w, n: _set_desc(strides=[2 * s + 64 for s in w.desc(n)["strides"]])(w, n),
                               "reaches"),
    "truncated_data": (lambda w, n: w.put(w.forms[n][0]["data"], w.form_bytes(n)[:-64]), "packed form of"),
    "unreadable_description": (lambda w, n: w.put(w.forms[n][0]["md"], b"\xff{"), "unreadable"),
    "no_packed_form": (lambda w, n: w.forms.pop(n), "packed-only weight"),
    "form_entry_missing": (lambda w, n: w.forms[n][0].update(data="__fusegraph_packed__9:ghost"), "malformed"),
    "unknown_key": (lambda w, n: w.forms[n][0].update(key=["ideep"]), "malformed key"),
    "negative_dim": (lambda w, n: w.packed_only[n].update(shape=[-1] + w.packed_only[n]["shape"][1:]), "malformed"),
    "shape_not_a_list": (lambda w, n: w.packed_only[n].update(shape="abc"), "malformed"),
    "shape_rank": (lambda w, n: w.packed_only[n].update(shape=w.packed_only[n]["shape"][:-1]), "malformed"),
    "unknown_dtype": (lambda w, n: w.packed_only[n].update(dtype="PICKLE"), "malformed"),
    # a description that fits its bytes (dense, every access inside) but holds fewer elements,
    # or another element type, than the weight: reading it as the weight would read past them
    "fewer_elements": (_other_geometry(lambda d: {**d, "dims": [d["dims"][0] // 2] + d["dims"][1:]}),
                       "holds"),
    "other_element_type": (_other_geometry(lambda d: {**d, "dt": 2, "padded": [2 * d["dims"][0]] + d["dims"][1:],
                                                      "strides": _row_major([2 * d["dims"][0]] + d["dims"][1:])}),
                           "holds"),
}


@pytest.mark.parametrize("case", list(HOSTILE))
def test_hostile_packed_weights(packed, tmp_path, case):
    """Re-sealed files (checksums pass) whose packed forms or packed-only entries lie are
    refused with an ArtifactError naming the weight; by the oneDNN kernels and the portable
    ones alike."""
    edit, words = HOSTILE[case]
    name = sorted(packed.released)[0]
    path = reseal(packed.path, tmp_path / "h.fgm", parts_fn=weights_edit(lambda w: edit(w, name)))
    refused(path, repr(name), words)
    portable = reseal(path, tmp_path / "hp.fgm", lambda h: h["config"].update(cpu_kernels="portable"))
    refused(portable, repr(name), words)


def test_format_version_2_is_refused(packed, tmp_path):
    """A version-2 file (plain weights beside another build's packed forms) is not read."""
    refused(reseal(packed.path, tmp_path / "v2.fgm", lambda h: h.update(format_version=2)),
            "format version 2 is older", "recompile")


def test_portable_kernels_get_the_weights_plain(packed, tmp_path):
    """``cpu_kernels="portable"`` loading a file saved with the oneDNN kernels: the backend reads
    each packed-only weight back to the plain tensor the portable compile holds, and the run
    matches the portable compile's bits (and the oneDNN model's numbers)."""
    path = reseal(packed.path, tmp_path / "p.fgm", lambda h: h["config"].update(cpu_kernels="portable"))
    loaded = fg.load(path)
    assert loaded.config.cpu_kernels == "portable"
    assert set(loaded.report.kernels["implementations"]) == {"portable"} and not _released(loaded)
    portable = fg.compile(packed.proto, fg.Config(cpu_kernels="portable"))
    for name, t in packed.released.items():
        c, want = loaded.graph.constants[name].const, portable.graph.constants[name].const
        assert (c.dtype, c.shape, c.stride()) == (t.dtype, t.shape, t.stride())
        assert torch.equal(c, want), name
    got = loaded.run(packed.feeds)
    _same(portable.run(packed.feeds), got)
    for k, v in packed.model.run(packed.feeds).items():
        np.testing.assert_allclose(got[k], v, rtol=1e-4, atol=1e-4)


def _read_elsewhere(path, tmp_path):
    """``artifact.read`` of ``path`` re-sealed with ``device="auto"`` on a machine that (we
    pretend) has CUDA: the model will run on the CUDA backend, which takes no packed form."""
    path = reseal(path, tmp_path / "elsewhere.fgm", lambda h: h["config"].update(device="auto"))
    here = A.machine()
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(A.store, "machine", lambda: here)
        mp.setattr(torch.cuda, "is_available", lambda: True)
        return A.read(path)


def test_a_model_run_elsewhere_reads_the_weights_plain(packed, tmp_path):
    """A model that will run on another device reads each packed-only weight back (no oneDNN:
    ``artifact.read`` alone) to the tensor the portable compile holds."""
    portable = fg.compile(packed.proto, fg.Config(cpu_kernels="portable"))
    got = _read_elsewhere(packed.path, tmp_path)
    for name, t in packed.released.items():
        c = got.graph.constants[name].const
        assert (c.device.type, c.dtype, c.shape, c.stride()) == ("cpu", t.dtype, t.shape, t.stride())
        assert torch.equal(c, portable.graph.constants[name].const), name


@pytest.mark.parametrize("precision", ["fp16", "bf16"])
@pytest.mark.parametrize("name", ["squeezenet", "products"])
def test_reduced_precision_round_trip(tmp_path, name, precision):
    """A float16 / bfloat16 model saves its released weights packed only, in their own type:
    packed as its primitives take them where they compute in that type (bfloat16 with its
    arithmetic; the load reorders nothing), else (float16; bfloat16 on AVX2) as the plain
    reduced operand, which the load packs for the float32 primitives. Either way the loaded
    model gives the same bits, and the portable kernels (and a model run elsewhere) get each
    weight back in its own type."""
    if not dnnl_available():
        pytest.skip("the oneDNN library does not load here")
    proto, model, feeds = _compiled(name, precision=precision)
    reduced = {"fp16": torch.float16, "bf16": torch.bfloat16}[precision]
    released = _released(model)
    assert any(t.dtype == reduced for t in released.values()), released
    model.save(tmp_path / "m.fgm")
    w = stored(tmp_path / "m.fgm")
    assert {"fp16": "F16", "bf16": "BF16"}[precision] in {e["dtype"] for e in w.packed_only.values()}
    assert {w.desc(n)["dt"] for n, t in released.items() if t.dtype == reduced} == {DTYPES[reduced]}   # not float32
    loaded = fg.load(tmp_path / "m.fgm")
    if compute_dtype(reduced) == reduced:
        assert loaded.load_info["weight_reorders"] == 0
    else:
        assert loaded.load_info["weight_reorders"] >= sum(t.dtype == reduced for t in released.values())
    _same(model.run(feeds), loaded.run(feeds))
    portable = fg.load(reseal(tmp_path / "m.fgm", tmp_path / "p.fgm",
                              lambda h: h["config"].update(cpu_kernels="portable")))
    plain = fg.compile(proto, fg.Config(precision=precision, cpu_kernels="portable"))
    elsewhere = _read_elsewhere(tmp_path / "m.fgm", tmp_path)
    for n, t in released.items():
        assert torch.equal(portable.graph.constants[n].const, plain.graph.constants[n].const), n
        assert torch.equal(elsewhere.graph.constants[n].const, plain.graph.constants[n].const), n
    _same(plain.run(feeds), portable.run(feeds))


@pytest.mark.skipif(torch.cuda.is_available(), reason="device 'auto' is the CPU only without CUDA")
@pytest.mark.parametrize("precision", ["fp32", "fp16"])
def test_device_auto_on_the_cpu_keeps_the_stored_forms(tmp_path, precision):
    """A model compiled with ``device="auto"`` on a machine without CUDA runs on the CPU backend:
    its load takes the stored forms as they are, like a ``device="cpu"`` one."""
    if not dnnl_available():
        pytest.skip("the oneDNN library does not load here")
    _, model, feeds = _compiled("products", device="auto", precision=precision)
    _, on_cpu, _ = _compiled("products", device="cpu", precision=precision)
    model.save(tmp_path / "a.fgm")
    on_cpu.save(tmp_path / "c.fgm")
    loaded = fg.load(tmp_path / "a.fgm")
    reorders = fg.load(tmp_path / "c.fgm").load_info["weight_reorders"]    # fp16: packed at load
    assert loaded.load_info["weight_reorders"] == reorders and set(_released(loaded)) == set(_released(model))
    assert reorders == 0 or precision == "fp16"
    _same(model.run(feeds), loaded.run(feeds))


_DESC_KEYS = ("dims", "padded", "strides", "blocks", "idxs", "size", "dt", "kind")


@settings(max_examples=int(os.environ.get("FG_FUZZ_EXAMPLES", "40")), deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(edits=st.lists(st.tuples(st.sampled_from(_DESC_KEYS), st.integers(0, 11),
                                 st.integers(0, 96) | st.integers(-2, 1 << 20)),
                      min_size=1, max_size=4), cut=st.integers(0, 96), which=st.integers(0, 50))
def test_fuzz_packed_description(packed, tmp_path, edits, cut, which):
    """Re-sealed edits of a stored layout description (and of its bytes' length): refused, or
    a run that does not crash (only a form whose every access stays inside its bytes, and
    which holds the weight's elements, reaches oneDNN or the reorder)."""
    names = sorted(packed.released)
    name = names[which % len(names)]

    def edit(w):
        desc = w.desc(name)
        for key, i, value in edits:
            if isinstance(desc[key], list) and desc[key]:
                desc[key][i % len(desc[key])] = value
            elif isinstance(desc[key], list):
                desc[key].append(value)
            else:
                desc[key] = value
        w.set_form(name, desc, w.form_bytes(name)[:len(w.form_bytes(name)) - cut] if cut else None)
    try:
        loaded = fg.load(reseal(packed.path, tmp_path / "f.fgm", parts_fn=weights_edit(edit)))
    except ArtifactError as exc:
        assert repr(name) in str(exc), str(exc)
        return
    loaded.run(packed.feeds)


def two_stream_model():
    """Two independent conv branches that meet: the stream planner puts them on two streams."""
    w = [numpy_helper.from_array(_f32(32, 16, 3, 3) * 0.2, f"w{i}") for i in (1, 2)]
    return _model([helper.make_node("Conv", ["x", "w1"], ["a"], pads=[1, 1, 1, 1]),
                   helper.make_node("Relu", ["a"], ["ar"]),
                   helper.make_node("Conv", ["x", "w2"], ["b"], pads=[1, 1, 1, 1]),
                   helper.make_node("Sigmoid", ["b"], ["bs"]), helper.make_node("Add", ["ar", "bs"], ["y"])],
                  [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16, 32, 32])],
                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 32, 32, 32])], w)


@pytest.fixture(scope="module")
def two_streams(tmp_path_factory):
    model = fg.compile(two_stream_model(), fg.Config(streams=2))
    if model.plan.streams is None or model.plan.streams.num_streams < 2:
        pytest.skip("the stream planner kept one stream")
    path = tmp_path_factory.mktemp("fgm2") / "two.fgm"
    model.save(path)
    return model, path


def test_stream_plan_round_trip(two_streams):
    model, path = two_streams
    loaded = fg.load(path)
    assert loaded.plan.streams.to_dict() == model.plan.streams.to_dict()
    feeds = {"x": _f32(1, 16, 32, 32)}
    _same(model.run(feeds), loaded.run(feeds))


def _plan_edit(fn):
    return json_part_edit("report", fn)


def _deadlock(r):
    """The meeting node records an event that the first node of the other stream waits on."""
    sp = r["plan"]["streams"]
    last = r["plan"]["order"][-1]
    other = next(lst[0] for k, lst in enumerate(sp["per_stream"]) if k != sp["stream_of"][last])
    sp["events"].append({"id": 99, "producer": last, "stream": sp["stream_of"][last]})
    sp["records"][last] = 99
    sp["waits"][other] = sp["waits"].get(other, []) + [99]


@pytest.mark.parametrize("fn, words", [
    (lambda r: r["plan"]["streams"].update(waits={}), ["race"]),
    (_deadlock, ["deadlock"]),
    (lambda r: r["plan"]["streams"].update(num_streams=1 << 20), ["stream count"]),
    (lambda r: r["plan"]["streams"]["per_stream"].reverse(), ["per-stream"]),
])
def test_hostile_stream_plan(two_streams, tmp_path, fn, words):
    refused(reseal(two_streams[1], tmp_path / "s.fgm", parts_fn=_plan_edit(fn)), *words)


@pytest.mark.parametrize("fn, words", [
    (lambda r: r["plan"]["order"].reverse(), ["before the producer"]),
    (lambda r: r["plan"]["order"].pop(), ["each of the graph's nodes once"]),
    (lambda r: r["plan"].update(memory_mode="roomy"), ["memory mode"]),
    (lambda r: r["plan"].update(arena_bytes=1 << 50), ["larger than all its slots"]),
    (lambda r: r["plan"]["slots"].update(d=[r["plan"]["arena_bytes"], 96]), ["does not hold"]),
    (lambda r: r["plan"]["slots"].update(d=[0, 8]), ["does not hold"]),
    (lambda r: r["plan"]["slots"].update(ghost=[0, 8]), ["unknown value"]),
    (lambda r: r.update(strides={"d": [1, 1, 1]}), ["dense layout"]),
    (lambda r: r.update(strides={"x": [12, 4, 1]}), ["dense layout"]),
    (lambda r: r.update(plan=[1]), ["plan"]),
    (lambda r: r["plan"].pop("order"), ["plan is malformed"]),
])
def test_hostile_plan(saved, tmp_path, fn, words):
    refused(reseal(saved["diamond"][1], tmp_path / "p.fgm", parts_fn=_plan_edit(fn)), *words)


def test_plan_without_arena_still_runs(saved, tmp_path):
    """A file whose plan was dropped loads as memory "off" (every tensor its own allocation)."""
    path = reseal(saved["diamond"][1], tmp_path / "n.fgm", parts_fn=_plan_edit(lambda r: r.update(plan=None)))
    feeds = FEEDS["diamond"]()
    loaded = fg.load(path)
    assert loaded.plan is None
    _same(saved["diamond"][0].run(feeds), loaded.run(feeds))


def _squeezenet(streams: int):
    from fusegraph.testing import zoo
    proto = zoo.random_light_model("squeezenet")
    return proto, fg.compile(proto, fg.Config(streams=streams))


@pytest.mark.parametrize("streams", [1, 2])
def test_overlapping_arena_slots_are_refused(tmp_path, streams):
    """A plan re-sealed with one slot moved onto bytes another live value holds is refused
    naming both values; the untouched plan (with streams, in-place tenants) loads."""
    from fusegraph.testing import zoo
    proto, model = _squeezenet(streams)
    path = tmp_path / "m.fgm"
    model.save(path)
    feeds = zoo.random_feeds(proto)
    _same(model.run(feeds), fg.load(path).run(feeds))
    slots = model.plan.slots
    # move the value with the biggest slot to offset 0 and to its neighbour's offset
    big = max(slots, key=lambda k: slots[k][1])
    refusals = 0
    for target in sorted({off for off, _ in slots.values()})[:6]:
        if target == slots[big][0]:
            continue
        edit = _plan_edit(lambda r, t=target: r["plan"]["slots"].update({big: [t, slots[big][1]]}))
        bad = reseal(path, tmp_path / f"o{target}.fgm", parts_fn=edit)
        try:
            loaded = fg.load(bad)
        except ArtifactError as exc:
            assert "overlapping arena bytes" in str(exc) and repr(big) in str(exc)
            refusals += 1
            continue
        _same(model.run(feeds), loaded.run(feeds))   # a move onto bytes free meanwhile is fine
    assert refusals


def test_slot_shifted_by_64_bytes_is_refused(saved, tmp_path):
    """The issue's case: shifting one slot by 64 bytes used to load and compute wrong numbers."""
    model, path = saved["diamond"][:2]
    slots = model.plan.slots
    moved = 0
    for name, (off, size) in slots.items():
        others = [(o, s) for n, (o, s) in slots.items() if n != name]
        if off + 64 + size <= model.plan.arena_bytes and any(o < off + 64 + size and off + 64 < o + s
                                                             for o, s in others):
            edit = _plan_edit(lambda r, n=name, o=off, s=size: r["plan"]["slots"].update({n: [o + 64, s]}))
            try:
                loaded = fg.load(reseal(path, tmp_path / "s.fgm", parts_fn=edit))
            except ArtifactError as exc:
                assert "overlapping" in str(exc) or "does not hold" in str(exc) or "in place" in str(exc)
                moved += 1
                continue
            feeds = FEEDS["diamond"]()
            _same(model.run(feeds), loaded.run(feeds))
    assert moved


# ----- what a re-sealed file says of its values is derived, not trusted (issue 39 #2) ---------
def _conv_chain():
    """x -> Conv+Relu -> Conv+Relu -> Conv -> y (three fused convolutions, 8 x 16 x 16 each; the
    middle one reads only the first one's output)."""
    rng = np.random.default_rng(0)
    ws = [(rng.standard_normal(s) * np.sqrt(2 / np.prod(s[1:]))).astype(np.float32)
          for s in ((8, 4, 3, 3), (8, 8, 3, 3), (8, 8, 3, 3))]
    nodes = [helper.make_node("Conv", ["x", "w0"], ["a"], pads=[1, 1, 1, 1]), helper.make_node("Relu", ["a"], ["b"]),
             helper.make_node("Conv", ["b", "w1"], ["c"], pads=[1, 1, 1, 1]), helper.make_node("Relu", ["c"], ["d"]),
             helper.make_node("Conv", ["d", "w2"], ["y"], pads=[1, 1, 1, 1])]
    return _model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 16, 16])],
                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8, 16, 16])],
                  [numpy_helper.from_array(w, f"w{i}") for i, w in enumerate(ws)])


@pytest.fixture(scope="module")
def conv_chain(tmp_path_factory):
    model = fg.compile(_conv_chain())
    path = tmp_path_factory.mktemp("conv") / "c.fgm"
    model.save(path)
    convs = [n for n in model.graph.nodes if "Conv" in n.op_type]
    assert len(convs) == 3 and convs[1].inputs[0] is convs[0].outputs[0]
    return model, path, convs


def test_convolution_over_its_own_input_is_refused(conv_chain, tmp_path):
    """issue 39 #2: the middle convolution's output re-sealed into its input's slot, marked
    ``inplace``: a convolution may not write over the input it reads (the op registry allows
    in place only its residual), so the file is refused; before, it loaded and ran 25-40 % off."""
    model, path, convs = conv_chain
    src, out = convs[0].outputs[0].name, convs[1].outputs[0].name

    def edit(r):
        r["plan"]["slots"][out] = list(r["plan"]["slots"][src])
        r["plan"]["kinds"][out] = "inplace"
    refused(reseal(path, tmp_path / "i.fgm", parts_fn=_plan_edit(edit)), repr(out), "in place", "tampered plan")


def test_a_view_the_op_does_not_make_is_refused(conv_chain, tmp_path):
    """issue 39 #2: a value marked ``view`` (the runtime then skips its copy guard) must be the
    output of a view op."""
    model, path, convs = conv_chain
    out = convs[1].outputs[0].name
    refused(reseal(path, tmp_path / "v.fgm", parts_fn=_plan_edit(lambda r: r["plan"]["kinds"].update({out: "view"}))),
            repr(out), "a view", "tampered plan")


def test_legitimate_inplace_residual_still_loads(tmp_path):
    """The planner's own in-place takeover (a convolution accumulating onto its residual) is
    derived from the registry too, so it loads and matches the compiled model."""
    model = fg.compile(_residual())
    assert "inplace" in model.plan.kinds.values()
    model.save(tmp_path / "r.fgm")
    x = {"x": np.random.default_rng(1).standard_normal((1, 8, 16, 16)).astype(np.float32)}
    _same(model.run(x), fg.load(tmp_path / "r.fgm").run(x))


def _residual():
    """x -> Conv+Relu (b) -> Conv+Relu (d) -> Conv(d) + b: the last convolution accumulates onto
    its residual b in b's bytes."""
    rng = np.random.default_rng(2)
    ws = [(rng.standard_normal((8, 8, 3, 3)) * np.sqrt(2 / 72)).astype(np.float32) for _ in range(3)]
    nodes = [helper.make_node("Conv", ["x", "w0"], ["a"], pads=[1, 1, 1, 1]), helper.make_node("Relu", ["a"], ["b"]),
             helper.make_node("Conv", ["b", "w1"], ["c"], pads=[1, 1, 1, 1]), helper.make_node("Relu", ["c"], ["d"]),
             helper.make_node("Conv", ["d", "w2"], ["e"], pads=[1, 1, 1, 1]), helper.make_node("Add", ["e", "b"], ["y"])]
    return _model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, 16, 16])],
                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8, 16, 16])],
                  [numpy_helper.from_array(w, f"w{i}") for i, w in enumerate(ws)])


def _node_edit(index, fn):
    def edit(g):
        fn(g["nodes"][index], g)
    return json_part_edit("graph", edit)


@pytest.mark.parametrize("what, fn", [
    ("pads", lambda n, g: n["attrs"].update(pads=[0, 0, 0, 0])),
    ("strides", lambda n, g: n["attrs"].update(strides=[2, 2])),
    ("weight input", lambda n, g: n["inputs"].__setitem__(1, "w0")),
    ("rewired input", lambda n, g: n["inputs"].__setitem__(0, "x")),
])
def test_resealed_graph_edits_are_refused_at_load(conv_chain, tmp_path, what, fn):
    """issue 39 #2: a re-sealed graph whose middle convolution's pads / strides / weight / input
    were changed no longer yields the output types stored for it; the load re-infers every
    node's output types from the op registry and refuses the file (before, it loaded and failed
    at run time, or computed something else)."""
    model, path, convs = conv_chain
    index = [n.name for n in model.graph.nodes].index(convs[1].name)
    text = refused(reseal(path, tmp_path / "g.fgm", parts_fn=_node_edit(index, fn)))
    assert convs[1].name in text or f"%{convs[1].outputs[0].name} " in text, text
