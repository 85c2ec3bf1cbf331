"""Where a bf16 run's error comes from, on any CPU: an emulation of bf16 rounding points in
float32 arithmetic, beside fusegraph's own bf16 run.

A bf16 convolution or product on a CPU with bf16 arithmetic (oneDNN on AMX / AVX512-BF16)
multiplies bf16 operands exactly, accumulates in float32, adds its float32 bias and post-ops
(a residual, an activation) and rounds its result once. That is float32 arithmetic on
rounded operands with the result rounded: this script interprets a light model's ONNX graph
(Conv, BatchNormalization, Relu, Sum / Add, MaxPool, AveragePool, Reshape / Flatten, Gemm,
Dropout, Softmax, Identity) in float32 with torch, BatchNorm folded into its convolution,
and rounds where a policy says:

- ``fp32``: no rounding (checks the interpreter against onnxruntime);
- ``fg``: fusegraph's bf16 policy (``passes/precision_policy.py``): every convolution and
  product reads bf16 operands and rounds its output once, after its float32 bias, its fused
  residual and its activation; the last product (the logits) writes float32; pools and
  reshapes keep their input's type; the softmax is float32;
- ``ov``: OpenVINO's bf16 (its CPU plugin's ``EnforceInferencePrecision``): as ``fg``, but
  the logits product writes bf16 (only the tail after it, the softmax, is float32);
- ``ov~K`` / ``fg~K``: the same rounding points, each product's sum taken in another order
  (its reduction axis permuted, seed K): another kernel's accumulation. How far one input's
  error moves across them is how much of it the kernels' order decides;
- ``fg+fp32[...]``: ``fg`` with some products kept float32, or some products' activations
  (``--keep``).

Beside them, ``fg_run``: fusegraph's own bf16 model on this CPU. Errors are relative L2 of
every output against onnxruntime ORT_DISABLE_ALL, per input (seeds 0..N-1); "at or below ov"
counts the inputs where a variant's error is at most the ``ov`` variant's (torch's order).

    python benchmarks/bf16_emulation.py --models resnet50 --inputs 8 --orders 4 --keep first:2,first:5
"""
from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
import torch
import torch.nn.functional as F
from onnx import numpy_helper

import fusegraph as fg
from fusegraph.testing import zoo

sys.path.insert(0, str(Path(__file__).resolve().parent))
from precision_table import THREADS, ort_references, rel_l2  # noqa: E402


@dataclass(frozen=True)
class Variant:
    """One set of rounding points: ``reduced`` off is float32 throughout; ``round_logits``:
    the last product writes bf16 (OpenVINO) rather than float32 (fusegraph);
    ``fp32_products``: node names of convolutions / products kept float32 (operands and
    weights unrounded, the output rounded only when a bf16 product reads it);
    ``fp32_activations``: node names of products with bf16 weights that read and write float32
    activations (a one-row product could: its activations split into two bf16 rows, high and
    low, read with one pass over the weights);
    ``order``: a seed permuting each product's reduction axis (the same values summed in
    another order: another kernel's accumulation), None for torch's own."""
    name: str
    reduced: bool = True
    round_logits: bool = False
    fp32_products: frozenset = frozenset()
    fp32_activations: frozenset = frozenset()
    order: int | None = None


def r16(t: torch.Tensor) -> torch.Tensor:
    """``t`` rounded to bf16 (nearest even) and widened back."""
    return t.to(torch.bfloat16).float()


class Emulator:
    """One light model's graph, interpreted in float32 with bf16 rounding points."""

    def __init__(self, proto: onnx.ModelProto):
        g = proto.graph
        self.consts = {t.name: torch.from_numpy(numpy_helper.to_array(t).copy()) for t in g.initializer}
        self.nodes = list(g.node)
        self.outputs = [o.name for o in g.output]
        self.producer = {o: i for i, m in enumerate(self.nodes) for o in m.output}
        self.users: dict[str, list] = {}
        for n in self.nodes:
            for x in n.input:
                self.users.setdefault(x, []).append(n)
        self.products = [n.name for n in self.nodes if n.op_type in ("Conv", "Gemm")]
        self.last_gemm = [n for n in self.nodes if n.op_type == "Gemm"][-1].output[0]
        self._fold()

    def _only_user(self, name: str, op: str):
        users = self.users.get(name, [])
        return users[0] if len(users) == 1 and users[0].op_type == op and name not in self.outputs else None

    def _fold(self) -> None:
        """Conv -> BN -> (Sum / Add) -> (Relu) chains into one step each, BN in the weights."""
        self.steps, absorbed = [], set()
        for i, n in enumerate(self.nodes):
            if id(n) in absorbed:
                continue
            if n.op_type != "Conv":
                self.steps.append(("op", n))
                continue
            w = self.consts[n.input[1]].float()
            b = self.consts[n.input[2]].float() if len(n.input) > 2 and n.input[2] else torch.zeros(w.shape[0])
            out, res, relu = n.output[0], None, False
            bn = self._only_user(out, "BatchNormalization")
            if bn is not None:
                scale, shift, mean, var = (self.consts[x].float() for x in bn.input[1:5])
                eps = next((a.f for a in bn.attribute if a.name == "epsilon"), 1e-5)
                s = scale / torch.sqrt(var + eps)
                w, b = w * s.view(-1, 1, 1, 1), (b - mean) * s + shift
                absorbed.add(id(bn))
                out = bn.output[0]
            join = self._only_user(out, "Sum") or self._only_user(out, "Add")
            if join is not None and len(join.input) == 2:
                other = join.input[1] if join.input[0] == out else join.input[0]
                if self.producer.get(other, -1) < i:      # the residual fuses into the conv computed last
                    res, out = other, join.output[0]
                    absorbed.add(id(join))
            act = self._only_user(out, "Relu")
            if act is not None:
                relu, out = True, act.output[0]
                absorbed.add(id(act))
            attrs = {a.name: onnx.helper.get_attribute_value(a) for a in n.attribute}
            self.steps.append(("conv", (n.name, n.input[0], w, b, res, relu, out, attrs)))

    def run(self, feeds: dict, v: Variant) -> dict[str, np.ndarray]:
        env = {k: torch.from_numpy(np.asarray(x)).float() for k, x in feeds.items()}
        env.update({k: x.float() if x.is_floating_point() else x for k, x in self.consts.items()})
        self.stored = set()           # values held in bf16
        rng = None if v.order is None else torch.Generator().manual_seed(v.order)
        for kind, item in self.steps:
            if kind == "conv":
                self._conv(item, env, v, rng)
            else:
                self._op(item, env, v, rng)
        return {k: env[k].numpy() for k in self.outputs}

    def _reduced(self, name: str, v: Variant) -> bool:
        return v.reduced and name not in v.fp32_products

    def _operands(self, name: str, x, w, v: Variant):
        """(x, w, output rounded) of a product under ``v``."""
        if not self._reduced(name, v):
            return x, w, False
        if name in v.fp32_activations:
            return x, r16(w), False
        return r16(x), r16(w), True

    def _conv(self, item, env, v: Variant, rng) -> None:
        name, x_name, w, b, res, relu, out, a = item
        x, w, reduced = self._operands(name, env[x_name], w, v)
        if rng is not None and a.get("group", 1) == 1:       # the same sum in another order
            perm = torch.randperm(w.shape[1], generator=rng)
            x, w = x[:, perm], w[:, perm]
        pads = a.get("pads", [0, 0, 0, 0])
        x = F.pad(x, (pads[1], pads[3], pads[0], pads[2]))
        y = F.conv2d(x, w, b, stride=a.get("strides", [1, 1]), dilation=a.get("dilations", [1, 1]),
                     groups=a.get("group", 1))
        if res is not None:
            y = y + env[res]
        y = y.relu() if relu else y
        env[out] = self._store(out, y, reduced)

    def _store(self, out: str, y: torch.Tensor, reduced: bool) -> torch.Tensor:
        if reduced:
            self.stored.add(out)
            return r16(y)
        return y

    def _op(self, n, env, v: Variant, rng) -> None:
        a = {x.name: onnx.helper.get_attribute_value(x) for x in n.attribute}
        ins = [env[x] if x else None for x in n.input]
        op, out = n.op_type, n.output[0]
        follow = all(x in self.stored for x in n.input[:1])     # FOLLOW ops keep their input's type
        if op == "Relu":
            env[out] = self._store(out, ins[0].relu(), follow)
        elif op in ("Sum", "Add"):
            total = ins[0]
            for x in ins[1:]:
                total = total + x
            env[out] = self._store(out, total, all(x in self.stored for x in n.input))
        elif op == "MaxPool":
            k, s, p = a["kernel_shape"], a.get("strides", [1, 1]), a.get("pads", [0, 0, 0, 0])
            x = F.pad(ins[0], (p[1], p[3], p[0], p[2]), value=-float("inf"))
            env[out] = self._store(out, F.max_pool2d(x, k, s, ceil_mode=bool(a.get("ceil_mode", 0))), follow)
        elif op in ("AveragePool", "GlobalAveragePool"):
            x = ins[0]
            if list(a.get("kernel_shape", x.shape[2:])) != list(x.shape[2:]) or any(a.get("pads", [0])):
                raise NotImplementedError(f"{n.name}: only a whole-image average pool")
            env[out] = self._store(out, x.mean(dim=(2, 3), keepdim=True), follow)
        elif op in ("Reshape", "Flatten"):       # the classifiers' flatten to [N, features]
            env[out] = self._store(out, ins[0].reshape(ins[0].shape[0], -1), follow)
        elif op in ("Dropout", "Identity"):
            env[out] = self._store(out, ins[0], follow)
        elif op == "Gemm":
            x, w, b = ins
            w = w.t() if a.get("transB", 0) else w
            x, w, reduced = self._operands(n.name, x, w, v)
            if rng is not None:
                perm = torch.randperm(w.shape[0], generator=rng)
                x, w = x[:, perm], w[perm]
            y = x @ w + (b if b is not None else 0)
            logits = out == self.last_gemm
            env[out] = self._store(out, y, reduced and (v.round_logits or not logits))
        elif op == "Softmax":
            env[out] = torch.softmax(ins[0], dim=a.get("axis", 1))
        else:
            raise NotImplementedError(f"{n.name}: {op}")


def fusegraph_run(path: str):
    """fusegraph's own bf16 model: feeds -> {output: array}."""
    model = fg.compile(path, config=fg.Config(threads=THREADS, precision="bf16"))
    return lambda feeds: {k: np.asarray(v) for k, v in model.run(feeds).items()}


def variants(emu: Emulator, orders: int, keep: list[str]) -> list[Variant]:
    """fp32; OpenVINO's and fusegraph's rounding points, each in torch's order and in
    ``orders`` permuted ones; fusegraph's with each ``keep`` entry's products float32
    (``first:K``, the first K products; ``names:A+B``, those nodes) or, for ``acts:A+B``, those
    products' activations float32 with bf16 weights."""
    out = [Variant("fp32", reduced=False)]
    for base, round_logits in (("ov", True), ("fg", False)):
        out += [Variant(base if o is None else f"{base}~{o}", round_logits=round_logits, order=o)
                for o in [None, *range(1, orders + 1)]]
    for entry in keep:
        kind, _, arg = entry.partition(":")
        names = frozenset(emu.products[:int(arg)] if kind == "first" else arg.split("+"))
        out.append(Variant(f"fg+fp32[{entry}]", fp32_activations=names) if kind == "acts" else
                   Variant(f"fg+fp32[{entry}]", fp32_products=names))
    return out


def summarise(errs: dict[str, list[float]], inputs: int) -> list[str]:
    """Lines of a table: a variant's error on seed 0, its median, and on how many inputs it is
    at or below OpenVINO's rounding points in torch's order (``ov``)."""
    lines = []
    for name, values in errs.items():
        le = sum(a <= b for a, b in zip(values, errs["ov"]))
        lines.append(f"| {name} | {values[0]:.3e} | {statistics.median(values):.3e} | {le} / {inputs} |")
    for family in ("ov", "fg"):
        members = [v for k, v in errs.items() if k == family or k.startswith(family + "~")]
        seed0 = [v[0] for v in members]
        spread = [max(v[i] for v in members) / min(v[i] for v in members) for i in range(inputs)]
        lines.append(f"| {family}, over its orders | seed 0 from {min(seed0):.3e} to {max(seed0):.3e} | "
                     f"max / min per input: median {statistics.median(spread):.2f} | |")
    return lines


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="resnet50,vgg19")
    ap.add_argument("--inputs", type=int, default=8)
    ap.add_argument("--orders", type=int, default=4, help="permuted summation orders per rounding policy")
    ap.add_argument("--keep", default="", help="comma-separated first:K / names:A+B / acts:A+B entries kept float32")
    args = ap.parse_args(argv)
    torch.set_num_threads(THREADS)
    keep = [k for k in args.keep.split(",") if k]
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.models.split(","):
            proto = zoo.expose_logits(zoo.randomize_weights(onnx.load(zoo.light_model_path(name)), seed=0))
            path = str(Path(tmp) / f"{name}.onnx")
            onnx.save(proto, path)
            feeds = [zoo.random_feeds(proto, seed=s) for s in range(args.inputs)]
            refs = ort_references(path, feeds)
            emu, run = Emulator(proto), fusegraph_run(path)
            chosen = variants(emu, args.orders, keep)
            errs = {o: {v.name: [] for v in chosen} | {"fg_run": []} for o in refs[0]}
            for f, ref in zip(feeds, refs):
                got = {v.name: emu.run(f, v) for v in chosen}
                got["fg_run"] = run(f)
                for o in ref:
                    for k, y in got.items():
                        errs[o][k].append(rel_l2(y[o], ref[o]))
            for o in refs[0]:
                print(f"\n{name}, output {o}: relative L2 vs onnxruntime ORT_DISABLE_ALL over seeds 0-{args.inputs - 1}")
                print("| variant | seed 0 | median | inputs at or below ov |\n|---|---:|---:|---:|")
                print("\n".join(summarise(errs[o], args.inputs)), flush=True)


if __name__ == "__main__":
    main()
