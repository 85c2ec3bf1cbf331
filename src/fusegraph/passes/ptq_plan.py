"""What post-training int8 quantisation (``precision="int8"``) quantises in a float32 graph:
which products, and which activation tensors get a QuantizeLinear / DequantizeLinear pair.
Pure analysis: nothing here changes the graph (``qdq_insert.py`` and ``dynamic_insert.py`` do).

Products (``plan_products``): a float32 ``Conv`` (a constant weight of rank 3..5), ``MatMul``
with a constant 2-D weight, ``Gemm`` with a constant weight (alpha = 1, transA = 0, beta = 1
where it has a bias) whose activation is not a constant: what ``quantize_qdq.py`` turns into
``QConv`` / ``QLinear`` (static) or ``dynamic_quant.py`` into ``QLinearDynamic`` (dynamic:
MatMul / Gemm only). Each other product stays float32 with the reason (a product of two
activations, an attribute the int8 ops do not take, ``Config.op_precision``: fp32). An
``op_precision`` entry is looked up as the precision pass does: the node's name (or that of
a node fused into it) first, then its op type; an ``int8`` entry naming a node that cannot
run int8 is a ConfigError.

Activation tensors (``plan_tensors``), in onnxruntime ``quantize_static``'s QDQ form (one
pair per tensor, read by every consumer; what its registry quantises, restricted to what
fusegraph's int8 passes run):
- the activation input of every quantised product;
- going backwards from a tensor to quantise: through a max pool or a view / permutation
  (``PASS_THROUGH``: onnxruntime's "direct 8-bit" ops), its input too, the output sharing the
  input's parameters (so ``qdq_propagate``'s ``dq_sink`` and ``qdq_cancel`` leave no round trip);
  through a residual ``Add`` (or two-input ``Sum``: two same-shaped activations, at least one written by a
  quantised product; optionally followed by a ``Relu``), both its inputs (``qdq_residual``
  then fuses the sum into the convolution); through a ``Concat``, every input.
A product's output is quantised only where such a tensor needs it (onnxruntime quantises
every product's output; a product read by float ops only is left writing float32 here, one
rounding fewer, as fast). The ``Relu`` after a product stays (``Q(Relu(P))`` is what
``quantize_qdq`` fuses; onnxruntime removes it, which a zero point of 0 makes the same).
"""
from __future__ import annotations

from dataclasses import dataclass, field

from ..errors import ConfigError
from ..ir import DType, Graph, Node, Value
from .qdq_params import is_op

PRODUCTS = ("Conv", "MatMul", "Gemm")
PASS_THROUGH = ("MaxPool", "Reshape", "Flatten", "Transpose", "Squeeze", "Unsqueeze")
WHY_INT8 = "quantised: int8 weights per output channel, uint8 activations"
WHY_TWO_ACTIVATIONS = "a product of two activations: fusegraph's int8 products take a constant weight"
WHY_DYNAMIC_CONV = "a convolution needs calibration inputs (only MatMul / Gemm are quantised dynamically)"


@dataclass
class ProductPlan:
    node: Node
    name: str                  # the name op_precision and the report use (the imported node's)
    int8: bool
    why: str
    code: str                  # "int8", "op_precision", "int8_unsupported"
    weight_axis: int = 0       # the weight's output-channel axis


@dataclass
class TensorPlan:
    """``observe``: the activations to calibrate; ``same_as``: value name -> the value name
    whose parameters it shares (a pass-through op's output: its input's)."""
    observe: list[str] = field(default_factory=list)
    same_as: dict[str, str] = field(default_factory=dict)

    def __contains__(self, name: str) -> bool:
        return name in self.same_as or name in self.observe

    def root(self, name: str) -> str:
        while name in self.same_as:
            name = self.same_as[name]
        return name


def _float_activation(v: Value | None) -> bool:
    return v is not None and not v.is_const and v.dtype == DType.FLOAT


def _unsupported(n: Node, dynamic: bool) -> str | None:
    """Why product ``n`` cannot be quantised (None: it can)."""
    x, w = n.input(0), n.input(1)
    if n.outputs[0].dtype != DType.FLOAT or x is None or x.dtype != DType.FLOAT:
        return "not a float32 product"
    if x.is_const:
        return "its activation is a constant"
    if w is None or not w.is_const:
        return WHY_TWO_ACTIVATIONS
    if w.dtype != DType.FLOAT or w.shape is None:
        return "its weight is not a float32 constant"
    if n.op_type == "Conv":
        if dynamic:
            return WHY_DYNAMIC_CONV
        if len(w.shape) not in (3, 4, 5):
            return f"a convolution of rank {len(w.shape)}"
        b = n.input(2)
        if b is not None and (not b.is_const or b.dtype != DType.FLOAT):
            return "its bias is not a float32 constant"
        return None
    if n.op_type == "MatMul":
        return None if len(w.shape) == 2 and x.shape is not None and len(x.shape) >= (1 if not dynamic else 2) \
            else "not a product with a 2-D weight"
    a = n.attrs
    b = n.input(2)
    if float(a.get("alpha", 1.0)) != 1.0 or int(a.get("transA", 0)) or \
            (b is not None and float(a.get("beta", 1.0)) != 1.0):
        return "Gemm with alpha / beta other than 1 or transA"
    if len(w.shape) != 2:
        return "a Gemm whose weight is not 2-D"
    if b is not None and (not b.is_const or b.dtype != DType.FLOAT):
        return "its bias is not a float32 constant"
    return None


def _weight_axis(n: Node) -> int:
    if n.op_type == "Conv":
        return 0
    if n.op_type == "Gemm":
        return 0 if int(n.attrs.get("transB", 0)) else 1
    return 1


def _override(n: Node, entries: dict[str, str]) -> tuple[str, str] | None:
    """(key, value) of the op_precision entry for ``n``: by name first, then by op type."""
    names = [n.name, *n.meta.get("fused_from", ())]
    types = [n.op_type, *n.meta.get("fused_types", ())]
    for key in names + types:
        if key in entries:
            return key, entries[key]
    return None


def plan_products(graph: Graph, op_precision, imported_names: set[str], dynamic: bool) -> list[ProductPlan]:
    """One ``ProductPlan`` per float product of ``graph``, in graph order."""
    entries = dict(op_precision)
    out = []
    for n in graph.nodes:
        if not is_op(n, *PRODUCTS):
            continue
        name = next((x for x in n.meta.get("fused_from", ()) if x in imported_names), n.name) \
            if n.name not in imported_names else n.name
        why = _unsupported(n, dynamic)
        found = _override(n, entries)
        if found is not None and found[1] == "fp32":
            out.append(ProductPlan(n, name, False, f"Config.op_precision: {found[0]!r} fp32", "op_precision"))
        elif why is not None:
            if found is not None and found[0] not in (n.op_type, *n.meta.get("fused_types", ())):
                raise ConfigError(f"{graph.meta.get('source', graph.name)}: Config.op_precision asks for "
                                  f"{found[0]!r} in int8, but {name} ({n.op_type}) cannot run int8: {why}")
            out.append(ProductPlan(n, name, False, why, "int8_unsupported"))
        else:
            out.append(ProductPlan(n, name, True, WHY_INT8, "int8", _weight_axis(n)))
    _check_int8_entries(graph, entries, out)
    return out


def _check_int8_entries(graph: Graph, entries: dict[str, str], products: list[ProductPlan]) -> None:
    """An ``int8`` entry must name a product (a node, or the op type Conv / MatMul / Gemm)."""
    answered = {x for p in products for x in (p.name, p.node.name, *p.node.meta.get("fused_from", ()))}
    bad = [k for k, v in entries.items() if v == "int8" and k not in PRODUCTS and k not in answered]
    if bad:
        raise ConfigError(f"{graph.meta.get('source', graph.name)}: Config.op_precision asks for "
                          f"{', '.join(map(repr, bad))} in int8, which is no Conv / MatMul / Gemm node: only those "
                          f"run int8")


def _written_by_product(v: Value, quantised: set[int]) -> bool:
    p = v.producer
    if is_op(p, "Relu"):
        p = p.inputs[0].producer
    return p is not None and id(p) in quantised


def plan_tensors(graph: Graph, products: list[ProductPlan]) -> TensorPlan:
    """The activation tensors to quantise (static quantisation), by value name."""
    quantised = {id(p.node) for p in products if p.int8}
    plan = TensorPlan()
    wanted: dict[str, None] = {}             # ordered set of value names
    for p in products:
        if p.int8:
            wanted[p.node.inputs[0].name] = None
    for n in reversed(graph.nodes):
        if n.domain != "" or len(n.outputs) != 1:
            continue
        out = n.outputs[0]
        if n.op_type in PASS_THROUGH and out.name in wanted and _float_activation(n.input(0)):
            wanted[n.inputs[0].name] = None
            plan.same_as[out.name] = n.inputs[0].name
        elif n.op_type == "Concat" and out.name in wanted and all(_float_activation(v) for v in n.inputs):
            for v in n.inputs:
                wanted[v.name] = None
        elif n.op_type == "Add" or (n.op_type == "Sum" and len(n.inputs) == 2):
            y = out
            if len(out.uses) == 1 and is_op(out.uses[0][0], "Relu") and not out.is_graph_output:
                y = out.uses[0][0].outputs[0]
            a, b = n.input(0), n.input(1)
            if y.name in wanted and _float_activation(a) and _float_activation(b) and a.shape is not None \
                    and a.shape == b.shape == out.shape and (_written_by_product(a, quantised)
                                                              or _written_by_product(b, quantised)):
                wanted[a.name] = None
                wanted[b.name] = None
    plan.observe = [name for name in wanted if name not in plan.same_as]
    return plan
