"""Property: on random small graphs of elementwise, broadcast, reshape and reduction ops
(with constants chosen to trigger the rewrite rules), O2 computes what O0 computes."""
import numpy as np
from hypothesis import HealthCheck, given, settings, strategies as st

import fusegraph as fg
from oracle import assert_outputs_close
from passes_util import F, const, model, node

UNARY = ["Relu", "Neg", "Abs", "Sigmoid", "Tanh", "Identity", "Dropout", "Sum"]
SPECIAL = [0.0, 1.0, 2.0, 0.5, -3.0]


class Builder:
    def __init__(self, data):
        self.data, self.nodes, self.inits, self.k = data, [], [], 0
        self.shapes: dict[str, tuple] = {}

    def draw(self, strategy):
        return self.data.draw(strategy)

    def fresh(self, shape):
        self.k += 1
        name = f"v{self.k}"
        self.shapes[name] = tuple(shape)
        return name

    def constant(self, value, dtype=np.float32):
        self.k += 1
        name = f"c{self.k}"
        self.inits.append(const(name, value, dtype))
        return name

    def add(self, op, inputs, shape, **attrs):
        out = self.fresh(shape)
        self.nodes.append(node(op, inputs, out, **attrs))
        return out

    # ---------------------------------------------------------------- op families
    def unary(self, v):
        op = self.draw(st.sampled_from(UNARY + ["TanhExp", "AbsSqrt", "LogExp"]))
        s = self.shapes[v]
        if op == "TanhExp":
            return self.add("Exp", [self.add("Tanh", [v], s)], s)
        if op == "AbsSqrt":
            return self.add("Sqrt", [self.add("Abs", [v], s)], s)
        if op == "LogExp":
            return self.add("Log", [self.add("Exp", [self.add("Tanh", [v], s)], s)], s)
        return self.add(op, [v], s)

    def with_constant(self, v):
        s = self.shapes[v]
        op = self.draw(st.sampled_from(["Add", "Sub", "Mul", "Div"]))
        rank = self.draw(st.integers(0, len(s)))
        cshape = tuple(self.draw(st.sampled_from([1, d])) for d in s[len(s) - rank:])
        if self.draw(st.booleans()):
            value = np.full(cshape, self.draw(st.sampled_from(SPECIAL)))
        else:
            value = np.random.default_rng(self.k).uniform(0.5, 2.0, cshape)
        if op == "Div":
            value = np.where(np.abs(value) < 0.25, 1.0, value)
        c = self.constant(value)
        args = [c, v] if op in ("Add", "Mul", "Sub") and self.draw(st.booleans()) else [v, c]
        return self.add(op, args, s)

    def binary(self, v, w):
        a, b = self.shapes[v], self.shapes[w]
        try:
            s = np.broadcast_shapes(a, b)
        except ValueError:
            return v
        return self.add(self.draw(st.sampled_from(["Add", "Sub", "Mul"])), [v, w], s)

    def reshape(self, v):
        s = self.shapes[v]
        kind = self.draw(st.sampled_from(["Reshape", "ReshapePair", "Transpose", "TransposePair", "Unsqueeze",
                                          "Flatten", "Expand", "CastPair"]))
        n = int(np.prod(s))
        if kind in ("Reshape", "ReshapePair"):
            divisors = [d for d in range(1, n + 1) if n % d == 0]
            d0 = self.draw(st.sampled_from(divisors))
            target = [d0, -1] if self.draw(st.booleans()) else [d0, n // d0]
            out = self.add("Reshape", [v, self.constant(target, np.int64)], (d0, n // d0))
            if kind == "ReshapePair":
                out = self.add("Reshape", [out, self.constant([n], np.int64)], (n,))
            return out
        if kind in ("Transpose", "TransposePair") and len(s) >= 2:
            perm = self.draw(st.permutations(list(range(len(s)))))
            out = self.add("Transpose", [v], tuple(s[p] for p in perm), perm=list(perm))
            if kind == "TransposePair":
                inv = list(np.argsort(perm))
                out = self.add("Transpose", [out], s, perm=inv)
            return out
        if kind == "Unsqueeze" and len(s) < 4:
            return self.add("Unsqueeze", [v, self.constant([0], np.int64)], (1,) + s)
        if kind == "Flatten" and len(s) >= 1:
            return self.add("Flatten", [v], (int(np.prod(s[:1])), int(np.prod(s[1:]))), axis=1)
        if kind == "Expand" and len(s) < 4:
            target = (2,) + tuple(d if d != 1 else self.draw(st.sampled_from([1, 3])) for d in s)
            return self.add("Expand", [v, self.constant(list(target), np.int64)], target)
        if kind == "CastPair":
            return self.add("Cast", [self.add("Cast", [v], s, to=11)], s, to=F)
        return v

    def reduce(self, v):
        s = self.shapes[v]
        if not s:
            return v
        op = self.draw(st.sampled_from(["ReduceSum", "ReduceMean", "ReduceMax"]))
        axes = sorted(self.draw(st.sets(st.integers(0, len(s) - 1), min_size=1)))
        keep = self.draw(st.sampled_from([0, 1]))
        out_shape = tuple(1 if i in axes else d for i, d in enumerate(s) if keep or i not in axes)
        return self.add(op, [v, self.constant(axes, np.int64)], out_shape, keepdims=keep)

    def expand_reduce(self, v):
        s = self.shapes[v]
        if len(s) >= 4:
            return v
        target = (self.draw(st.sampled_from([1, 2])),) + tuple(
            d if d != 1 else self.draw(st.sampled_from([1, 3])) for d in s)
        e = self.add("Expand", [v, self.constant(list(target), np.int64)], target)
        return self.reduce(e)

    def matmul(self, v):
        s = self.shapes[v]
        if not s:
            return v
        w = self.constant(np.random.default_rng(self.k).normal(0, 0.5, (s[-1], 3)))
        mm = self.add("MatMul", [v, w], s[:-1] + (3,))
        return self.add("Add", [mm, self.constant(np.arange(3.0))], s[:-1] + (3,))


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_o2_equals_o0_on_random_graphs(data):
    b = Builder(data)
    x = b.fresh(data.draw(st.sampled_from([(2, 3, 4), (3, 1, 4), (4,), (2, 6)])))
    z = b.fresh(data.draw(st.sampled_from([(1, 4), (3, 1), (4,), (1,)])))
    pool = [x, z]
    for step in range(data.draw(st.integers(1, 8))):
        v = x if step == 0 else data.draw(st.sampled_from(pool))
        family = data.draw(st.sampled_from(["unary", "const", "binary", "reshape", "reduce", "matmul",
                                            "expand_reduce"]))
        if family == "binary":
            out = b.binary(v, data.draw(st.sampled_from(pool)))
        else:
            method = {"unary": "unary", "const": "with_constant"}.get(family, family)
            out = getattr(b, method)(v)
        pool.append(out)
    outputs = [pool[-1]] + ([pool[-2]] if len(pool) > 3 and data.draw(st.booleans()) else [])
    # a graph input named again as an output would be declared with an undefined element type
    # by ``model()`` (outputs' types are left to inference), which ONNX's inference refuses
    outputs = [o for o in dict.fromkeys(outputs) if o not in (x, z)]
    if x not in {i for n in b.nodes for i in n.input} or not b.nodes or not outputs:
        return
    m = model(b.nodes, [(x, F, b.shapes[x]), (z, F, b.shapes[z])], outputs, b.inits)
    rng = np.random.default_rng(0)
    feeds = {x: rng.standard_normal(b.shapes[x]).astype(np.float32),
             z: rng.standard_normal(b.shapes[z]).astype(np.float32)}
    want = fg.compile(m, fg.Config(level="O0")).run(feeds)
    got = fg.compile(m, fg.Config(level="O2", verify_each=True)).run(feeds)
    assert_outputs_close(got, want, rtol=1e-4, atol=1e-5)
