"""``fusegraph::LinearAct`` / ``fusegraph::Linear`` with a constant weight whose rows are only
known at run time (a model with symbolic input dims): the weight held once, in one layout for
every row count.

``x`` of shape ``[..., K]`` is read as ``[M, K]`` (row-major), ``y = act(x @ W + b)`` written as
``[M, N]``. Two ways to run it, chosen per model:

- **float32, any row count** (an encoder's requests, of any length): the plain ``K x N``
  weight and oneDNN's ``dnnl_sgemm``. Its kernels are generated once per process, whatever M
  is; the brgemm matmul generates code for every new M (a fraction of a millisecond per
  product shape, paid at every never-seen length of variable-length traffic) and runs a
  packed weight a few percent faster once made (the trade is in RESULTS.md). A matmul with
  a *run-time* M (``DNNL_RUNTIME_DIM_VAL``) exists too, but only as oneDNN's plain GEMM,
  which repacks the weight on every call. A weight whose rows are a multiple of
  ``linear.SET_ALIASING_BYTES`` long (768, 1024, 3072 float32 columns: most transformer
  widths) is held with each row one cache line longer (``linear.leading_dimension``, as the
  static products' plain weights are): sgemm walks a panel of its rows at once, and rows
  at such a stride fall into the same few sets of the L1 cache.
- **A decoder's steps** (``one_row_steps``: the model feeds its KV cache back,
  ``runtime/kv_cache.kv_pairs``) have one row, and a product of one row streams its weight
  once: it is bound by memory. A weight of up to ``COLUMN_MAJOR_MAX_N`` columns (a layer's
  products) is held transposed, N x K: sgemm's ``N, T`` form then streams each column of W
  as one contiguous row, faster from memory than ``N, N`` on such shapes; rows up to
  ``GEMV_ROWS`` run sgemm, more rows (the prompt) a brgemm matmul per row count reading that
  weight (``N, T`` is slow at many rows). A vocabulary-wide head stays ``K x N`` (``N, N`` is
  the faster one for it) and runs sgemm at every row count.
- **bfloat16**: sgemm has no bf16 form; the weight is packed once into the brgemm matmul's
  blocked layout (the same ``WeightStore`` as the static kernels), from a primitive made at
  bind time, and each new M gets a primitive made with that layout given explicitly. (A row
  count for which oneDNN would offer only its reference implementation with that layout is
  an error naming the node; brgemm takes every M.)

Where a row count gets a matmul primitive (these, and a decoder's prompt), the products of one
configuration (sizes, type, weight layout, post-ops, bias) share it and its prepared call
(``Resources.shared``, per thread: ``primitive.PreparedCalls``): a never-seen M makes one per configuration,
not one per layer; the last ``ROWS_KEPT`` row counts' are kept, and a call points the
memories at the node's own input, output, weight and bias.

The activation is a post-op where oneDNN's eltwise is exact on NaN / Inf and the
implementation's epilogue was checked for it (``primitive.exact_post_ops``); otherwise it runs
after the product, in place, with torch (GELU always, unless ``Config.fast_math``). sgemm has
no post-ops: after it, the activation runs as oneDNN's eltwise over the output's rows in
pieces of a fixed set of counts (``rows_eltwise.RowsEltwise``: prepared calls made once, whatever
the lengths; torch's own GELU makes oneDNN code for every new shape it meets): a guarded
node's fast form's activation, and an exact GELU where one max over the output finds neither
a NaN nor a +inf (torch's GELU computes it with the same eltwise; where one is there, the
op's own GELU restores +inf). A one-row bias is written by ``memmove`` (``_gemv``). Products
small enough to gain nothing from a second thread are made for one (``threading_policy``),
per M as the static kernels are. Anything else declines with a reason (the static kernel of
``linear.py`` takes a node whose shapes are static).
"""
from __future__ import annotations

import ctypes as C

import torch

from .....ops.fused_transformer import ACTIVATIONS
from ...protocol import Decline
from ..threading_policy import PARALLEL_WEIGHTS, SERIAL_MACS, threads_for
from . import capi
from .compute import compute_dtype
from .linear import WIDENED, leading_dimension, product_operands
from .memory import DTYPES, MemDesc, Memory
from .primitive import Attr, PreparedCalls, call_arguments, create, exact_post_ops, thread_stream
from .rows_eltwise import RowsEltwise

TYPES = (torch.float32, torch.bfloat16)
EXACT = {"none": [], "relu": [("eltwise", "elu", 0.0, 0.0)], "sigmoid": [("eltwise", "logistic", 0.0, 0.0)],
         "tanh": [("eltwise", "tanh", 0.0, 0.0)], "silu": [("eltwise", "swish", 1.0, 0.0)]}
FAST = {"relu": [("eltwise", "relu", 0.0, 0.0)], "gelu": [("eltwise", "gelu_erf", 0.0, 0.0)],
        "gelu_tanh": [("eltwise", "gelu_tanh", 0.0, 0.0)]}
ROWS_KEPT = 16                    # row counts whose prepared call a configuration keeps (the most recently used)
GEMV_ROWS = 2                     # rows up to which a plain weight runs dnnl_sgemm (one_row_steps)
COLUMN_MAJOR_MAX_N = 4096         # up to this many columns the plain weight is held transposed (N x K)
REFERENCE_ROWS = 64               # the row count of the bind-time primitive that picks the layout
_INF = float("inf")


def runtime_linear_kernel(ctx, store, resources, exact: bool = True, one_row_steps: bool = False):
    """The kernel of a Linear / LinearAct node whose input rows are symbolic, or a ``Decline``
    saying why not. ``one_row_steps``: the model runs mostly one row (a decoder's steps): a
    float32 weight of a layer is held transposed and few rows run a matrix-vector product."""
    node = ctx.node
    got = product_operands(ctx)
    if isinstance(got, Decline):
        return got
    activation, trans_b, w, b = got
    x_v, y_v = node.inputs[0], node.outputs[0]
    if x_v.shape is None or not x_v.shape or x_v.layout == "nhwc":
        return Decline("needs a row-major input of known rank", "dnnl")
    dtype = x_v.dtype.to_torch() if x_v.dtype is not None else None
    y_dtype = y_v.dtype.to_torch() if y_v.dtype is not None else None
    if dtype not in TYPES or w.dtype != dtype or (y_dtype != dtype and (dtype, y_dtype) != WIDENED):
        return Decline(f"needs float32 or bfloat16 data and weight, and an output of their type or float32 "
                       f"(got data {dtype}, weight {w.dtype}, output {y_dtype})", "dnnl")
    compute = compute_dtype(dtype)
    out_dtype = y_dtype if y_dtype != dtype else compute
    if out_dtype != y_dtype:
        return Decline("a bfloat16 output where this CPU has no bfloat16 arithmetic (the product runs in "
                       "float32 here)", "dnnl")
    n, k = (w.shape[0], w.shape[1]) if trans_b else (w.shape[1], w.shape[0])
    if (isinstance(x_v.shape[-1], int) and x_v.shape[-1] != k) or (b is not None and b.numel() != n):
        return Decline("operand sizes do not match", "dnnl")
    post = (EXACT if exact else {**EXACT, **FAST}).get(activation)
    gemv = compute == torch.float32
    by_columns = gemv and one_row_steps and n <= COLUMN_MAJOR_MAX_N
    # after sgemm: the fast form's one activation, or an exact GELU (checked for NaN / +inf), on oneDNN
    rows_eltwise = None
    if gemv and not exact and post and len(post) == 1:
        rows_eltwise = post[0]
    elif gemv and exact and activation == "gelu":
        rows_eltwise = FAST["gelu"][0]
    kernel = RuntimeLinear(k, n, compute, b, post, resources, exact, gemv, by_columns, out_dtype, rows_eltwise)
    if gemv:         # plain: K x N row-major, or its N x K transpose (each column of W one contiguous row)
        want = MemDesc.of((k, n), compute, (1, k) if by_columns else (kernel.ldb, 1))
    else:
        want = MemDesc.tagged([k, n], DTYPES[compute], capi.TAG_ANY)
    if gemv and not by_columns:      # sgemm at every row count: no matmul primitive, the layout as asked
        w_md = want
    else:
        try:
            prim = kernel.make(REFERENCE_ROWS, want)
        except capi.DnnlError as exc:
            return Decline(f"oneDNN has no matmul for this node: {exc}", "dnnl")
        if prim.is_reference:
            return Decline(f"oneDNN offers only its reference matmul ({prim.impl})", "dnnl")
        w_md = prim.md(capi.Q_WEIGHTS_MD)
    plain = w if w.device.type == "meta" else w.to(compute).contiguous()
    plain_md = MemDesc.of((k, n), compute, (1, k) if trans_b else (n, 1))
    packed = store.form(node.inputs[1].name, plain, (1, 0) if trans_b else (0, 1), plain_md, w_md,
                        own=len(node.inputs[1].uses) == 1)
    kernel.set_weight(packed, w_md, ACTIVATIONS[activation] if activation != "none" else None)
    if gemv:
        warm_sgemm()
    return kernel


_SGEMM_WARM: list[bool] = []


def warm_sgemm() -> None:
    """oneDNN generates sgemm's kernels at its first calls in a process (tens of milliseconds):
    made here, on tiny operands, when the kernels are built, not in the first run."""
    if _SGEMM_WARM:
        return
    lib = capi.load()
    a, b, c = torch.ones(16, 16), torch.ones(16, 16), torch.empty(16, 16)
    for rows in (*range(1, GEMV_ROWS + 1), 16):
        for trans in (b"N", b"T"):
            for beta in (0.0, 1.0):          # no bias, a bias written first
                lib.sgemm(b"N", trans, rows, 16, 16, 1.0, a.data_ptr(), 16, b.data_ptr(), 16, beta, c.data_ptr(), 16)
    _SGEMM_WARM.append(True)


class RuntimeLinear:
    """A product by one packed weight, for inputs of any row count ``[..., K]``."""
    writes_out = True
    reads = (0,)

    def __init__(self, k: int, n: int, dtype: torch.dtype, bias, post: list | None, resources, exact: bool,
                 gemv: bool = False, by_columns: bool = False, out_dtype: torch.dtype | None = None,
                 rows_eltwise: tuple | None = None):
        self.k, self.n, self.dtype = k, n, dtype
        self.out_dtype = out_dtype or dtype           # float32 from bfloat16 operands: a Cast folded in
        self.gemv_rows = GEMV_ROWS if gemv else 0     # the weight is plain: sgemm up to these rows
        self.by_columns = by_columns                  # ... held N x K (W transposed), else K x N
        self.ldb = n if by_columns or not gemv else leading_dimension(n, dtype)   # a K x N weight's row stride
        self._bias = None if bias is None else bias.to(torch.float32).contiguous()
        self._bias_bytes = 0 if bias is None else self._bias.numel() * 4
        self._b_md = MemDesc.of((1, n), torch.float32) if self._bias is not None else None
        self._post, self._exact = post, exact
        # the activation after sgemm as a oneDNN eltwise over row pieces (``rows_eltwise.py``);
        # an exact one is a GELU, run there only where the output is checked free of NaN and
        # +inf (``_gemv``)
        self._rows_act = None if rows_eltwise is None else RowsEltwise(n, rows_eltwise, resources)
        self._resources = resources
        self._calls: dict[int, PreparedCalls] = {}     # thread -> its prepared calls (``set_weight``: shared)
        self._exec = capi.load().execute
        self._lib = capi.load()
        self._const_ptrs: tuple = ()
        self.impl = "portable"
        self._w_md = self._packed = self._act = None

    def make(self, m: int, w_md: MemDesc, post: list | None = None):
        """A matmul primitive for ``m`` rows reading weights laid out as ``w_md``."""
        x_md = MemDesc.of((m, self.k), self.dtype, (self.k, 1))
        y_md = MemDesc.of((m, self.n), self.out_dtype, (self.n, 1))
        attr = Attr((self._post or []) if post is None else post)
        small = m * self.n * self.k < SERIAL_MACS and self.n * self.k < PARALLEL_WEIGHTS
        with threads_for(small):
            return create("matmul", lambda pd: self._lib.matmul_primitive_desc_create(
                pd, self._lib.engine, x_md.handle, w_md.handle, self._b_md.handle if self._b_md is not None else None,
                y_md.handle, attr.handle))

    def set_weight(self, packed: torch.Tensor, w_md: MemDesc, activation) -> None:
        self._packed, self._w_md, self._act = packed, w_md, activation
        self._const_ptrs = (packed.data_ptr(),) + (() if self._bias is None else (self._bias.data_ptr(),))
        # the products of one configuration share their primitive and prepared call per row count
        layout = tuple(sorted((k, tuple(v) if isinstance(v, list) else v) for k, v in w_md.describe().items()))
        self._calls = self._resources.shared.setdefault(
            ("matmul", self.k, self.n, self.dtype, self.out_dtype, layout, tuple(map(tuple, self._post or ())),
             self._bias is not None, self._exact), {})
        if not self.gemv_rows:
            self.impl = self.make(REFERENCE_ROWS, w_md).impl
        elif self.by_columns:
            self.impl = f"{self.make(REFERENCE_ROWS, w_md).impl} over W^T, sgemm <= {self.gemv_rows} rows"
        else:
            self.impl = "sgemm"

    def _for_rows(self, m: int) -> tuple:
        return PreparedCalls.of_thread(self._calls, self._prepare, ROWS_KEPT).get(m)

    def _prepare(self, m: int) -> tuple:
        """A prepared call for ``m`` rows: the matmul primitive, whether the activation runs
        after it, its source, destination, weight and bias memories (pointed at a node's tensors
        before each call) and the argument array."""
        prim, after = self.make(m, self._w_md), self._post is None
        if self._exact and self._post and not exact_post_ops(prim.impl):   # an epilogue not checked on NaN / Inf
            prim, after = self.make(m, self._w_md, []), True
        if prim.is_reference:
            raise RuntimeError(f"oneDNN has no matmul of {m} x {self.k} x {self.n} for the packed weight")
        x = Memory(MemDesc.of((m, self.k), self.dtype), 0)
        y = Memory(MemDesc.of((m, self.n), self.out_dtype), 0)
        consts = (Memory(self._w_md, self._const_ptrs[0]),) + \
            (() if self._b_md is None else (Memory(self._b_md, self._const_ptrs[1]),))
        pairs = [(capi.ARG_SRC, x), (capi.ARG_DST, y)] + list(zip((capi.ARG_WEIGHTS, capi.ARG_BIAS), consts))
        args, nargs, scratch = call_arguments(prim, pairs, self._resources)
        return prim, x, y, consts, args, nargs, after, scratch

    def __call__(self, x: torch.Tensor, *_unused, out: torch.Tensor | None = None) -> torch.Tensor:
        if x.shape[-1] != self.k:
            raise ValueError(f"oneDNN matmul: input {tuple(x.shape)} does not end in the weight's {self.k} rows")
        m = x.numel() // self.k if self.k else 0
        if out is None:
            out = torch.empty((*x.shape[:-1], self.n), dtype=self.out_dtype)
        if x.dtype != self.dtype or not x.is_contiguous():
            x = x.to(self.dtype).contiguous()
        if m == 0:
            return out
        if not out.is_contiguous() or out.dtype != self.out_dtype:
            raise TypeError(f"oneDNN matmul: output is {out.dtype} {tuple(out.stride())}, expected a row-major "
                            f"{self.out_dtype}")
        if m <= self.gemv_rows or (self.gemv_rows and not self.by_columns):
            return self._gemv(x, m, out)          # a K x N weight: sgemm at any row count
        prim, xm, ym, consts, args, nargs, after, _kept = self._for_rows(m)
        xm.point(x.data_ptr())
        ym.point(out.data_ptr())
        for mem, ptr in zip(consts, self._const_ptrs):
            mem.point(ptr)
        status = self._exec(prim.handle, thread_stream(), nargs, args)
        if status:
            raise capi.DnnlError("execute matmul", status)
        if after and self._act is not None:
            self._act(out)
        return out

    def _gemv(self, x: torch.Tensor, m: int, out: torch.Tensor) -> torch.Tensor:
        """``out = act(x @ W + b)`` by oneDNN's sgemm over the plain weight (row-major: ``W`` is
        ``K x N`` with leading dimension N); the bias is written first and summed onto
        (``beta`` 1), else ``beta`` 0 overwrites whatever ``out`` held. A one-row bias is
        written by ``memmove``: right after a product has streamed its weight through the
        caches, a torch op's dispatch misses on its own bookkeeping and costs several times
        the copy (a decoder's step has a product before almost every other call)."""
        beta = 0.0
        if self._bias is not None:
            if m == 1:      # one row (a decoder's step): a byte copy, not a torch op (see _gemv's docstring)
                C.memmove(out.data_ptr(), self._bias.data_ptr(), self._bias_bytes)
            else:
                out.view(m, self.n).copy_(self._bias)          # broadcast over the rows
            beta = 1.0
        if self.by_columns:
            status = self._lib.sgemm(b"N", b"T", m, self.n, self.k, 1.0, x.data_ptr(), self.k,
                                     self._packed.data_ptr(), self.k, beta, out.data_ptr(), self.n)
        else:
            status = self._lib.sgemm(b"N", b"N", m, self.n, self.k, 1.0, x.data_ptr(), self.k,
                                     self._packed.data_ptr(), self.ldb, beta, out.data_ptr(), self.n)
        if status:
            raise capi.DnnlError("sgemm", status)
        if self._act is not None:
            if self._rows_act is not None and (not self._exact or bool(out.amax() < _INF)):
                self._rows_act(out.data_ptr(), m)
            else:
                self._act(out)
        return out
