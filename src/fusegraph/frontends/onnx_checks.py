"""Import-time checks of an ONNX model against the ONNX op schemas, before any IR is built.

Refuses with ``ModelLoadError`` (naming the model and node) what onnxruntime refuses when it
loads a model: an opset newer than the installed onnx knows (or below 1), a node with no
outputs, a standard-domain node whose input / output count is outside its schema's range or
whose single (non-optional) input is left empty, an attribute the schema does not have or
of the wrong type (a float
``perm``, a string ``axis``) or of undefined type, a required attribute missing, a declared
graph input / output dim below zero, and window attributes (``strides``, ``dilations``,
``kernel_shape``, ``pads``, ``group``) that no convolution or pool can have. So passes and
kernels never see a malformed node. Ops of other domains are checked for outputs and
attribute types only. This file builds nothing and optimises nothing.
"""
from __future__ import annotations

import functools
import re

import onnx
from onnx import defs

from ..errors import ModelLoadError
from ..ir import DType

_STANDARD = ("", "ai.onnx")
_VERSIONS = defs.C.schema_version_map()        # domain -> (lowest, highest) opset onnx knows
_MAX_CUSTOM_OPSET = 10_000
# ops whose window attributes must be positive (strides, dilations, kernel_shape, group) and
# whose pads must be non-negative
_WINDOWED = {"Conv", "ConvTranspose", "ConvInteger", "QLinearConv", "MaxPool", "AveragePool",
             "LpPool", "MaxUnpool", "DeformConv", "MaxRoiPool", "Col2Im"}
_POSITIVE = ("strides", "dilations", "kernel_shape")
# int attributes that are flags: onnxruntime reads 1 as true and anything else as false, others
# read any non-zero value as true; a value other than 0 or 1 is refused rather than guessed
_FLAGS = {"keepdims", "transA", "transB", "noop_with_empty_axes", "ceil_mode", "count_include_pad",
          "select_last_index", "exclusive", "reverse", "largest", "sorted", "allowzero", "upper",
          "detect_negative", "detect_positive", "training_mode", "fmod", "new_axis", "interleaved",
          "layout", "storage_order", "center_point_box"}


def check_text(message, where: str, path: str = "model", depth: int = 0) -> None:
    """Every ``string`` field of ``message`` (and of the messages it holds) is valid UTF-8.

    protobuf keeps a parsed string that is not UTF-8 as bytes (upb hands them out as ``bytes``
    or raises ``UnicodeDecodeError`` when one is read); a node op type, a graph or value name
    like that is refused here, naming the field, instead of failing as a TypeError later."""
    if depth > 64:
        raise ModelLoadError(f"{where}: {path}: messages nested deeper than 64 levels")
    try:
        fields = message.ListFields()
    except UnicodeDecodeError:
        raise ModelLoadError(f"{where}: {path} holds text that is not valid UTF-8") from None
    kinds = _field_kinds(message.DESCRIPTOR)
    for field, value in fields:
        text, nested, repeated = kinds[field.name]
        if text:
            try:
                bad = next((v for v in value if not isinstance(v, str)), None) if repeated else \
                    (None if isinstance(value, str) else value)
            except UnicodeDecodeError:
                bad = b"?"
            if bad is not None:
                raise ModelLoadError(f"{where}: {path}.{field.name} is not valid UTF-8 text "
                                     f"({bytes(bad)[:40]!r})")
        elif nested:
            if not repeated:
                check_text(value, where, f"{path}.{field.name}", depth + 1)
                continue
            for i, item in enumerate(value):
                check_text(item, where, f"{path}.{field.name}[{i}]", depth + 1)


@functools.lru_cache(maxsize=None)
def _field_kinds(descriptor) -> dict[str, tuple[bool, bool, bool]]:
    """Per field of a message type: (a string, a message to walk, repeated)."""
    kinds = {}
    for f in descriptor.fields:
        flag = getattr(f, "is_repeated", None)        # protobuf >= 5.28 (``label`` is deprecated there)
        repeated = flag if isinstance(flag, bool) else f.label == f.LABEL_REPEATED
        nested = f.type == f.TYPE_MESSAGE and not f.message_type.GetOptions().map_entry
        kinds[f.name] = (f.type == f.TYPE_STRING, nested, repeated)
    return kinds


def check_opsets(opset: dict[str, int], where: str) -> None:
    """Every imported opset must be one an ONNX runtime could know."""
    for domain, version in opset.items():
        name = domain or "ai.onnx"
        known = _VERSIONS.get(domain if domain else "")
        if version < 1:
            raise ModelLoadError(f"{where}: opset {version} of domain {name!r} is not a valid opset "
                                 f"version (versions start at 1)")
        if known is not None and version > known[1]:
            raise ModelLoadError(f"{where}: the model imports opset {version} of domain {name!r}; the "
                                 f"newest this installation knows is {known[1]}")
        if known is None and version > _MAX_CUSTOM_OPSET:
            raise ModelLoadError(f"{where}: opset {version} of domain {name!r} is not a plausible "
                                 f"opset version (at most {_MAX_CUSTOM_OPSET})")


def check_model(proto: onnx.ModelProto, where: str) -> None:
    """Model-level facts: an IR version this onnx knows, at least one graph output."""
    if proto.ir_version > onnx.IR_VERSION:
        raise ModelLoadError(f"{where}: IR version {proto.ir_version} is newer than the newest this "
                             f"installation knows ({onnx.IR_VERSION})")
    if not proto.graph.output:
        raise ModelLoadError(f"{where}: the graph declares no outputs; a model must have at least one")


def check_value_dims(graph: onnx.GraphProto, where: str) -> None:
    """Declared dims of graph inputs and outputs are sizes: never below zero; a graph input
    (not an initializer's default) holds a type that can be fed."""
    inits = {t.name for t in graph.initializer}
    for vi in graph.input:
        elem = vi.type.tensor_type.elem_type if vi.type.HasField("tensor_type") else None
        if vi.name in inits or elem is None:
            continue
        try:
            DType(elem).to_torch()
        except (ValueError, TypeError):
            name = DType(elem).name if elem in DType._value2member_map_ else f"type {elem}"
            raise ModelLoadError(f"{where}: graph input {vi.name!r} has element type {name}, which "
                                 f"fusegraph cannot feed (numeric and bool tensors only)") from None
    for kind, infos in (("input", graph.input), ("output", graph.output)):
        for vi in infos:
            if not vi.type.HasField("tensor_type") or not vi.type.tensor_type.HasField("shape"):
                continue
            for k, d in enumerate(vi.type.tensor_type.shape.dim):
                if d.HasField("dim_value") and d.dim_value < 0:
                    raise ModelLoadError(f"{where}: graph {kind} {vi.name!r} declares dim {k} as "
                                         f"{d.dim_value}; a dim must be >= 0 or symbolic")


def check_node(node: onnx.NodeProto, label: str, domain: str, version: int, where: str) -> None:
    """Refuse a node the ONNX schema of its op (at the model's opset) does not allow."""
    at = f"{where}: node {label!r} ({node.op_type})"
    if not any(node.output):
        raise ModelLoadError(f"{at} has no outputs; every node must define at least one value")
    for attr in node.attribute:
        if attr.type == onnx.AttributeProto.UNDEFINED:
            raise ModelLoadError(f"{at}: attribute {attr.name!r} has no type")
    if domain not in _STANDARD:
        return
    try:
        schema = defs.get_schema(node.op_type, version, "")
    except defs.SchemaError:
        return        # unknown op: the registry refuses it with UnsupportedOpError
    _check_arity(node, schema, at)
    _check_attributes(node, schema, at)
    if node.op_type in _WINDOWED:
        _check_window(node, at)


def _check_arity(node: onnx.NodeProto, schema, at: str) -> None:
    n_in, n_out = len(node.input), len(node.output)
    if not schema.min_input <= n_in <= schema.max_input:
        raise ModelLoadError(f"{at} has {n_in} inputs; opset {schema.since_version} of "
                             f"{node.op_type} takes {_range(schema.min_input, schema.max_input)}")
    if not schema.min_output <= n_out <= schema.max_output:
        raise ModelLoadError(f"{at} has {n_out} outputs; opset {schema.since_version} of "
                             f"{node.op_type} gives {_range(schema.min_output, schema.max_output)}")
    single = defs.OpSchema.FormalParameterOption.Single
    for names, formals, kind in ((node.input, schema.inputs, "input"), (node.output, schema.outputs, "output")):
        for i, name in enumerate(names):
            formal = formals[min(i, len(formals) - 1)] if formals else None
            if name or formal is None:
                continue
            if formal.option == single and i < len(formals):
                raise ModelLoadError(f"{at}: {kind} {i} ({formal.name}) is required but left empty")
            if formal.option == defs.OpSchema.FormalParameterOption.Variadic and i >= len(formals) - 1:
                raise ModelLoadError(f"{at}: {kind} {i} ({formal.name}) is left empty; variadic "
                                     f"{kind}s need a value")


def _range(lo: int, hi: int) -> str:
    if hi >= 1 << 30:
        return f"at least {lo}"
    return f"{lo}" if lo == hi else f"{lo} to {hi}"


def _check_attributes(node: onnx.NodeProto, schema, at: str) -> None:
    given = {a.name: a for a in node.attribute}
    unknown = sorted(set(given) - set(schema.attributes))
    if unknown:
        raise ModelLoadError(f"{at}: unrecognised attribute(s) {unknown}; opset {schema.since_version} of "
                             f"{node.op_type} has {sorted(schema.attributes) or 'none'}")
    for name, spec in schema.attributes.items():
        attr = given.get(name)
        if attr is None:
            if spec.required:
                raise ModelLoadError(f"{at} lacks required attribute {name!r} "
                                     f"({_type_name(int(spec.type))})")
            continue
        if attr.ref_attr_name:
            continue
        if int(attr.type) != int(spec.type):
            raise ModelLoadError(f"{at}: attribute {name!r} is {_type_name(attr.type)}; the ONNX "
                                 f"schema wants {_type_name(int(spec.type))}")
        if name in _FLAGS and attr.type == onnx.AttributeProto.INT and attr.i not in (0, 1):
            raise ModelLoadError(f"{at}: attribute {name!r} is {attr.i}; it is a flag, 0 or 1")


def _type_name(code: int) -> str:
    try:
        return onnx.AttributeProto.AttributeType.Name(code)
    except ValueError:
        return f"type {code}"


def _check_window(node: onnx.NodeProto, at: str) -> None:
    ranks = {a.name: len(a.ints) for a in node.attribute if a.name in _POSITIVE}
    if len(set(ranks.values())) > 1:
        raise ModelLoadError(f"{at}: attributes {ranks} give different numbers of spatial dims")
    pads = next((a for a in node.attribute if a.name == "pads"), None)
    if ranks and pads is not None and len(pads.ints) != 2 * next(iter(ranks.values())):
        raise ModelLoadError(f"{at}: 'pads' has {len(pads.ints)} entries; {2 * next(iter(ranks.values()))} "
                             f"expected (begin and end of each spatial dim)")
    for attr in node.attribute:
        if attr.name in _POSITIVE and any(v < 1 for v in attr.ints):
            raise ModelLoadError(f"{at}: attribute {attr.name!r} is {list(attr.ints)}; every entry "
                                 f"must be >= 1")
        if attr.name == "pads" and any(v < 0 for v in attr.ints):
            raise ModelLoadError(f"{at}: attribute 'pads' is {list(attr.ints)}; pads must be >= 0")
        if attr.name == "group" and attr.i < 1:
            raise ModelLoadError(f"{at}: attribute 'group' is {attr.i}; it must be >= 1")


def check_types(light: onnx.ModelProto, where: str) -> tuple[onnx.ModelProto | None, ModelLoadError | None]:
    """ONNX's own strict type and shape inference over the graph, as onnxruntime runs it on load
    (type constraints such as Mul's ``T`` bound to float and int64, incompatible broadcasts).
    ``light``: the model without large initializers; its value_info and declared output shapes
    are left out (fusegraph infers them; a stale declaration is only a hint). Returns the
    inferred model (None when inference itself failed) and the error to raise once the
    importer's own, more specific checks have run (None: the model passes). No data
    propagation: onnx's walks every 1-D value element by element (2**40 elements: a hang)."""
    check = onnx.ModelProto()
    check.CopyFrom(light)
    check.graph.ClearField("value_info")
    for out in check.graph.output:
        if out.type.HasField("tensor_type"):
            out.type.tensor_type.ClearField("shape")
    try:
        return onnx.shape_inference.infer_shapes(check, check_type=True, strict_mode=True, data_prop=False), None
    except onnx.shape_inference.InferenceError as exc:
        msg = " ".join(str(exc).split())
        if _in_function_op(msg, light):   # onnx's strict inference of function bodies is unreliable
            try:
                return onnx.shape_inference.infer_shapes(check, check_type=False, strict_mode=False,
                                                         data_prop=False), None
            except Exception:   # noqa: BLE001
                return None, None
        return None, ModelLoadError(f"{where}: ONNX type and shape inference refuses the model: {msg[:400]}")
    except Exception:   # noqa: BLE001 - inference itself failing is not the model's fault
        return None, None


def _in_function_op(msg: str, model: onnx.ModelProto) -> bool:
    """Whether an inference error names an op that ONNX defines as a function (its body is
    inferred too, and strict mode trips on some bodies that onnxruntime runs: MVN)."""
    version = {i.domain: i.version for i in model.opset_import}.get("", 1)
    for op in re.findall(r"op_type:([A-Za-z0-9_]+)", msg):
        try:
            schema = defs.get_schema(op, version, "")
        except defs.SchemaError:
            continue
        if schema.has_function or schema.has_context_dependent_function:
            return True
    return False


def small_vectors(inferred: onnx.ModelProto, limit: int = 1 << 12) -> bool:
    """Whether no 1-D tensor of ``inferred`` has a static length over ``limit``, so onnx's data
    propagation (which walks 1-D values element by element) stays cheap."""
    g = inferred.graph
    for vi in list(g.input) + list(g.value_info) + list(g.output):
        tt = vi.type.tensor_type if vi.type.HasField("tensor_type") else None
        if tt is not None and tt.HasField("shape") and len(tt.shape.dim) == 1:
            d = tt.shape.dim[0]
            if d.HasField("dim_value") and d.dim_value > limit:
                return False
    return all(len(t.dims) != 1 or t.dims[0] <= limit for t in g.initializer)
