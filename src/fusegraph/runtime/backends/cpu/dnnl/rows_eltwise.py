"""One oneDNN eltwise activation over the rows of a dense float32 matrix, in place, whatever
its row count: the kernels that apply an activation where no primitive's post-op can (after
``dnnl_sgemm``, which has none; over the gate of a gated activation, which is half of each
row of the product before it).

The rows run in pieces of a fixed set of counts (``primitive.row_pieces``: 201 rows as 192, 8
and 1), each piece by a primitive made for that count and prepared once per thread
(``PreparedCalls``), pointed at the piece before its call: at most 30 primitives per width
and activation for any traffic, shared by every kernel of the model that asks for the same
pair (``Resources.shared``). ATen's own GELU makes oneDNN code for every new shape it meets,
and its tanh form is several times slower than this eltwise.
"""
from __future__ import annotations

import torch

from ..threading_policy import threads_for
from . import capi
from .memory import MemDesc, Memory
from .primitive import PreparedCalls, call_arguments, create, row_pieces, thread_stream

SERIAL_ELEMENTS = 1 << 15        # a piece of fewer elements runs on one thread
PIECES_KEPT = 32                  # piece counts whose prepared call is kept (``row_pieces`` makes 30 at most)
PROBE_ROWS = 8                    # the piece count made at creation, to name the implementation


class RowsEltwise:
    """``eltwise`` (``("eltwise", algorithm, alpha, beta)``, as a post-op is written) over the
    rows of a ``[rows, width]`` float32 matrix, in place."""

    def __init__(self, width: int, eltwise: tuple, resources):
        if eltwise[0] != "eltwise" or eltwise[1] not in capi.ELTWISE:
            raise ValueError(f"not a oneDNN eltwise: {eltwise!r}")
        self.width, self.eltwise = int(width), tuple(eltwise)
        self._resources = resources
        self._calls = resources.shared.setdefault(("rows eltwise", self.width, self.eltwise), {})
        self._lib = capi.load()
        self.impl = PreparedCalls.of_thread(self._calls, self._prepare, PIECES_KEPT).get(PROBE_ROWS)[3].impl

    @property
    def is_reference(self) -> bool:
        return self.impl.startswith("ref")

    def __call__(self, ptr: int, rows: int) -> None:
        """The activation over ``rows`` rows of the matrix at address ``ptr``."""
        calls = PreparedCalls.of_thread(self._calls, self._prepare, PIECES_KEPT)
        row = self.width * 4
        for start, count in row_pieces(rows):
            mem, args, nargs, prim, _scratch = calls.get(count)
            mem.point(ptr + start * row)
            status = self._lib.execute(prim.handle, thread_stream(), nargs, args)
            if status:
                raise capi.DnnlError("execute eltwise", status)

    def _prepare(self, rows: int) -> tuple:
        _, alg, alpha, beta = self.eltwise
        md = MemDesc.of((rows, self.width), torch.float32)
        with threads_for(rows * self.width < SERIAL_ELEMENTS):
            prim = create("eltwise", lambda pd: self._lib.eltwise_forward_primitive_desc_create(
                pd, self._lib.engine, capi.FORWARD_INFERENCE, capi.ELTWISE[alg], md.handle, md.handle,
                alpha, beta, None))
        mem = Memory(md, 0)
        args, nargs, scratch = call_arguments(prim, [(capi.ARG_SRC, mem), (capi.ARG_DST, mem)], self._resources)
        return mem, args, nargs, prim, scratch
