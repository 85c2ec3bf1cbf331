"""KServe v2 tensors: datatype names, and checking a request's tensors against a model.

Both front ends (HTTP JSON / binary, gRPC typed / raw contents) decode into numpy arrays and
call ``check_inputs`` here, so a wrong name, datatype, shape or element count is refused with
the same ``RequestError`` (HTTP 400, gRPC INVALID_ARGUMENT) naming the input and what was
expected, before the request can join a batch. Element counts are Python integers, so no
shape (``[2^40, 2^40]``) can overflow into a small one. Floating values that JSON cannot
write (NaN, infinities) travel as the strings protobuf's JSON mapping uses (``json_values``).
Nothing here touches a socket or a model run.
"""
from __future__ import annotations

import logging
import math
from dataclasses import dataclass

import numpy as np

from ..errors import FusegraphError, InputError, RunCancelled, RunDeadlineExceeded

# KServe v2 datatype name <-> numpy dtype. BYTES (strings) and BF16 have no fusegraph input here.
_TO_NUMPY = {
    "BOOL": np.bool_, "UINT8": np.uint8, "UINT16": np.uint16, "UINT32": np.uint32, "UINT64": np.uint64,
    "INT8": np.int8, "INT16": np.int16, "INT32": np.int32, "INT64": np.int64,
    "FP16": np.float16, "FP32": np.float32, "FP64": np.float64,
}
_FROM_IR = {"FLOAT": "FP32", "DOUBLE": "FP64", "FLOAT16": "FP16", "BFLOAT16": "BF16", "STRING": "BYTES"}
KNOWN_DATATYPES = tuple(_TO_NUMPY) + ("BYTES", "BF16")


class RequestError(InputError):
    """A request the server refuses: ``status`` is the HTTP code (400, 404, 503, 504)."""

    def __init__(self, message: str, status: int = 400):
        super().__init__(message)
        self.status = status


def status_of(exc: Exception) -> tuple[int, str]:
    """(HTTP status, message) for an exception a request raised: its own status; 504 for a run
    stopped at its deadline, 503 for one stopped because the server is shutting down; 400 for
    any other typed fusegraph error; 500 (logged) for anything else, which is a fault of the
    server, never of the request."""
    if isinstance(exc, RequestError):
        return exc.status, str(exc)
    if isinstance(exc, RunDeadlineExceeded):
        return 504, str(exc)
    if isinstance(exc, RunCancelled):
        return 503, str(exc)
    if isinstance(exc, FusegraphError):
        return 400, str(exc)
    logging.getLogger("fusegraph.serve").exception("internal error")
    return 500, f"internal server error: {type(exc).__name__}"


def datatype_of(dtype) -> str:
    """The KServe datatype name of a fusegraph ``DType``."""
    return _FROM_IR.get(dtype.name, dtype.name)


def numpy_dtype(datatype: str, where: str) -> np.dtype:
    try:
        return np.dtype(_TO_NUMPY[datatype])
    except KeyError:
        if datatype in KNOWN_DATATYPES:
            raise RequestError(f"{where}: datatype {datatype} is not supported by this server") from None
        raise RequestError(f"{where}: unknown datatype {datatype!r}; expected one of "
                           f"{', '.join(_TO_NUMPY)}") from None


def datatype_of_array(array: np.ndarray) -> str:
    for name, np_type in _TO_NUMPY.items():
        if array.dtype == np_type:
            return name
    raise RequestError(f"output dtype {array.dtype} has no KServe datatype", status=500)


@dataclass(frozen=True)
class TensorSpec:
    """A model input or output as the protocol shows it: -1 for a dim of any size."""
    name: str
    datatype: str
    shape: tuple[int, ...]
    symbols: tuple[str | None, ...]  # the model's symbolic dim names (None: fixed or batch)

    def to_json(self) -> dict:
        return {"name": self.name, "datatype": self.datatype, "shape": list(self.shape)}


MAX_DIM = (1 << 63) - 1        # the protocol's dims are int64
MAX_RANK = 16


def check_shape(shape, where: str) -> tuple[int, ...]:
    if not isinstance(shape, (list, tuple)) or not all(
            isinstance(d, int) and not isinstance(d, bool) for d in shape):
        raise RequestError(f"{where}: 'shape' must be a list of integers, got {str(shape)[:200]}")
    if len(shape) > MAX_RANK:
        raise RequestError(f"{where}: 'shape' has {len(shape)} dims, at most {MAX_RANK} are accepted")
    if any(d < 0 for d in shape):
        raise RequestError(f"{where}: 'shape' dims must be >= 0, got {list(shape)}")
    if any(d > MAX_DIM for d in shape):
        raise RequestError(f"{where}: 'shape' dims must be below 2^63, got {list(shape)}")
    return tuple(int(d) for d in shape)


def element_count(shape: tuple[int, ...]) -> int:
    """Elements of ``shape``, in Python integers (a product past 2^63 stays exact, never wraps)."""
    return math.prod(shape)


def _shaped(array: np.ndarray, shape: tuple[int, ...], where: str) -> np.ndarray:
    try:
        return array.reshape(shape)
    except (ValueError, OverflowError) as exc:   # dims numpy cannot hold (a 0 beside 2^62 ...)
        raise RequestError(f"{where}: shape {list(shape)} cannot be made: {exc}") from None


def from_bytes(raw: bytes | memoryview, datatype: str, shape: tuple[int, ...], where: str) -> np.ndarray:
    """An array from the little-endian bytes of a binary tensor, its size checked first."""
    dtype = numpy_dtype(datatype, where)
    count = element_count(shape)
    if len(raw) != count * dtype.itemsize:
        raise RequestError(f"{where}: shape {list(shape)} of {datatype} needs {count * dtype.itemsize} bytes, "
                           f"got {len(raw)}")
    return _shaped(np.frombuffer(raw, dtype=dtype.newbyteorder("<")).astype(dtype), shape, where)  # a copy


NONFINITE = {"NaN": float("nan"), "Infinity": float("inf"), "-Infinity": float("-inf")}


def from_values(values, datatype: str, shape: tuple[int, ...], where: str) -> np.ndarray:
    """An array from a JSON (or gRPC typed) list of numbers, in row-major order. Floating
    datatypes also take the strings ``"NaN"``, ``"Infinity"``, ``"-Infinity"`` (what
    ``json_values`` writes for those values)."""
    dtype = numpy_dtype(datatype, where)
    count = element_count(shape)
    try:
        array = np.asarray(values)
    except (ValueError, TypeError, RecursionError):
        raise RequestError(f"{where}: 'data' must be a flat or nested list of numbers") from None
    if array.dtype.kind in "U" and dtype.kind == "f":
        array = _with_nonfinite(values, where, datatype)
    if array.dtype == object or array.dtype.kind in "USV":
        raise RequestError(f"{where}: 'data' must hold only numbers of datatype {datatype}")
    if array.size != count:
        raise RequestError(f"{where}: shape {list(shape)} needs {count} elements, 'data' has {array.size}")
    if dtype.kind in "iub" and array.dtype.kind == "f":
        raise RequestError(f"{where}: datatype {datatype} needs integers, 'data' holds floats")
    if dtype.kind in "iu" and array.size:
        info = np.iinfo(dtype)
        if array.dtype.kind == "b" or array.min() < info.min or array.max() > info.max:
            raise RequestError(f"{where}: 'data' values do not fit {datatype}")
    return _shaped(array.astype(dtype), shape, where)


def _with_nonfinite(values, where: str, datatype: str) -> np.ndarray:
    """``values`` (numbers and the strings of ``NONFINITE``) as float64; any other string is refused."""
    items = np.asarray(values, dtype=object).ravel()
    out = np.empty(items.size, np.float64)
    for i, v in enumerate(items.tolist()):
        if isinstance(v, str):
            if v not in NONFINITE:
                raise RequestError(f"{where}: 'data' must hold only numbers of datatype {datatype} (or "
                                   f"\"NaN\", \"Infinity\", \"-Infinity\"), got {v[:40]!r}")
            v = NONFINITE[v]
        elif isinstance(v, bool) or not isinstance(v, (int, float)):
            raise RequestError(f"{where}: 'data' must hold only numbers of datatype {datatype}")
        out[i] = v
    return out


def json_values(array: np.ndarray) -> list:
    """An array's values as a flat list for a JSON response: NaN and infinities become the
    strings ``"NaN"``, ``"Infinity"``, ``"-Infinity"``, as protobuf's JSON mapping writes them
    (JSON itself has no token for them; ``float()`` and numpy read those strings back)."""
    flat = array.ravel()
    values = flat.tolist()
    if flat.dtype.kind == "f" and flat.size and not bool(np.isfinite(flat).all()):
        for i in np.flatnonzero(~np.isfinite(flat)).tolist():
            v = values[i]
            values[i] = "NaN" if v != v else ("Infinity" if v > 0 else "-Infinity")
    return values


def check_inputs(model: str, specs: list[TensorSpec], arrays: dict[str, np.ndarray],
                 batch_axis: int | None, max_batch: int) -> int:
    """Check every input against the model; returns the request's batch size (1 unbatched)."""
    expected = {s.name: s for s in specs}
    for name in arrays:
        if name not in expected:
            raise RequestError(f"model {model!r} has no input {name!r}; its inputs are "
                               + ", ".join(repr(s.name) for s in specs))
    missing = [s for s in specs if s.name not in arrays]
    if missing:
        raise RequestError(f"model {model!r}: missing input(s) " + ", ".join(
            f"{s.name!r} ({s.datatype} {list(s.shape)})" for s in missing))
    symbols: dict[str, tuple[int, str]] = {}
    batch: tuple[int, str] | None = None
    for spec in specs:
        array = arrays[spec.name]
        got = datatype_of_array(array) if array.dtype != object else "BYTES"
        if got != spec.datatype:
            raise RequestError(f"model {model!r} input {spec.name!r} expects datatype {spec.datatype}, got {got}")
        if array.ndim != len(spec.shape):
            raise RequestError(f"model {model!r} input {spec.name!r} expects shape {list(spec.shape)} "
                               f"(rank {len(spec.shape)}), got {list(array.shape)}")
        for axis, (want, size, sym) in enumerate(zip(spec.shape, array.shape, spec.symbols)):
            if batch_axis is not None and axis == batch_axis:
                if size < 1 or size > max_batch:
                    raise RequestError(f"model {model!r} input {spec.name!r}: batch dim {axis} must be 1.."
                                       f"{max_batch} (max_batch_size), got {size}")
                if batch is not None and batch[0] != size:
                    raise RequestError(f"model {model!r} input {spec.name!r}: batch dim is {size}, but input "
                                       f"{batch[1]!r} has batch {batch[0]}")
                batch = (size, spec.name)
            elif want >= 0 and size != want:
                raise RequestError(f"model {model!r} input {spec.name!r} expects shape {list(spec.shape)}, got "
                                   f"{list(array.shape)} (dim {axis} must be {want})")
            elif want < 0 and sym is not None:
                seen = symbols.setdefault(sym, (size, spec.name))
                if seen[0] != size:
                    raise RequestError(f"model {model!r} input {spec.name!r} dim {axis} ({sym!r}) is {size}, but "
                                       f"input {seen[1]!r} has {sym!r} = {seen[0]}")
    return batch[0] if batch else 1
