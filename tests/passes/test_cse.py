"""Common subexpression elimination, constants included."""
import numpy as np

from passes_util import F, check, const, model, node, ops

X = [("x", F, [2, 3]), ("z", F, [2, 3])]


def test_duplicate_nodes_merged():
    m = model([node("Add", ["x", "z"], "a"), node("Add", ["x", "z"], "b"), node("Mul", ["a", "b"], "y")],
              X, ["y"])
    assert ops(check(m, level="O1")) == ["Add", "Mul"]


def test_equal_constants_make_nodes_equal():
    m = model([node("Mul", ["x", "c1"], "a"), node("Mul", ["x", "c2"], "b"), node("Sub", ["a", "b"], "d"),
               node("Sigmoid", ["d"], "y")], X, ["y"], [const("c1", [1.5, 2, 3]), const("c2", [1.5, 2, 3])])
    compiled = check(m, level="O1")
    assert ops(compiled) == ["Mul", "Sub", "Sigmoid"]


def test_different_attributes_not_merged():
    m = model([node("Softmax", ["x"], "a", axis=0), node("Softmax", ["x"], "b", axis=1),
               node("Add", ["a", "b"], "y")], X, ["y"])
    assert ops(check(m, level="O1")) == ["Softmax", "Softmax", "Add"]


def test_impure_not_merged():
    m = model([node("RandomUniformLike", ["x"], "a", seed=1.0), node("RandomUniformLike", ["x"], "b", seed=1.0),
               node("Add", ["a", "b"], "y")], X, ["y"])
    import fusegraph as fg
    assert ops(fg.compile(m, fg.Config(verify_each=True))).count("RandomUniformLike") == 2


def test_two_graph_outputs_not_aliased():
    m = model([node("Relu", ["x"], "a"), node("Relu", ["x"], "b")], X, ["a", "b"])
    compiled = check(m, level="O1")
    assert ops(compiled) == ["Relu", "Relu"]
    out = compiled.run({"x": np.ones((2, 3), np.float32), "z": np.ones((2, 3), np.float32)})
    out["a"][0, 0] = 5
    assert out["b"][0, 0] == 1


def test_chain_merges_transitively():
    m = model([node("Exp", ["x"], "a1"), node("Exp", ["x"], "a2"), node("Neg", ["a1"], "b1"),
               node("Neg", ["a2"], "b2"), node("Add", ["b1", "b2"], "y")], X, ["y"])
    assert ops(check(m, level="O1")) == ["Exp", "Neg", "Add"]


def _shared_layers(w2: np.ndarray | None = None):
    """Three layers of ``y = gelu(x @ W + b)``: ALBERT's one layer run several times, every
    layer reading the same initializer (or, with ``w2``, the second layer its own)."""
    rng = np.random.default_rng(0)
    d = 768                                   # 2.25 MiB a weight: past the keyed-by-bytes size
    w = (rng.standard_normal((d, d)) * (2 / d) ** 0.5).astype(np.float32)
    nodes, prev = [], "x"
    for i in range(3):
        weight = "w2" if (w2 is not None and i == 1) else "w"
        nodes += [node("MatMul", [prev, weight], f"m{i}"), node("Add", [f"m{i}", "b"], f"a{i}"),
                  node("Gelu", [f"a{i}"], f"h{i}")]
        prev = f"h{i}"
    inits = [const("w", w), const("b", rng.standard_normal(d) * 0.1)] + ([const("w2", w2)] if w2 is not None else [])
    return model(nodes, [("x", F, [1, 5, d])], [prev], inits, opset=20), w


def _weight_bytes(compiled) -> int:
    return sum(v.const.numel() * v.const.element_size() for v in compiled.graph.constants.values()
               if v.const.numel() >= 768 * 768)


def test_a_weight_shared_by_layers_stays_one_tensor():
    """The rewrites make each layer's form of the weight (transposed for the product): equal
    tensors, merged into one after fusion, so the compiled model holds the weight once."""
    m, w = _shared_layers()
    compiled = check(m, level="O2", oracle="ort", rtol=1e-4, atol=1e-5)
    assert _weight_bytes(compiled) == w.nbytes, _weight_bytes(compiled)


def test_large_constants_equal_at_the_sampled_bytes_are_compared_whole():
    """A weight equal to the shared one at every sampled byte but one element elsewhere, and
    one differing only in the sign of a zero, stay their own tensors."""
    _, w = _shared_layers()
    for tweak in ("one element", "signed zero"):
        w2 = w.copy()
        if tweak == "one element":
            w2[100, 101] += 1.0
        else:
            w[3, 5], w2 = 0.0, w.copy()
            w2[3, 5] = -0.0
        m, w_ = _shared_layers(w2)
        if tweak == "signed zero":      # the shared weight holds the +0.0 that w2 holds as -0.0
            m.graph.initializer[0].CopyFrom(const("w", w))
        compiled = check(m, level="O2", oracle="ort", rtol=1e-4, atol=1e-5)
        assert _weight_bytes(compiled) == 2 * w.nbytes, (tweak, _weight_bytes(compiled))
