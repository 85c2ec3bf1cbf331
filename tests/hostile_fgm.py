"""Deterministic generator of mutated ``.fgm`` artifacts, for ``test_hostile_inputs.py``.

``fgm_cases(bases)`` yields ``(kind, name, base, make, same)``: ``make(path, folder)`` writes
the mutated artifact of base artifact ``path`` into ``folder`` and returns its path; ``same``
says the edit must not change what the model computes (a plan, thread or name edit: a run
must give the unmutated model's outputs), else only a typed error or a run is required.
Mutations: raw bit flips, truncations and part swaps (the checksums catch them), and
*re-sealed* edits — the JSON graph, plan, header or weights header edited and the checksums
recomputed with ``artifact.pack``, so the file passes the integrity check: overlapping or
out-of-range arena slots, shapes, dtypes, op types, attributes, thread and stream counts,
stream plans, weight shape / dtype / offsets, compile report parts of the wrong type, and
names carrying code.
"""
from __future__ import annotations

import json
from pathlib import Path

from fusegraph import artifact as A

INJECTIONS = ('t\n__import__("os").system("touch owned")\n#',
              "t\r\nopen('owned','w')\n#", "t\u2028open('owned','w')#", "t\x85open('owned','w')#",
              "t'); open('owned','w'); ('", 't"""; open("owned","w"); """', "t\\\nopen('owned','w')",
              "t\x00open('owned','w')", "x" * 5000, "t\n\topen('owned','w')")


def _raw(fn):
    def make(src: Path, folder: Path) -> Path:
        out = Path(folder) / "m.fgm"
        out.write_bytes(fn(src.read_bytes()))
        return out
    return make


def _flip(pos_fraction: float, bit: int):
    def fn(data: bytes) -> bytes:
        b = bytearray(data)
        pos = min(int(pos_fraction * len(b)), len(b) - 1)
        b[pos] ^= 1 << bit
        return bytes(b)
    return fn


def _resealed(edit):
    """``edit(header, parts)`` changes the decoded parts in place (``parts['graph']`` and
    ``parts['report']`` as JSON, ``parts['weights']`` as (json header, tail)); then re-seal."""
    def make(src: Path, folder: Path) -> Path:
        header, raw = A.unpack(src)
        for key in ("parts", "parts_size"):
            header.pop(key)
        w = raw["weights"]
        n = int.from_bytes(w[:8], "little")
        parts = {"graph": json.loads(raw["graph"]), "report": json.loads(raw["report"]),
                 "weights": [json.loads(w[8:8 + n]), w[8 + n:]]}
        edit(header, parts)
        blob = json.dumps(parts["weights"][0]).encode()
        blob += b" " * (-(8 + len(blob)) % 8)
        out = Path(folder) / "m.fgm"
        A.pack(out, header, {"graph": json.dumps(parts["graph"]).encode(),
                             "report": json.dumps(parts["report"]).encode(),
                             "weights": len(blob).to_bytes(8, "little") + blob + parts["weights"][1]})
        return out
    return make


def _plan(parts):
    return parts["report"]["plan"]


def _shift_slot(name, delta):
    def edit(h, p):
        _plan(p)["slots"][name][0] += delta
    return edit


def _slot_to(name, other):
    def edit(h, p):
        slots = _plan(p)["slots"]
        slots[name][0] = slots[other][0]
    return edit


def _set_slot(name, k, value):
    def edit(h, p):
        _plan(p)["slots"][name][k] = value
    return edit


def _set_plan(key, value):
    def edit(h, p):
        _plan(p)[key] = value
    return edit


def _set_report(key, value):
    """A compile report part (``report.memory``, ``.passes`` ...) replaced: the load refuses it by name."""
    def edit(h, p):
        p["report"]["report"][key] = value
    return edit


def _set_config(key, value):
    def edit(h, p):
        h["config"][key] = value
    return edit


def _set_header(key, value):
    def edit(h, p):
        h[key] = value
    return edit


def _entry(p, kind, name):
    """The stored graph's entry ``name`` among its ``kind`` ("values" or "nodes")."""
    return next(e for e in p["graph"][kind] if e["name"] == name)


def _node(p, name):
    return _entry(p, "nodes", name)


def _set(kind, name, key, value):
    def edit(h, p):
        _entry(p, kind, name)[key] = value
    return edit


def _set_attr(name, attr, value):
    def edit(h, p):
        _node(p, name)["attrs"][attr] = value
    return edit


def _rename_node(old, new):
    def edit(h, p):
        _node(p, old)["name"] = new
        plan = _plan(p)
        plan["order"] = [new if n == old else n for n in plan["order"]]
        streams = plan.get("streams")
        if streams:
            for key in ("stream_of", "waits", "records", "op_of", "cost", "start"):
                if key in streams and old in streams[key]:
                    streams[key][new] = streams[key].pop(old)
            streams["per_stream"] = [[new if n == old else n for n in s] for s in streams["per_stream"]]
            for e in streams.get("events", []):
                if e.get("producer") == old:
                    e["producer"] = new
    return edit


def _rename_value(old, new):
    def edit(h, p):
        g = p["graph"]
        for v in g["values"]:
            if v["name"] == old:
                v["name"] = new
        for n in g["nodes"]:
            n["inputs"] = [new if x == old else x for x in n["inputs"]]
            n["outputs"] = [new if x == old else x for x in n["outputs"]]
        for key in ("inputs", "outputs", "constants"):
            g[key] = [new if x == old else x for x in g[key]]
        plan = _plan(p)
        for key in ("slots", "kinds"):
            if old in plan.get(key, {}):
                plan[key][new] = plan[key].pop(old)
        if old in p["report"].get("strides", {}):
            p["report"]["strides"][new] = p["report"]["strides"].pop(old)
    return edit


def _weight(name, key, value):
    def edit(h, p):
        p["weights"][0][name][key] = value
    return edit


def _streams(fn):
    def edit(h, p):
        fn(_plan(p)["streams"])
    return edit


def _raw_cases(name, base):
    for k in range(40):
        yield "fgm_bitflip", f"{name}.flip{k}", base, _raw(_flip((k + 0.5) / 40, k % 8)), True
    for k in range(16):
        yield "fgm_truncate", f"{name}.cut{k}", base, _raw(lambda d, k=k: d[:int(len(d) * k / 16)]), True
    yield "fgm_truncate", f"{name}.appended", base, _raw(lambda d: d + b"\0" * 64), True
    yield "fgm_swap", f"{name}.swap_halves", base, _raw(lambda d: d[len(d) // 2:] + d[:len(d) // 2]), True
    yield "fgm_swap", f"{name}.header_only", base, _raw(lambda d: d[:64]), True


def _swap_parts(a, b):
    def make(src, folder):
        header, parts = A.unpack(src)
        for key in ("parts", "parts_size"):
            header.pop(key)
        parts[a], parts[b] = parts[b], parts[a]
        out = Path(folder) / "m.fgm"
        A.pack(out, header, parts)
        return out
    return make


def _common_cases(name, base, info):
    """Re-sealed edits that apply to any base; ``info``: value / node / weight names."""
    values, nodes, weights = info["values"], info["nodes"], info["weights"]
    for a, b in (("graph", "report"), ("graph", "weights"), ("report", "weights")):
        yield "fgm_swap", f"{name}.reseal_swap_{a}_{b}", base, _swap_parts(a, b), True
    for key, v in (("threads", 4096), ("threads", 0), ("threads", -1), ("threads", "8"), ("threads", 10 ** 9),
                   ("threads", 1), ("streams", 4096), ("streams", 0), ("streams", "auto"), ("level", "O9"),
                   ("memory", "huge"), ("device", "cuda"), ("device", "tpu"), ("precision", "fp8"),
                   ("max_arena_bytes", -1), ("fold_broadcast_limit", -5), ("no_such_key", 1),
                   ("disabled_passes", "dce"), ("cuda_graph", "yes"), ("keep_freed_memory", 2)):
        yield "fgm_config", f"{name}.config_{key}={v!r}", base, _resealed(_set_config(key, v)), True
    for key, v in (("format_version", 99), ("format_version", "2"), ("torch_version", "0.0.1"), ("byteorder", "big"),
                   ("device", {"kind": "cuda", "weights": "cuda"}), ("cpu", {"arch": "riscv", "capability": "X",
                                                                                "requires": ["evil"]}),
                   ("format", "zip"), ("model", INJECTIONS[0]), ("config", "none")):
        yield "fgm_header", f"{name}.header_{key}={str(v)[:20]!r}", base, _resealed(_set_header(key, v)), True
    for v in values:
        for key, bad in (("dtype", 7), ("dtype", 11), ("dtype", 0), ("dtype", 9999), ("dtype", 8), ("dtype", "f")):
            yield "fgm_dtype", f"{name}.{v}.{key}={bad!r}", base, _resealed(_set("values", v, key, bad)), False
        for bad in ([1], [0, 0, 0, 0], [-1, 4, 3, 3], [10 ** 9, 10 ** 9], ["N", 2], None, "abc", [2.5]):
            yield "fgm_shape", f"{name}.{v}.shape={bad!r}", base, _resealed(_set("values", v, "shape", bad)), False
        for k, inj in enumerate(INJECTIONS):
            yield "fgm_inject", f"{name}.value_{v}_inject{k}", base, _resealed(_rename_value(v, inj)), True
    for n in nodes:
        for op in ("Relu", "NoSuchOp", "Sigmoid", INJECTIONS[0], "", 7):
            yield "fgm_op", f"{name}.{n}.op={str(op)[:12]!r}", base, _resealed(_set("nodes", n, "op_type", op)), False
        for dom, ver in (("evil", 1), ("", 99999), ("", -1), ("fusegraph", 0)):
            yield "fgm_op", f"{name}.{n}.domain={dom!r}@{ver}", base, _resealed(
                lambda h, p, n=n, d=dom, v=ver: _node(p, n).update(domain=d, version=v)), False
        for bad in (["nope"], [], [None, None, None, None, None], "x"):
            yield "fgm_op", f"{name}.{n}.inputs={bad!r}", base, _resealed(_set("nodes", n, "inputs", bad)), False
        yield "fgm_op", f"{name}.{n}.outputs=[]", base, _resealed(_set("nodes", n, "outputs", [])), False
        for attr, bad in (("strides", [0, 0]), ("pads", [-3, -3, -3, -3]), ("dilations", [0, 1]),
                          ("kernel_shape", [0, 0]), ("perm", [0, 0, 1]), ("axis", 99), ("axis", "1"),
                          ("activation", INJECTIONS[0]), ("group", 0), ("keepdims", [1]), ("alpha", "nan")):
            yield "fgm_attr", f"{name}.{n}.{attr}={bad!r}", base, _resealed(_set_attr(n, attr, bad)), False
        for k, inj in enumerate(INJECTIONS):
            yield "fgm_inject", f"{name}.node_{n}_inject{k}", base, _resealed(_rename_node(n, inj)), True
        yield "fgm_inject", f"{name}.{n}.meta_inject", base, _resealed(_set("nodes", n, "meta", {"rule": INJECTIONS[0]})), True
    for w in weights:
        for key, bad in (("dtype", "F64"), ("dtype", "I64"), ("dtype", "BOOL"), ("dtype", "EVIL"),
                         ("shape", [1]), ("shape", [10 ** 9]), ("shape", [-1]), ("data_offsets", [0, 10 ** 12]),
                         ("data_offsets", [8, 4]), ("data_offsets", [0, 0]), ("data_offsets", [-8, 8])):
            yield "fgm_weights", f"{name}.{w}.{key}={bad!r}", base, _resealed(_weight(w, key, bad)), False
    order = info["order"]
    for label, bad in (("reversed", order[::-1]), ("dropped", order[1:]), ("duplicated", order + order[:1]),
                       ("unknown", order[:-1] + ["ghost"]), ("not_list", "abc")):
        yield "fgm_plan", f"{name}.order_{label}", base, _resealed(_set_plan("order", bad)), True
    for key, bad in (("memory_mode", "evil"), ("arena_bytes", 0), ("arena_bytes", 1 << 50), ("arena_bytes", -64),
                     ("arena_bytes", "1"), ("slots", {}), ("kinds", {"x": "evil"}), ("streams", {"num_streams": 4096})):
        yield "fgm_plan", f"{name}.plan_{key}={str(bad)[:16]!r}", base, _resealed(_set_plan(key, bad)), True
    yield "fgm_plan", f"{name}.strides_bogus", base, _resealed(
        lambda h, p: p["report"].__setitem__("strides", {v: [0, 0, 0, 0] for v in values})), True
    for key, bad in (("memory", {"arena_bytes": "1"}), ("memory", []), ("streams", {"num_streams": 2}),
                     ("passes", [{"name": 7}]), ("fusions", "x"), ("precision", {"policy": INJECTIONS[0]}),
                     ("kernels", {"backend": None}), ("timings", {"load": "1"}), ("model", ["x"]),
                     ("op_histogram", {"Conv": 2.5})):
        yield "fgm_report", f"{name}.report_{key}={str(bad)[:16]!r}", base, _resealed(_set_report(key, bad)), True


def _arena_cases(name, base, slots):
    names = sorted(slots)
    for v in names:
        for delta in (64, -64, 8, 1, 1 << 40):
            yield "fgm_arena", f"{name}.{v}.offset{delta:+d}", base, _resealed(_shift_slot(v, delta)), True
        yield "fgm_arena", f"{name}.{v}.size0", base, _resealed(_set_slot(v, 1, 0)), True
        yield "fgm_arena", f"{name}.{v}.size_huge", base, _resealed(_set_slot(v, 1, 1 << 40)), True
        yield "fgm_arena", f"{name}.{v}.offset_str", base, _resealed(_set_slot(v, 0, "0")), True
        for other in names:
            if other != v:
                yield "fgm_arena", f"{name}.{v}.onto_{other}", base, _resealed(_slot_to(v, other)), True


def _stream_cases(name, base, plan):
    streams = plan["streams"]
    nodes = list(streams["stream_of"])
    yield "fgm_streams", f"{name}.no_events", base, _resealed(_streams(lambda s: s.update(events=[], records={},
                                                                                          waits={n: [] for n in nodes}))), True
    yield "fgm_streams", f"{name}.num_streams1", base, _resealed(_streams(lambda s: s.update(num_streams=1))), True
    yield "fgm_streams", f"{name}.num_streams9", base, _resealed(_streams(lambda s: s.update(num_streams=9))), True
    yield "fgm_streams", f"{name}.threads_per_stream4096", base, _resealed(
        _streams(lambda s: s.update(threads_per_stream=4096))), True
    yield "fgm_streams", f"{name}.per_stream_swapped", base, _resealed(
        _streams(lambda s: s.update(per_stream=s["per_stream"][::-1]))), True
    yield "fgm_streams", f"{name}.wait_unknown_event", base, _resealed(
        _streams(lambda s: s["waits"].__setitem__(nodes[-1], [77]))), True
    for n in nodes:
        yield "fgm_streams", f"{name}.{n}.other_stream", base, _resealed(
            _streams(lambda s, n=n: s["stream_of"].__setitem__(n, 1 - s["stream_of"][n]))), True
        yield "fgm_streams", f"{name}.{n}.stream99", base, _resealed(
            _streams(lambda s, n=n: s["stream_of"].__setitem__(n, 99))), True
        yield "fgm_streams", f"{name}.{n}.waits_self_event", base, _resealed(
            _streams(lambda s, n=n: s["waits"].__setitem__(n, [0]))), True
    yield "fgm_streams", f"{name}.event_late_producer", base, _resealed(
        _streams(lambda s: [e.__setitem__("producer", nodes[-1]) for e in s["events"]])), True


def fgm_cases(bases: dict[str, dict]):
    """``bases``: name -> {"path", "info"} (``info``: values, nodes, weights, order, plan)."""
    for name, b in bases.items():
        info = b["info"]
        yield from _raw_cases(name, name)
        yield from _common_cases(name, name, info)
        yield from _arena_cases(name, name, info["plan"]["slots"])
        if info["plan"].get("streams"):
            yield from _stream_cases(name, name, info["plan"])
