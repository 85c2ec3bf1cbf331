"""oneDNN's C API through ctypes: the library, the functions this backend calls, their types,
the constants, one engine, and typed errors.

The library is the ``onednn-cpu-gomp`` wheel's ``libdnnl.so.3`` (oneDNN 3.x built against GNU
OpenMP). It is loaded after torch, so the dynamic loader binds it to torch's own
``libgomp.so.1`` (same soname): one OpenMP runtime, one thread team, and
``torch.set_num_threads`` sets the thread count oneDNN reads too. ``load()`` refuses (returns
None, ``UNAVAILABLE`` says why) when the wheel is missing, the platform is not x86-64 Linux,
the version is not 3.x, or a second OpenMP runtime appeared. No C compiler is involved:
every call goes through ctypes with its argument types declared (pointers never truncate).

What this module does to the process: it loads one shared library, fusegraph's own (torch
carries its own oneDNN, with its own state). It sets one global of that library: the
capacity of its primitive cache, to ``PRIMITIVE_CACHE_CAPACITY`` entries instead of oneDNN's
1024, unless the environment sets ``ONEDNN_PRIMITIVE_CACHE_CAPACITY`` (or the older
``DNNL_PRIMITIVE_CACHE_CAPACITY``), which then stands. A model with symbolic dims makes a
primitive per row count it meets (its layer norms, its bf16 matmuls, a decoder's prompt
products); each holds its JIT code and the cache would keep a thousand
of them alive after the kernels let them go (RESULTS.md: the private memory of
variable-length traffic). Identical primitives made close together (the layers of one
model) still come from the cache. Verbosity and ISA limits stay at their defaults.
"""
from __future__ import annotations

import ctypes as C
import importlib.metadata
import os
import platform
import sys
from pathlib import Path

import torch  # noqa: F401  (loaded first: libdnnl binds to torch's libgomp)

vp = C.c_void_p
Dims = C.c_int64 * 12          # dnnl_dims_t (DNNL_MAX_NDIMS = 12)

# dnnl_data_type_t
F16, BF16, F32, S32, S8, U8 = 1, 2, 3, 4, 5, 6
# dnnl_format_tag_t
TAG_ANY, TAG_A, TAG_AB, TAG_ABC, TAG_ABCD, TAG_ABCDE = 1, 2, 3, 4, 5, 6
TAG_ACDB = 22                  # nhwc
# dnnl_prop_kind_t, algorithms
FORWARD_INFERENCE = 96
FORWARD_TRAINING = 64          # a normalisation writes its statistics (ARG_MEAN, ARG_VARIANCE)
CONVOLUTION_DIRECT = 1
ELTWISE = {"relu": 32, "tanh": 33, "elu": 34, "square": 35, "abs": 36, "sqrt": 37, "linear": 38,
           "soft_relu": 39, "hardsigmoid": 40, "logistic": 41, "exp": 42, "gelu_tanh": 43, "swish": 44,
           "log": 45, "clip": 46, "clip_v2": 47, "pow": 48, "gelu_erf": 49, "round": 50, "mish": 51,
           "hardswish": 52}
POOLING_MAX, POOLING_AVG_INCLUDE, POOLING_AVG_EXCLUDE = 511, 767, 1023
LRN_ACROSS_CHANNELS = 2815
BINARY = {"add": 131056, "mul": 131057, "max": 131058, "min": 131059, "div": 131060, "sub": 131061}
SOFTMAX_ACCURATE = 196608
REDUCTION = {"max": 196594, "min": 196595, "sum": 196596, "mul": 196597, "mean": 196598}
RESAMPLING_LINEAR = 0x2fff1
# dnnl_rnn_direction_t
RNN_LEFT2RIGHT, RNN_RIGHT2LEFT, RNN_BIDIRECTIONAL_CONCAT = 1, 2, 3
# dnnl_query_t
Q_IMPL_INFO_STR, Q_STRIDES = 8, 14
Q_SRC_MD, Q_WEIGHTS_MD, Q_DST_MD, Q_WORKSPACE_MD, Q_SCRATCHPAD_MD = 129, 131, 133, 135, 136
Q_NDIMS, Q_DIMS, Q_DATA_TYPE, Q_PADDED_DIMS, Q_PADDED_OFFSETS, Q_FORMAT_KIND = 256, 257, 258, 260, 261, 262
Q_INNER_NBLKS, Q_INNER_BLKS, Q_INNER_IDXS = 263, 264, 265
FORMAT_KIND_BLOCKED = 2
SCRATCHPAD_USER = 1
FPMATH_STRICT, FPMATH_BF16 = 0, 1
USE_GLOBAL_STATS, USE_SCALE, USE_SHIFT = 1, 2, 4
# execution argument indices (DNNL_ARG_*)
ARG_SRC, ARG_SRC_1, ARG_DST, ARG_WEIGHTS, ARG_BIAS = 1, 2, 17, 33, 41
# recurrent primitives: layer / iteration inputs and outputs (DNNL_ARG_SRC_0..2, DST_0..2, WEIGHTS_0..2)
ARG_SRC_LAYER, ARG_SRC_ITER, ARG_SRC_ITER_C = 1, 2, 3
ARG_DST_LAYER, ARG_DST_ITER, ARG_DST_ITER_C = 17, 18, 19
ARG_WEIGHTS_LAYER, ARG_WEIGHTS_ITER, ARG_WEIGHTS_PEEPHOLE = 33, 34, 35
ARG_MEAN, ARG_VARIANCE, ARG_SCALE, ARG_SHIFT, ARG_WORKSPACE, ARG_SCRATCHPAD = 49, 50, 51, 52, 64, 80
ARG_MULTIPLE_SRC, ARG_POST_OP_BASE = 1024, 32768
ARG_ATTR_SCALES, ARG_ATTR_ZERO_POINTS = 4096, 8192     # | ARG_SRC / ARG_WEIGHTS / ARG_DST: int8 quantisation


def arg_post_op_src1(index: int) -> int:
    """``DNNL_ARG_ATTR_MULTIPLE_POST_OP(index) | DNNL_ARG_SRC_1``: a binary post-op's operand."""
    return (ARG_POST_OP_BASE * (index + 1)) | ARG_SRC_1


class ExecArg(C.Structure):
    _fields_ = [("arg", C.c_int), ("memory", vp)]


STATUS = {1: "out of memory", 2: "invalid arguments", 3: "unimplemented", 5: "runtime error",
          6: "not required", 4: "last implementation reached"}


class DnnlError(RuntimeError):
    """A oneDNN call failed; ``status`` is its dnnl_status_t (3: no implementation)."""

    def __init__(self, what: str, status: int):
        super().__init__(f"oneDNN {what}: {STATUS.get(status, 'status')} ({status})")
        self.status = status


_P = C.POINTER
_SIGNATURES = {   # name -> (restype, argtypes)
    "dnnl_version": (vp, []),
    "dnnl_engine_create": (C.c_int, [_P(vp), C.c_int, C.c_size_t]),
    "dnnl_stream_create": (C.c_int, [_P(vp), vp, C.c_uint]),
    "dnnl_stream_destroy": (C.c_int, [vp]),
    "dnnl_memory_desc_create_with_strides": (C.c_int, [_P(vp), C.c_int, Dims, C.c_int, Dims]),
    "dnnl_memory_desc_create_with_tag": (C.c_int, [_P(vp), C.c_int, Dims, C.c_int, C.c_int]),
    "dnnl_memory_desc_clone": (C.c_int, [_P(vp), vp]),
    "dnnl_memory_desc_destroy": (C.c_int, [vp]),
    "dnnl_memory_desc_query": (C.c_int, [vp, C.c_int, vp]),
    "dnnl_memory_desc_equal": (C.c_int, [vp, vp]),
    "dnnl_memory_desc_get_size": (C.c_size_t, [vp]),
    "dnnl_memory_desc_reshape": (C.c_int, [_P(vp), vp, C.c_int, Dims]),
    "dnnl_memory_create": (C.c_int, [_P(vp), vp, vp, vp]),
    "dnnl_memory_set_data_handle": (C.c_int, [vp, vp]),
    "dnnl_memory_destroy": (C.c_int, [vp]),
    "dnnl_primitive_attr_create": (C.c_int, [_P(vp)]),
    "dnnl_primitive_attr_destroy": (C.c_int, [vp]),
    "dnnl_primitive_attr_set_scratchpad_mode": (C.c_int, [vp, C.c_int]),
    "dnnl_primitive_attr_set_fpmath_mode": (C.c_int, [vp, C.c_int]),
    "dnnl_primitive_attr_set_post_ops": (C.c_int, [vp, vp]),
    "dnnl_primitive_attr_set_scales_mask": (C.c_int, [vp, C.c_int, C.c_int]),
    "dnnl_primitive_attr_set_zero_points_mask": (C.c_int, [vp, C.c_int, C.c_int]),
    "dnnl_post_ops_create": (C.c_int, [_P(vp)]),
    "dnnl_post_ops_destroy": (C.c_int, [vp]),
    "dnnl_post_ops_append_sum": (C.c_int, [vp, C.c_float, C.c_int32, C.c_int]),
    "dnnl_post_ops_append_eltwise": (C.c_int, [vp, C.c_int, C.c_float, C.c_float]),
    "dnnl_post_ops_append_binary": (C.c_int, [vp, C.c_int, vp]),
    "dnnl_primitive_desc_query": (C.c_int, [vp, C.c_int, C.c_int, vp]),
    "dnnl_primitive_desc_query_md": (vp, [vp, C.c_int, C.c_int]),
    "dnnl_primitive_desc_destroy": (C.c_int, [vp]),
    "dnnl_primitive_create": (C.c_int, [_P(vp), vp]),
    "dnnl_primitive_destroy": (C.c_int, [vp]),
    "dnnl_primitive_execute": (C.c_int, [vp, vp, C.c_int, vp]),
    "dnnl_reorder_primitive_desc_create": (C.c_int, [_P(vp), vp, vp, vp, vp, vp]),
    "dnnl_convolution_forward_primitive_desc_create": (
        C.c_int, [_P(vp), vp, C.c_int, C.c_int, vp, vp, vp, vp, Dims, Dims, Dims, Dims, vp]),
    "dnnl_matmul_primitive_desc_create": (C.c_int, [_P(vp), vp, vp, vp, vp, vp, vp]),
    "dnnl_inner_product_forward_primitive_desc_create": (C.c_int, [_P(vp), vp, C.c_int, vp, vp, vp, vp, vp]),
    "dnnl_pooling_forward_primitive_desc_create": (
        C.c_int, [_P(vp), vp, C.c_int, C.c_int, vp, vp, Dims, Dims, Dims, Dims, Dims, vp]),
    "dnnl_lrn_forward_primitive_desc_create": (
        C.c_int, [_P(vp), vp, C.c_int, C.c_int, vp, vp, C.c_int64, C.c_float, C.c_float, C.c_float, vp]),
    "dnnl_eltwise_forward_primitive_desc_create": (
        C.c_int, [_P(vp), vp, C.c_int, C.c_int, vp, vp, C.c_float, C.c_float, vp]),
    "dnnl_binary_primitive_desc_create": (C.c_int, [_P(vp), vp, C.c_int, vp, vp, vp, vp]),
    "dnnl_softmax_forward_primitive_desc_create": (C.c_int, [_P(vp), vp, C.c_int, C.c_int, vp, vp, C.c_int, vp]),
    "dnnl_layer_normalization_forward_primitive_desc_create": (
        C.c_int, [_P(vp), vp, C.c_int, vp, vp, vp, C.c_float, C.c_uint, vp]),
    "dnnl_concat_primitive_desc_create": (C.c_int, [_P(vp), vp, vp, C.c_int, C.c_int, _P(vp), vp]),
    "dnnl_reduction_primitive_desc_create": (C.c_int, [_P(vp), vp, C.c_int, vp, vp, C.c_float, C.c_float, vp]),
    "dnnl_resampling_forward_primitive_desc_create": (C.c_int, [_P(vp), vp, C.c_int, C.c_int, vp, vp, vp, vp]),
    "dnnl_get_effective_cpu_isa": (C.c_int, []),
    "dnnl_sgemm": (C.c_int, [C.c_char, C.c_char, C.c_int64, C.c_int64, C.c_int64, C.c_float, vp, C.c_int64, vp,
                             C.c_int64, C.c_float, vp, C.c_int64]),
    "dnnl_vanilla_rnn_forward_primitive_desc_create": (
        C.c_int, [_P(vp), vp, C.c_int, C.c_int, C.c_int] + [vp] * 7 + [C.c_uint, C.c_float, C.c_float, vp]),
    "dnnl_lstm_forward_primitive_desc_create": (C.c_int, [_P(vp), vp, C.c_int, C.c_int] + [vp] * 11 + [C.c_uint, vp]),
    "dnnl_gru_forward_primitive_desc_create": (C.c_int, [_P(vp), vp, C.c_int, C.c_int] + [vp] * 7 + [C.c_uint, vp]),
    "dnnl_lbr_gru_forward_primitive_desc_create": (
        C.c_int, [_P(vp), vp, C.c_int, C.c_int] + [vp] * 7 + [C.c_uint, vp]),
}


class Library:
    """The loaded library: every function of ``_SIGNATURES`` as an attribute, one CPU engine."""

    def __init__(self, path: str):
        self.path = path
        self.cdll = C.CDLL(path)
        for name, (res, args) in _SIGNATURES.items():
            fn = getattr(self.cdll, name)
            fn.restype, fn.argtypes = res, args
            setattr(self, name[5:], fn)           # dnnl_memory_create -> lib.memory_create
        ver = C.cast(self.version(), _P(C.c_int * 4)).contents
        self.version_tuple = (ver[0], ver[1], ver[2])
        self.engine = vp()
        check(self.engine_create(C.byref(self.engine), 1, 0), "engine_create")
        self.execute = self.primitive_execute     # the hot path's one call


def check(status: int, what: str) -> None:
    if status != 0:
        raise DnnlError(what, status)


def _candidates() -> list[Path]:
    found = []
    try:
        for f in importlib.metadata.files("onednn-cpu-gomp") or ():
            if f.name.startswith("libdnnl.so.3"):
                found.append(Path(f.locate()))
    except importlib.metadata.PackageNotFoundError:
        pass
    found.append(Path(sys.prefix) / "lib" / "libdnnl.so.3")
    return found


def _openmp_runtimes() -> set[str]:
    try:
        with open("/proc/self/maps") as f:
            return {line.split()[-1] for line in f
                    if ("libgomp" in line or "libiomp" in line) and "/" in line.split()[-1]}
    except OSError:
        return set()


UNAVAILABLE = ""
_LIB: list = []
PRIMITIVE_CACHE_CAPACITY = 128
CACHE_ENVIRONMENT = ("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "DNNL_PRIMITIVE_CACHE_CAPACITY")


def load() -> Library | None:
    """The library, loaded once; None when it cannot be used here (``UNAVAILABLE`` says why)."""
    global UNAVAILABLE
    if _LIB:
        return _LIB[0]
    lib = None
    if not (sys.platform.startswith("linux") and platform.machine() in ("x86_64", "AMD64")):
        UNAVAILABLE = f"oneDNN kernels are built for x86-64 Linux, not {sys.platform} {platform.machine()}"
    else:
        before = _openmp_runtimes()
        path = next((p for p in _candidates() if p.is_file()), None)
        if path is None:
            UNAVAILABLE = "the onednn-cpu-gomp wheel is not installed (pip install onednn-cpu-gomp)"
        else:
            try:
                lib = Library(os.fspath(path))
            except (OSError, AttributeError, DnnlError) as exc:
                UNAVAILABLE = f"{path}: {exc}"
            else:
                after = _openmp_runtimes()
                if lib.version_tuple[0] != 3:
                    UNAVAILABLE, lib = f"{path}: oneDNN {lib.version_tuple} is not 3.x", None
                elif len(after) > max(1, len(before)):
                    UNAVAILABLE, lib = f"{path} brought a second OpenMP runtime ({sorted(after)})", None
    if lib is not None and not any(v in os.environ for v in CACHE_ENVIRONMENT):
        check(lib.cdll.dnnl_set_primitive_cache_capacity(PRIMITIVE_CACHE_CAPACITY), "set_primitive_cache_capacity")
    _LIB.append(lib)
    return lib
