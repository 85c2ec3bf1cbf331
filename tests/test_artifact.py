"""The .fgm artifact: round trip, no pass on load, weights read once into private memory, every refusal, and a fuzz test.

Hostile files are crafted two ways: raw byte edits (caught by layout and checksums) and
"resealed" edits (parts changed, checksums recomputed), which reach the schema checks.
"""
from __future__ import annotations

import hashlib
import json
import math
import os
import pickle
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

import fusegraph as fg
from fusegraph import artifact as A
from fusegraph.compiler import driver as compiler
from fusegraph.compiler import planning
from fusegraph.errors import ArtifactError, FusegraphError
from fusegraph.ir import DType, Graph
from fusegraph.ir.serialize import graph_from_dict, graph_to_dict

RNG = np.random.default_rng(0)


def _f32(*shape):
    return RNG.standard_normal(shape).astype(np.float32)


def _model(nodes, inputs, outputs, inits=()):
    g = helper.make_graph(nodes, "t", inputs, outputs, list(inits))
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def chain_model():
    """Mul -> Add -> Relu with a symbolic batch dim."""
    return _model([helper.make_node("Mul", ["x", "w"], ["a"]), helper.make_node("Add", ["a", "b"], ["c"]),
                   helper.make_node("Relu", ["c"], ["y"])],
                  [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 8])],
                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 8])],
                  [numpy_helper.from_array(_f32(8), "w"), numpy_helper.from_array(_f32(8), "b")])


def diamond_model():
    """Two inputs, two outputs, a shared intermediate, int64 arithmetic beside float."""
    return _model([helper.make_node("Sub", ["x", "z"], ["d"]), helper.make_node("Tanh", ["d"], ["t"]),
                   helper.make_node("Sigmoid", ["d"], ["s"]), helper.make_node("Mul", ["t", "s"], ["m"]),
                   helper.make_node("Div", ["m", "k"], ["y"]), helper.make_node("Add", ["i", "j"], ["n"])],
                  [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 4]),
                   helper.make_tensor_value_info("z", TensorProto.FLOAT, [3, 4]),
                   helper.make_tensor_value_info("i", TensorProto.INT64, [5])],
                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3, 4]),
                   helper.make_tensor_value_info("n", TensorProto.INT64, [5])],
                  [numpy_helper.from_array(_f32(1, 4) + 3, "k"),
                   numpy_helper.from_array(np.arange(5, dtype=np.int64), "j")])


FEEDS = {"chain": lambda: {"x": _f32(3, 8)},
         "diamond": lambda: {"x": _f32(2, 3, 4), "z": _f32(3, 4), "i": np.arange(5, dtype=np.int64) * 7}}
MODELS = {"chain": chain_model, "diamond": diamond_model}


def _same(a: dict, b: dict) -> None:
    assert list(a) == list(b)
    for k in a:
        assert a[k].dtype == b[k].dtype and a[k].shape == b[k].shape
        assert a[k].tobytes() == b[k].tobytes(), k


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    folder = tmp_path_factory.mktemp("fgm")
    out = {}
    for name, build in MODELS.items():
        # the chain stays three nodes: the malformed-graph cases reorder and edit them
        model = fg.compile(build(), fg.Config(disabled_passes=("elementwise_chain",)))
        path = folder / f"{name}.fgm"
        model.save(path)
        out[name] = (model, path, path.read_bytes())
    return out


# ----- round trip ----------------------------------------------------------------------------
@pytest.mark.parametrize("name", list(MODELS))
def test_round_trip_is_bitwise(saved, name):
    model, path, _ = saved[name]
    loaded = fg.load(path)
    feeds = FEEDS[name]()
    _same(model.run(feeds), loaded.run(feeds))
    assert loaded.inputs == model.inputs and loaded.outputs == model.outputs
    assert loaded.config == model.config
    assert loaded.report.op_histogram == model.report.op_histogram
    assert loaded.report.kernel_count == model.report.kernel_count


@pytest.mark.slow
@pytest.mark.parametrize("name", ["bert", "gpt2"])
def test_transformer_round_trip(transformer_models, tmp_path, name):
    from model_builders import transformer_feeds
    model = fg.compile(str(transformer_models[name]))
    model.save(tmp_path / "m.fgm")
    feeds = transformer_feeds(seed=1, batch=2, seq=7)
    _same(model.run(feeds), fg.load(tmp_path / "m.fgm").run(feeds))


def test_config_travels(tmp_path):
    cfg = fg.Config(streams=2, memory="tight", disabled_passes=("cse",), tensor_lifetimes=(("a", 0, 2),),
                    threads=1)
    model = fg.compile(chain_model(), config=cfg)
    model.save(tmp_path / "m.fgm")
    assert fg.load(tmp_path / "m.fgm").config == cfg


def test_load_leaves_the_process_thread_count_alone(tmp_path):
    """A model saved with threads=1 runs at 1 thread, and the caller's count stays as it was;
    a re-sealed absurd count is bounded by the machine's cores; ``threads=`` overrides."""
    import torch
    from fusegraph.config import machine_cores
    fg.compile(chain_model(), config=fg.Config(threads=1)).save(tmp_path / "m.fgm")
    before = torch.get_num_threads()
    seen = []
    loaded = fg.load(tmp_path / "m.fgm")
    assert torch.get_num_threads() == before and loaded.config.threads == 1
    loaded.run({"x": _f32(2, 8)}, hook=lambda i, phase, outs: seen.append(torch.get_num_threads()))
    assert set(seen) == {1} and torch.get_num_threads() == before
    huge = reseal(tmp_path / "m.fgm", tmp_path / "h.fgm", header_fn=lambda h: h["config"].update(threads=4096))
    big = fg.load(huge)
    assert big.config.threads == machine_cores() and big.load_info["threads_stored"] == 4096
    assert fg.load(huge, threads=1).config.threads == 1 and torch.get_num_threads() == before


# reading the stored plan back is not planning: ExecutionPlan is pure data (its accessors and the
# comprehensions of its from_dict); anything else under plan/ or passes/ is
_PLAN_DATA = {"exec_plan.py": {"uses_arena", "<dictcomp>", "<listcomp>", "<genexpr>"}}


def _calls_into(fn, *folders: str) -> set[str]:
    """Names of Python functions defined under ``folders`` that ``fn()`` calls (via sys.setprofile)."""
    roots = [str(Path(fg.__file__).parent / f) + os.sep for f in folders]
    seen: set[str] = set()

    def profile(frame, event, arg):
        code = frame.f_code
        if event == "call" and any(code.co_filename.startswith(r) for r in roots) and \
                not (code.co_name.startswith("__") or code.co_name in ("to_dict", "from_dict", "<module>")
                     or code.co_name in _PLAN_DATA.get(Path(code.co_filename).name, ())):
            seen.add(f"{Path(code.co_filename).name}:{code.co_name}")
    sys.setprofile(profile)
    try:
        fn()
    finally:
        sys.setprofile(None)
    return seen


def test_load_runs_no_pass_and_no_plan(saved, monkeypatch):
    assert _calls_into(lambda: fg.compile(chain_model()), "passes")  # the detector sees compile's passes
    box = []
    stages = [(compiler, "optimize"), (compiler, "plan_and_bind"), (planning, "plan_execution"),
              (planning, "plan_memory")]
    for module, name in stages:                         # and the stage entry points must not be called
        monkeypatch.setattr(module, name, lambda *a, **k: pytest.fail("load ran a compile stage"))
    assert _calls_into(lambda: box.append(fg.load(saved["chain"][1])), "passes", "plan") == set()
    assert box[0].load_info["seconds"] > 0


def test_weights_alias_one_private_copy_of_the_file(saved):
    """Loading reads the file once into private memory: the file is not mapped afterwards, and
    every weight is a view into that one private region (nothing copied per tensor)."""
    maps = Path("/proc/self/maps")
    if not maps.exists():
        pytest.skip("needs /proc/self/maps")
    path = saved["chain"][1]
    loaded = fg.load(path)
    regions = []
    for line in maps.read_text().splitlines():
        fields = line.split(maxsplit=5)
        lo, hi = (int(x, 16) for x in fields[0].split("-"))
        regions.append((lo, hi, fields[5] if len(fields) == 6 else ""))
    assert not [r for r in regions if r[2] == str(path.resolve())], "the artifact file is still mapped"
    consts = [v.const for v in loaded.graph.constants.values()]
    assert consts
    homes = {next((lo, hi, name) for lo, hi, name in regions if lo <= t.data_ptr() < hi) for t in consts}
    assert len(homes) == 1 and next(iter(homes))[2] == "", homes


def test_nothing_is_unpickled(saved, monkeypatch):
    def boom(*a, **k):
        raise AssertionError("unpickling during load")
    for mod, name in ((pickle, "load"), (pickle, "loads"), (pickle, "Unpickler"), (torch, "load"),
                      (np, "load")):
        monkeypatch.setattr(mod, name, boom)
    fg.load(saved["diamond"][1])
    for src in (A.__file__, __import__("fusegraph.ir.serialize", fromlist=["x"]).__file__):
        text = Path(src).read_text()
        assert "pickle" not in text.replace("unpickled", "") and "torch.load" not in text


def test_permuted_constant_keeps_layout_and_bits(tmp_path):
    g = Graph("perm")
    x = g.add_input("x", DType.FLOAT, (5, 3))
    w = g.add_constant("w", torch.randn(3, 5).t())  # a transposed view
    n = g.add_node("Add", [x, w], version=17)
    g.outputs.append(n.outputs[0])
    model = fg.compile(g)
    model.save(tmp_path / "p.fgm")
    loaded = fg.load(tmp_path / "p.fgm")
    assert loaded.graph.constants["w"].const.stride() == model.graph.constants["w"].const.stride()
    feeds = {"x": _f32(5, 3)}
    _same(model.run(feeds), loaded.run(feeds))


def test_attribute_encoding_round_trips():
    g = Graph("attrs")
    x = g.add_input("x", DType.FLOAT, ("N", None, 4))
    attrs = {"i": -3, "f": 0.1, "nan": math.nan, "inf": -math.inf, "s": "héllo", "b": True, "none": None,
             "ints": [1, 2, 3], "tup": (1, (2.5, "x")), "d": {"k": [1, {"z": 2}]}, "bytes": b"\x00\xff",
             "dt": DType.BFLOAT16, "t": torch.arange(6, dtype=torch.int32).reshape(2, 3),
             "np": np.ones(3, np.float16), "g": np.int64(7)}
    n = g.add_node("Identity", [x], attrs=attrs, version=17)
    n.meta["rule"] = "r"
    n.outputs[0].meta.update(onnx_name="o", junk=object())  # unencodable meta is dropped
    n.outputs[0].flags.add("external")
    g.outputs.append(n.outputs[0])
    data, tensors = graph_to_dict(g)
    g2 = graph_from_dict(json.loads(json.dumps(data, allow_nan=False)), tensors)
    a = g2.nodes[0].attrs
    assert a["i"] == -3 and a["f"] == 0.1 and math.isnan(a["nan"]) and a["inf"] == -math.inf
    assert a["tup"] == (1, (2.5, "x")) and a["d"] == {"k": [1, {"z": 2}]} and a["bytes"] == b"\x00\xff"
    assert a["dt"] is DType.BFLOAT16 and a["ints"] == [1, 2, 3] and a["none"] is None and a["g"] == 7
    assert torch.equal(a["t"], attrs["t"]) and isinstance(a["np"], np.ndarray) and a["np"].dtype == np.float16
    out = g2.nodes[0].outputs[0]
    assert out.meta == {"onnx_name": "o"} and out.flags == {"external"}
    assert g2.inputs[0].shape == ("N", None, 4)
    g2.verify()


# ----- crafting hostile files ------------------------------------------------------------------
def reseal(src: Path, dst: Path, header_fn=None, parts_fn=None) -> Path:
    """Edit the header and/or parts, then write a file with every checksum recomputed."""
    header, parts = A.unpack(src)
    header.pop("parts")
    header.pop("parts_size")
    if header_fn:
        header_fn(header)
    if parts_fn:
        parts_fn(parts)
    A.pack(dst, header, parts)
    return dst


def raw_write(dst: Path, header: dict, parts: dict) -> Path:
    """Write ``header`` verbatim (its own part table, right or wrong) over canonically placed parts."""
    blob = json.dumps(header).encode()
    data = bytearray(A.PREFIX.pack(A.MAGIC, len(blob), hashlib.sha256(blob).digest()) + blob)
    base, off = A.align(len(data)), 0
    for name in A.PARTS:
        data += b"\0" * (base + off - len(data)) + parts[name]
        off = A.align(off + len(parts[name]))
    dst.write_bytes(bytes(data))
    return dst


def refused(path, *words):
    with pytest.raises(ArtifactError) as info:
        fg.load(path)
    for w in words:
        assert w in str(info.value), str(info.value)
    return str(info.value)


@pytest.mark.parametrize("cut", [0, 7, 20, 47, 60, -700, -200, -1])
def test_truncated(saved, tmp_path, cut):
    data = saved["chain"][2]
    (tmp_path / "t.fgm").write_bytes(data[:cut])
    refused(tmp_path / "t.fgm")


def test_appended_bytes(saved, tmp_path):
    (tmp_path / "t.fgm").write_bytes(saved["chain"][2] + b"\0")
    refused(tmp_path / "t.fgm", "appended")


def test_bit_flips_anywhere_are_caught(saved, tmp_path):
    data = saved["chain"][2]
    for pos in range(0, len(data), 7):
        bad = bytearray(data)
        bad[pos] ^= 0x10
        (tmp_path / "f.fgm").write_bytes(bytes(bad))
        refused(tmp_path / "f.fgm")


@pytest.mark.parametrize("part", A.PARTS)
def test_checksum_mismatch_names_the_part(saved, tmp_path, part):
    header, parts = A.unpack(saved["chain"][1])
    parts[part] = bytes([parts[part][0] ^ 1]) + parts[part][1:]
    refused(raw_write(tmp_path / "c.fgm", header, parts), "checksum mismatch", part)


def test_not_an_artifact(tmp_path):
    (tmp_path / "m.onnx").write_bytes(chain_model().SerializeToString())
    refused(tmp_path / "m.onnx", "not a fusegraph artifact")
    refused(tmp_path / "missing.fgm", "cannot open")
    refused(tmp_path, "cannot open")


def test_future_format_version(saved, tmp_path):
    path = reseal(saved["chain"][1], tmp_path / "v.fgm",
                  lambda h: h.update(format_version=A.FORMAT_VERSION + 1))
    refused(path, "newer", "upgrade fusegraph")


def test_older_format_version(saved, tmp_path):
    path = reseal(saved["chain"][1], tmp_path / "v.fgm", lambda h: h.update(format_version=1))
    refused(path, "format version 1 is older", "recompile")


def test_large_weights_hash_in_chunks(tmp_path):
    """A weights part of several chunks: every chunk has its digest; a flip in any one is caught."""
    from fusegraph.artifact.container import CHUNK
    g = Graph("big")
    x = g.add_input("x", DType.FLOAT, (3, CHUNK // 4 + 5))
    w = g.add_constant("w", torch.randn(3, CHUNK // 4 + 5))
    n = g.add_node("Add", [x, w], version=17)
    g.outputs.append(n.outputs[0])
    model = fg.compile(g)
    model.save(tmp_path / "b.fgm")
    header, _ = A.unpack(tmp_path / "b.fgm")
    chunks = header["parts"]["weights"]["xxh3_128"]
    assert len(chunks) == -(-header["parts"]["weights"]["length"] // CHUNK) >= 3
    data = (tmp_path / "b.fgm").read_bytes()
    end = len(data)
    for pos in (end - 3, end - CHUNK - 100, end - 2 * CHUNK + 7):
        bad = bytearray(data)
        bad[pos] ^= 0x04
        (tmp_path / "f.fgm").write_bytes(bytes(bad))
        refused(tmp_path / "f.fgm", "checksum mismatch", "weights")
    feeds = {"x": _f32(3, CHUNK // 4 + 5)}
    _same(model.run(feeds), fg.load(tmp_path / "b.fgm").run(feeds))


@pytest.mark.parametrize("edit", [
    lambda p: p["weights"].update(offset=p["weights"]["offset"] + 64),
    lambda p: p["graph"].update(offset=-64),
    lambda p: p["report"].update(length=1 << 62),
    lambda p: p["weights"].update(length=p["weights"]["length"] + 1),
    lambda p: p.update({"../../etc/passwd": {"offset": 0, "length": 1, "xxh3_128": "0" * 32}}),
    lambda p: p.pop("report"),
    lambda p: p["graph"].update(offset="0"),
])
def test_parts_that_escape_or_lie(saved, tmp_path, edit):
    header, parts = A.unpack(saved["chain"][1])
    edit(header["parts"])
    refused(raw_write(tmp_path / "e.fgm", header, parts))


def test_absurd_header_length(saved, tmp_path):
    data = bytearray(saved["chain"][2])
    data[8:16] = (1 << 60).to_bytes(8, "little")
    (tmp_path / "h.fgm").write_bytes(bytes(data))
    refused(tmp_path / "h.fgm", "absurd header length")


@pytest.mark.parametrize("edit, words", [
    (lambda h: h["cpu"].update(requires=["avx512_unobtainium"]), ["avx512_unobtainium", "recompile"]),
    (lambda h: h["cpu"].update(arch="riscv64"), ["riscv64", "recompile"]),
    (lambda h: h["cpu"].update(capability="AVX1024"), ["AVX1024", "recompile"]),
    (lambda h: h["device"].update(kind="tpu"), ["tpu", "recompile"]),
    (lambda h: h.update(byteorder="big"), ["endian"]),
])
def test_built_for_another_machine(saved, tmp_path, edit, words):
    refused(reseal(saved["chain"][1], tmp_path / "m.fgm", edit), *words)


def test_cpu_lacking_the_instruction_set(saved, monkeypatch):
    header, _ = A.unpack(saved["chain"][1])
    if not header["cpu"]["requires"]:
        pytest.skip("built without SIMD requirements")
    here = A.machine()
    monkeypatch.setattr(A.store, "machine", lambda: {**here, "capability": "DEFAULT", "flags": {"sse2"}})
    refused(saved["chain"][1], "lacks", "recompile")


def test_portable_build_loads_on_an_older_cpu(tmp_path, monkeypatch):
    """The refusal's hint works: ATEN_CPU_CAPABILITY=default builds an artifact any x86 CPU takes."""
    import subprocess
    path = tmp_path / "portable.fgm"
    (tmp_path / "m.onnx").write_bytes(chain_model().SerializeToString())
    code = f"import fusegraph as fg; fg.compile({str(tmp_path / 'm.onnx')!r}).save({str(path)!r})"
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120,
                   env={**os.environ, "ATEN_CPU_CAPABILITY": "default"})
    header, _ = A.unpack(path)
    assert header["cpu"]["capability"] == "DEFAULT" and header["cpu"]["requires"] == []
    here = A.machine()
    monkeypatch.setattr(A.store, "machine", lambda: {**here, "capability": "DEFAULT", "flags": {"sse2"}})
    feeds = FEEDS["chain"]()
    np.testing.assert_allclose(fg.load(path).run(feeds)["y"], fg.compile(tmp_path / "m.onnx").run(feeds)["y"],
                               rtol=1e-6)


def test_weights_part_is_plain_safetensors(saved):
    from safetensors.torch import load
    _, parts = A.unpack(saved["diamond"][1])
    tensors = load(parts["weights"])
    model = saved["diamond"][0]
    for name, v in model.graph.constants.items():
        assert torch.equal(tensors[name], v.const)


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
def test_cuda_artifact_without_cuda(saved, tmp_path):
    path = reseal(saved["chain"][1], tmp_path / "g.fgm",
                  lambda h: h["device"].update(kind="cuda", capability=[8, 0]))
    refused(path, "CUDA", "recompile")


def json_part_edit(part: str, fn):
    """A ``reseal`` ``parts_fn`` that lets ``fn`` edit the decoded JSON part ``part`` in place."""
    def parts_fn(parts):
        doc = json.loads(parts[part])
        fn(doc)
        parts[part] = json.dumps(doc).encode()
    return parts_fn


def _graph_edit(fn):
    return json_part_edit("graph", fn)


@pytest.mark.parametrize("fn, words", [
    (lambda g: g["nodes"].reverse(), ["verify", "defined later"]),
    (lambda g: g["outputs"].append("nowhere"), ["unknown value"]),
    (lambda g: g["nodes"][0].update(inputs=["x", "x", "ghost"]), ["unknown value"]),
    (lambda g: g["values"][0].update(dtype=999), ["dtype"]),
    (lambda g: g["values"][1].update(shape=[9]), ["weights hold"]),
    (lambda g: g["values"][0].update(shape=[-1, 8]), ["shape"]),
    (lambda g: g["values"].append(dict(g["values"][0])), ["defined twice"]),
    (lambda g: g["nodes"][0].update(attrs={"a": {"$pickle": "x"}}), ["unknown tag"]),
    (lambda g: g["nodes"][0].update(attrs={"a": {"$tensor": "nope"}}), ["not in the weights"]),
    (lambda g: g["nodes"][0].update(op_type="NoSuchOp"), ["NoSuchOp", "recompile"]),
    (lambda g: g["nodes"][0].update(version="17"), ["version"]),
    (lambda g: g.update(schema=2), ["schema"]),
    (lambda g: g.pop("nodes"), ["nodes"]),
])
def test_malformed_graph(saved, tmp_path, fn, words):
    refused(reseal(saved["chain"][1], tmp_path / "g.fgm", parts_fn=_graph_edit(fn)), *words)


@pytest.mark.parametrize("blob", [b"{not json", b"[" * 100000 + b"]" * 100000, b"", b"\xff\xfe"],
                         ids=["syntax", "deep", "empty", "binary"])
def test_malformed_json(saved, tmp_path, blob):
    refused(reseal(saved["chain"][1], tmp_path / "j.fgm", parts_fn=lambda p: p.update(graph=blob)))


def _weights_edit(fn):
    def parts_fn(parts):
        w = parts["weights"]
        n = int.from_bytes(w[:8], "little")
        head = json.loads(w[8:8 + n])
        fn(head)
        blob = json.dumps(head).encode()
        blob += b" " * (-(8 + len(blob)) % 8)
        parts["weights"] = len(blob).to_bytes(8, "little") + blob + w[8 + n:]
    return parts_fn


@pytest.mark.parametrize("fn", [
    lambda h: h["w"].update(data_offsets=[0, 1 << 40]),
    lambda h: h["w"].update(shape=[1 << 30, 1 << 30]),
    lambda h: h["w"].update(dtype="PICKLE"),
    lambda h: h["w"].update(data_offsets=h["b"]["data_offsets"]),
    lambda h: h["w"].update(data_offsets=[2, 34]),
    lambda h: h["w"].update(shape=[-8]),
    lambda h: h["__metadata__"].update({"fusegraph.perms": json.dumps({"w": [1, 1]})}),
    lambda h: h.pop("w"),
])
def test_malformed_weights(saved, tmp_path, fn):
    refused(reseal(saved["chain"][1], tmp_path / "w.fgm", parts_fn=_weights_edit(fn)))


def test_unknown_config_key_in_header(saved, tmp_path):
    path = reseal(saved["chain"][1], tmp_path / "k.fgm", lambda h: h["config"].update(streamz=2))
    refused(path, "streamz")


# ----- fuzz ------------------------------------------------------------------------------------
_FUZZ = settings(max_examples=int(os.environ.get("FG_FUZZ_EXAMPLES", "150")), deadline=5000,
                 suppress_health_check=[HealthCheck.function_scoped_fixture])


def _mutate(data: bytes, other: bytes, how) -> bytes:
    kind, a, b, c = how
    n = len(data)
    if kind == "flip":
        out = bytearray(data)
        for pos, byte in zip(a, b):
            out[pos % n] = byte
        return bytes(out)
    if kind == "truncate":
        return data[:a[0] % n]
    if kind == "splice":
        return data[:a[0] % (n + 1)] + other[b[0] % (len(other) + 1):]
    if kind == "insert":
        return data[:a[0] % (n + 1)] + bytes(b) + data[a[0] % (n + 1):]
    return data[:a[0] % n] + data[a[0] % n + 1 + c:]  # delete


_HOW = st.tuples(st.sampled_from(["flip", "truncate", "splice", "insert", "delete"]),
                 st.lists(st.integers(0, 1 << 20), min_size=1, max_size=8),
                 st.lists(st.integers(0, 255), min_size=1, max_size=8), st.integers(0, 64))


@_FUZZ
@given(how=_HOW, other=st.sampled_from(["chain", "diamond"]))
def test_fuzz_raw_bytes(saved, tmp_path, how, other):
    mutated = _mutate(saved["chain"][2], saved[other][2], how)
    path = tmp_path / "z.fgm"
    path.write_bytes(mutated)
    try:
        loaded = fg.load(path)
    except ArtifactError:
        return
    # every byte is covered by a checksum, the layout or the zero-padding rule: a file that loads
    # is one of the originals (a splice can reproduce the other one whole) and runs exactly like it
    name = next(k for k, v in saved.items() if v[2] == mutated)
    feeds = FEEDS[name]()
    _same(saved[name][0].run(feeds), loaded.run(feeds))


_LEAF = (st.none() | st.booleans() | st.integers(-5, 1 << 40) | st.floats(allow_nan=False, allow_infinity=False)
         | st.text(max_size=8) | st.sampled_from(["x", "w", "a", "Add", "$tensor", "$tuple"]))
_JSON = st.recursive(_LEAF, lambda kids: st.lists(kids, max_size=4)
                     | st.dictionaries(st.text(max_size=8), kids, max_size=3), max_leaves=12)


def _replace_at(tree, path: list[int], value):
    """Replace the subtree reached by following ``path`` (indices modulo each container's size)."""
    node, parent, key = tree, None, None
    for step in path:
        if isinstance(node, dict) and node:
            parent, key = node, sorted(node)[step % len(node)]
        elif isinstance(node, list) and node:
            parent, key = node, step % len(node)
        else:
            break
        node = parent[key]
    if parent is None:
        return value
    parent[key] = value
    return tree


@_FUZZ
@given(path=st.lists(st.integers(0, 50), max_size=6), value=_JSON,
       part=st.sampled_from(["graph", "report", "weights", "header"]))
def test_fuzz_resealed_json(saved, tmp_path, path, value, part):
    """Edit one JSON subtree of a part (or the header), reseal with valid checksums, load."""
    header, parts = A.unpack(saved["diamond"][1])
    for key in ("parts", "parts_size"):
        header.pop(key)
    if part == "header":
        header = _replace_at(header, path, value)
        if not isinstance(header, dict):
            return
    elif part == "weights":
        w = parts["weights"]
        n = int.from_bytes(w[:8], "little")
        blob = json.dumps(_replace_at(json.loads(w[8:8 + n]), path, value)).encode()
        blob += b" " * (-(8 + len(blob)) % 8)
        parts["weights"] = len(blob).to_bytes(8, "little") + blob + w[8 + n:]
    else:
        parts[part] = json.dumps(_replace_at(json.loads(parts[part]), path, value)).encode()
    dst = tmp_path / "r.fgm"
    A.pack(dst, header, parts)
    try:
        loaded = fg.load(dst)
    except ArtifactError:
        return
    try:  # a consistent but edited graph may run, or fail with a typed error: never anything else
        loaded.run(FEEDS["diamond"]())
    except FusegraphError:
        pass


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="smaps and madvise are Linux's")
def test_a_loaded_files_bytes_are_advised_for_huge_pages_once_read(saved):
    """The private copy of the file is marked ``MADV_HUGEPAGE`` (smaps flag ``hg``) so that
    khugepaged moves the weights into 2 MiB pages while the model runs; where the kernel has
    transparent huge pages off the advice is refused and the bytes stay as they are."""
    import ctypes
    import mmap
    from fusegraph.artifact.container import open_artifact
    _model, path, _ = saved["chain"]
    art = open_artifact(path)
    address = ctypes.addressof(ctypes.c_char.from_buffer(art.mm))
    flags = None
    with open("/proc/self/smaps") as smaps:
        inside = False
        for line in smaps:
            head = line.split()[0]
            if "-" in head and not head.endswith(":"):
                lo, hi = (int(x, 16) for x in head.split("-"))
                inside = lo <= address < hi
            elif inside and line.startswith("VmFlags:"):
                flags = line.split()[1:]
                break
    assert flags is not None
    thp = Path("/sys/kernel/mm/transparent_hugepage/enabled")
    if not hasattr(mmap, "MADV_HUGEPAGE") or not thp.exists() or "[never]" in thp.read_text():
        pytest.skip("no transparent huge pages here")
    assert "hg" in flags, flags
