"""The ``.fgm`` artifact: an optimised, planned model that loads and runs with no compile step.

One file, nothing in it is ever unpickled (``container.py``)::

    prefix   magic, header length, SHA-256 of the header
    header   JSON: format version, fusegraph / torch / python versions, device kind, CPU
             architecture + capability + required CPU flags (``machine.py``), byte
             order, config, and the part table (offset, length, digest per 4 MiB chunk)
    graph    JSON (``ir.serialize``), no tensor data
    report   JSON: the ``CompileReport``, the ``ExecutionPlan`` and the arena view strides
             the compile's layout probe found (``plan.py``)
    weights  a plain safetensors blob, folded and fused constants, and each oneDNN
             convolution weight also in its packed (blocked) form (``weights.py``)

The whole file is read into private memory on load and the file is closed: a file
rewritten, truncated or replaced after ``load`` changes nothing the model computes and cannot
raise SIGBUS (the cost: the weights count as private memory, RssAnon, instead of file-backed
pages; benchmarks/RESULTS.md). Loading runs no pass, no planning and no probe: it checks the
file, rebuilds the graph and verifies it, restores and checks the stored plan (``store.read``),
and the compiler binds kernels: a convolution takes its stored packed weight when the file
comes from the same torch build, CPU capability and thread count (else it packs the plain
weight). The weights' digests are computed on worker threads while the JSON parts are
decoded; they are all checked before any kernel is bound.

Everything wrong with a file -- truncated, bit-flipped, spliced, checksum mismatch, a future
or older format version, a part that escapes the file, absurd sizes, malformed JSON, a graph
that fails ``verify()``, a plan that does not fit the graph or overlaps live values, a
device or CPU instruction set this machine lacks -- is an ``ArtifactError``.
``unpack``/``pack`` read and re-seal the parts (for ``inspect`` and for tests).
"""
from .container import ALIGN, FORMAT_VERSION, MAGIC, PARTS, PREFIX, align, pack, unpack
from .machine import machine
from .store import StoredModel, read, refusal, save

__all__ = ["ALIGN", "FORMAT_VERSION", "MAGIC", "PARTS", "PREFIX", "StoredModel", "align", "machine", "pack", "read",
           "refusal", "save", "unpack"]
