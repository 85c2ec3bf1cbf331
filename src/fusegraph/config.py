"""``fg.Config``: every knob of a compilation, as one frozen dataclass.

Options are passed in explicitly; nothing deep inside an algorithm reads a global flag.
Validation happens here, at construction, so a bad value fails before any work starts.
"""
from __future__ import annotations

import dataclasses
import difflib
import os
from dataclasses import dataclass, field

from .errors import ConfigError

LEVELS = ("O0", "O1", "O2")
PRECISIONS = ("fp32", "fp16", "bf16", "auto", "int8")
OP_PRECISIONS = ("fp32", "fp16", "bf16")
INT8_OP_PRECISIONS = ("int8", "fp32")          # op_precision values under precision="int8"
CALIBRATIONS = ("minmax", "percentile", "entropy")
CPU_KERNELS = ("auto", "onednn", "portable")
THREAD_POLICIES = ("free_cores", "fixed")
MEMORY_MODES = ("off", "balanced", "tight")
DEVICES = ("cpu", "cuda", "auto")


def machine_cores() -> int:
    """CPUs this process may run on (its affinity mask), at least 1: the bound of every thread
    count."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


@dataclass(frozen=True)
class Config:
    """How to compile a model.

    level: pass pipeline, ``O0`` (nothing) .. ``O2`` (everything, the default).
    disabled_passes: pass names to skip.
    precision: the whole-model policy (``passes/precision_policy.py``): ``fp32`` (default);
        ``bf16`` / ``fp16``: heavy ops (convolutions, products, attention) in that type, sensitive
        ones (softmax, normalisation, reductions, exp / log / pow) and the logits in fp32;
        ``auto``: bf16, with the ops whose reduced precision costs the most error per
        microsecond of work moved back to fp32 until the outputs' relative L2 error on
        calibration inputs is within ``accuracy_budget`` (``compiler/precision_auto.py``);
        ``int8``: post-training quantisation (``compiler/int8_ptq.py``): with
        ``calibration_inputs``, the convolutions and products with constant weights get
        QuantizeLinear / DequantizeLinear pairs as onnxruntime's ``quantize_static`` writes them
        (per-channel symmetric int8 weights, per-tensor uint8 activations whose ranges come from
        the calibration inputs, ``calibration``) and run on the int8 kernels; without them, the
        MatMul / Gemm products are quantised dynamically (activation scales at run time), and a
        model with convolutions to quantise is refused (they need calibration inputs). At O0 /
        O1 (whose pipelines have no int8 passes) the quantised graph runs as written: quantise
        and dequantise in float32, the int8 model's reference.
    op_precision: per node name or op type, ``fp32`` | ``bf16`` | ``fp16``, over the policy
        (``{"Conv": "bf16", "/head/MatMul": "fp32"}``; a dict or pairs); under
        ``precision="int8"`` ``int8`` | ``fp32`` instead: ``fp32`` keeps a product in float32
        (an ignore list), ``int8`` names a product to quantise (a name wins over an op type, so
        ``{"MatMul": "fp32", "/l0/MatMul": "int8"}`` quantises that one only; a node that
        cannot run int8 is a ConfigError). A name or type the model does not have is a
        ConfigError at compile.
    calibration: for ``precision="int8"`` with calibration inputs, how an activation's range is
        chosen from what it held over them (``compiler/calibrate.py``): ``minmax`` (default,
        the smallest and largest value), ``percentile`` (the ``calibration_percentile`` share of
        the values kept, as much cut from each tail), ``entropy`` (the clipping threshold whose
        quantised histogram is nearest the float one in KL divergence, as TensorRT and
        onnxruntime do). A ConfigError with any other precision unless left at its default.
    calibration_percentile: the percentile ``calibration="percentile"`` keeps, in (50, 100]
        (default 99.999); a ConfigError with another method unless left at its default.
    accuracy_budget: for ``precision="auto"``: the largest relative L2 error of any output
        against the fp32 model (default 1e-2); a ConfigError with any other precision unless
        left at its default.
    aggressive_fusion: also run the fusion rules that trade recomputation or memory for fewer
        kernels (``passes/fusion/rules_aggressive.py``: a cheap elementwise result recomputed in
        each of its elementwise consumers, q / k / v packed where biases or scales differ, three
        or more products of one input packed into one, a norm's affine folded into the products
        that read it); off by default (benchmarks/RESULTS.md).
    streams: number of execution streams, or ``"auto"``.
    memory: ``off`` (every tensor its own buffer) | ``balanced`` | ``tight``.
    device: ``cpu`` | ``cuda`` | ``auto``.
    threads: intra-op threads, 1 .. this machine's cores (None: torch's setting at each call);
        compile, bind and every run use them and then put the caller's setting back; with
        several CPU streams each stream gets ``threads // streams`` of them.
    thread_policy: ``free_cores`` (default): on CPU, a run takes at most the cores other
        processes leave free (sampled from ``/proc/stat`` at most four times a second), down to
        one: its oneDNN kernels split their work statically and wait at a barrier for a thread
        another process has descheduled, so on a busy machine fewer threads run faster
        (``runtime/free_cores.py``; the kernels for the smaller count are made at its first run
        and kept). ``fixed``: every run at ``threads``. CPU stream plans and hooked runs stay
        at ``threads``.
    cuda_graph: on CUDA, capture the whole run as one CUDA graph and replay it (default off;
        a ConfigError on any other device).
    fold_size_limit: largest tensor, in bytes, that constant folding may materialise.
    fold_broadcast_limit: largest logical size, in bytes, of a folded constant that is one value
        broadcast (a ConstantOfShape, an Expand of a scalar): it is kept as that value plus a
        shape (stride 0, a few bytes in the artifact) and materialised once when the model is
        bound to its kernels; anything larger stays a node.
    max_arena_bytes: largest activation memory a compile may plan (the arena, plus the broadcast
        constants materialised at bind time, plus any one graph output), in bytes; over it,
        compile raises PlanError naming the biggest tensors. Default 8 GiB; None: no cap.
    verify_each: verify the graph after every pass, naming the pass that broke it (tests turn it
    on); every compile verifies it as imported and after the pipeline anyway.
    fast_math: allow rewrites that are exact only away from NaN / Inf / zero (x*0, x/x,
        log(exp(x)) outside the provable domain), as -ffast-math does, and on CPU the kernels
        whose only difference from ONNX is NaN / Inf (oneDNN's fused relu, clip, GELU and max
        pool: NaN becomes 0, the bound, or -FLT_MAX); faster where those fuse.
    keep_freed_memory: on CPU with glibc, raise malloc's mmap / trim thresholds once per
        process so memory a run frees is reused by the next run instead of being faulted in
        again (process-wide; ``runtime/backends/cpu/host_memory.py``). Off by default: the CPU
        backend's kernels write into the planned arena and allocate nothing per run, and the
        raised trim threshold keeps a compile's freed memory resident (measured on MobileNetV2:
        benchmarks/RESULTS.md, "Figures moved out of docstrings"). Worth turning on for models
        whose kernels do allocate (dynamic shapes).
    cpu_kernels: which kernels run on CPU. "auto" (default): oneDNN primitives called directly
        (``runtime/backends/cpu/dnnl/``: convolutions, weight products, pools, LRN, writing into
        the arena, weights packed once) where the ``onednn-cpu-gomp`` library loads, every
        other node its op's portable ATen kernel; "onednn": the same, refused with a
        ConfigError where the library does not load; "portable": every node its portable
        ATen kernel (a reference to compare against).
    shape_cache: for a model whose inputs have symbolic dims (a dynamic batch or sequence). 0
        (default): one compile serves every shape: the passes run once over the symbolic graph,
        kernels are bound once, and each new input shape costs a shape evaluation and, for a
        new bucket of shapes, a memory plan (``runtime/frames.py``). N > 0: instead keep up to N
        compiles at exact input shapes (``compiler/specialize.py``: each new shape runs the
        passes again), least recently used out; worth it only for a long run at a few shapes.
    dynamic_batch: let a model compiled with a static batch dim accept other batch sizes: its
        inputs' dim 0 becomes the symbolic ``batch`` before the passes run; an output whose
        graph fixes its batch in a constant is refused at another batch with an InputError
        naming the output.
    shapes: declared ranges of symbolic input dims, ``{"seq": (1, 512)}``: a run whose dim is
        outside its range gets an InputError naming the input, the dim and the range.
    max_run_bytes: the largest tensor, in bytes, a kernel may make at run time outside the
        planned arena when its size comes from run-time data (ConstantOfShape, Expand, Tile,
        Range, Pad, Resize, OneHot of fed sizes; a Loop's scan outputs); over it the run raises
        RunLimitExceeded naming the node and the size, before allocating. Default None: the
        value of ``max_arena_bytes`` (so both None is no cap).
    max_loop_iterations: the most iterations one Loop node may run per run; past it the run
        raises RunLimitExceeded naming the node. Default None: no cap (ONNX loops such as
        ``Loop(M=INT64_MAX, cond)`` rely on their condition; stop those with a run's timeout).
    """

    level: str = "O2"
    disabled_passes: tuple[str, ...] = ()
    precision: str = "fp32"
    streams: int | str = 1
    memory: str = "balanced"
    device: str = "cpu"
    threads: int | None = None
    thread_policy: str = "free_cores"
    fold_size_limit: int = 64 * 1024 * 1024
    fold_broadcast_limit: int = 4 * 1024 ** 3
    max_arena_bytes: int | None = 8 * 1024 ** 3
    verify_each: bool = False
    fast_math: bool = False
    aggressive_fusion: bool = False
    tensor_lifetimes: tuple[tuple[str, int, int], ...] = ()
    reuse_groups: tuple[tuple[str, ...], ...] = ()
    exclusive_tensors: tuple[str, ...] = ()
    external_tensors: tuple[str, ...] = ()
    op_precision: tuple[tuple[str, str], ...] = field(default=())
    accuracy_budget: float = 1e-2
    cuda_graph: bool = False
    keep_freed_memory: bool = False
    cpu_kernels: str = "auto"
    shape_cache: int = 0
    dynamic_batch: bool = False
    shapes: tuple[tuple[str, int, int], ...] = ()
    max_run_bytes: int | None = None
    max_loop_iterations: int | None = None
    calibration: str = "minmax"
    calibration_percentile: float = 99.999

    def __post_init__(self) -> None:
        if self.level not in LEVELS:
            raise ConfigError(f"Config.level must be one of {LEVELS}, got {self.level!r}")
        if self.precision not in PRECISIONS:
            raise ConfigError(f"Config.precision must be one of {PRECISIONS}, got {self.precision!r}")
        if self.thread_policy not in THREAD_POLICIES:
            raise ConfigError(f"Config.thread_policy must be one of {THREAD_POLICIES}, got {self.thread_policy!r}")
        if self.memory not in MEMORY_MODES:
            raise ConfigError(f"Config.memory must be one of {MEMORY_MODES}, got {self.memory!r}")
        if self.device not in DEVICES:
            raise ConfigError(f"Config.device must be one of {DEVICES}, got {self.device!r}")
        if not (self.streams == "auto" or (isinstance(self.streams, int) and 1 <= self.streams <= 64)):
            raise ConfigError(f"Config.streams must be an integer 1..64 or 'auto', got {self.streams!r}")
        if self.threads is not None and (not isinstance(self.threads, int) or isinstance(self.threads, bool)
                                         or not 1 <= self.threads <= machine_cores()):
            raise ConfigError(f"Config.threads must be an integer 1..{machine_cores()} (this machine's cores) "
                              f"or None, got {self.threads!r}")
        _check_precision(self)
        if self.cpu_kernels not in CPU_KERNELS:
            raise ConfigError(f"Config.cpu_kernels must be one of {CPU_KERNELS}, got {self.cpu_kernels!r}")
        if (not isinstance(self.shape_cache, int) or isinstance(self.shape_cache, bool)
                or not 0 <= self.shape_cache <= 256):
            raise ConfigError(f"Config.shape_cache must be an integer 0..256, got {self.shape_cache!r}")
        _check_shapes(self)
        for name in ("cuda_graph", "keep_freed_memory", "dynamic_batch", "aggressive_fusion"):
            if not isinstance(getattr(self, name), bool):
                raise ConfigError(f"Config.{name} must be true or false, got {getattr(self, name)!r}")
        for name in ("fold_size_limit", "fold_broadcast_limit"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise ConfigError(f"Config.{name} must be a non-negative integer, got {value!r}")
        if self.max_arena_bytes is not None and (not isinstance(self.max_arena_bytes, int) or
                                                 isinstance(self.max_arena_bytes, bool) or self.max_arena_bytes < 0):
            raise ConfigError(f"Config.max_arena_bytes must be a non-negative integer or None, "
                              f"got {self.max_arena_bytes!r}")
        for name in ("max_run_bytes", "max_loop_iterations"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
                raise ConfigError(f"Config.{name} must be a positive integer or None, got {value!r}")
        for name in ("disabled_passes", "exclusive_tensors", "external_tensors"):
            value = getattr(self, name)
            if isinstance(value, str) or not all(isinstance(v, str) for v in value):
                raise ConfigError(f"Config.{name} must be a tuple of names, got {value!r}")
            object.__setattr__(self, name, tuple(value))

    def declared_shapes(self) -> dict[str, tuple[int, int]]:
        """``shapes`` as ``{symbolic dim: (min, max)}``."""
        return {name: (lo, hi) for name, lo, hi in self.shapes}
    @property
    def run_bytes_cap(self) -> int | None:
        """``max_run_bytes``, or ``max_arena_bytes`` where that is None."""
        return self.max_run_bytes if self.max_run_bytes is not None else self.max_arena_bytes

    def replace(self, **changes) -> "Config":
        """A copy with some fields changed (the dataclass is frozen)."""
        unknown = set(changes) - {f.name for f in dataclasses.fields(self)}
        if unknown:
            raise ConfigError(f"unknown Config field(s): {', '.join(sorted(unknown))}")
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict:
        """Every field as plain JSON/TOML-able data (tuples become lists)."""
        return {f.name: _plain(getattr(self, f.name)) for f in dataclasses.fields(self)}

    @classmethod
    def from_dict(cls, data: dict) -> "Config":
        """The inverse of ``to_dict``; an unknown key is a ConfigError naming it."""
        if not isinstance(data, dict):
            raise ConfigError(f"a config must be a mapping of field -> value, got {type(data).__name__}")
        known = {f.name for f in dataclasses.fields(cls)}
        for key in data:
            if key not in known:
                close = difflib.get_close_matches(str(key), sorted(known), n=1)
                hint = f" (did you mean {close[0]!r}?)" if close else ""
                raise ConfigError(f"unknown config key {key!r}{hint}; known keys: {', '.join(sorted(known))}")
        return cls(**{k: _tuples(v) if isinstance(v, list) else v for k, v in data.items()})


def _check_shapes(config: Config) -> None:
    """``shapes``: ``{dim: (min, max)}`` or ``((dim, min, max), ...)``, as the tuple form."""
    given = config.shapes
    items = [(k, *v) if isinstance(v, (tuple, list)) else (k, v) for k, v in given.items()] \
        if isinstance(given, dict) else list(given)
    out = []
    for item in items:
        ok = isinstance(item, (tuple, list)) and len(item) == 3 and isinstance(item[0], str) and item[0] and \
            all(isinstance(n, int) and not isinstance(n, bool) for n in item[1:]) and 0 <= item[1] <= item[2]
        if not ok:
            raise ConfigError(f"Config.shapes declares a symbolic dim's range as {{name: (min, max)}} with "
                              f"0 <= min <= max, got {item!r}")
        out.append((item[0], int(item[1]), int(item[2])))
    if len({name for name, _, _ in out}) != len(out):
        raise ConfigError(f"Config.shapes names a dim twice: {given!r}")
    object.__setattr__(config, "shapes", tuple(out))


def _check_precision(config: Config) -> None:
    ops = config.op_precision
    if isinstance(ops, dict):
        ops = tuple(ops.items())
    if isinstance(ops, str) or not all(isinstance(p, (tuple, list)) and len(p) == 2 and isinstance(p[0], str)
                                       and p[0] for p in ops):
        raise ConfigError(f"Config.op_precision must map node names or op types to a precision, got {ops!r}")
    allowed = INT8_OP_PRECISIONS if config.precision == "int8" else OP_PRECISIONS
    bad = [(k, v) for k, v in ops if v not in allowed]
    if bad:
        hint = " (int8 entries need precision='int8')" if any(v == "int8" for _, v in bad) else ""
        raise ConfigError(f"Config.op_precision: {', '.join(f'{k!r}: {v!r}' for k, v in bad)}; each must be one "
                          f"of {allowed} under precision={config.precision!r}{hint}")
    object.__setattr__(config, "op_precision", tuple((k, v) for k, v in ops))
    budget = config.accuracy_budget
    if isinstance(budget, bool) or not isinstance(budget, (int, float)) or not 0 < budget < 1:
        raise ConfigError(f"Config.accuracy_budget must be a relative error in (0, 1), got {budget!r}")
    if config.precision != "auto" and budget != 1e-2:
        raise ConfigError(f"Config.accuracy_budget is read by precision='auto' only (precision is "
                          f"{config.precision!r}); leave it at its default")
    _check_calibration(config)


def _check_calibration(config: Config) -> None:
    """``calibration`` / ``calibration_percentile``: a known method, read by precision='int8' only."""
    method, pct = config.calibration, config.calibration_percentile
    if method not in CALIBRATIONS:
        raise ConfigError(f"Config.calibration must be one of {CALIBRATIONS}, got {method!r}")
    if isinstance(pct, bool) or not isinstance(pct, (int, float)) or not 50 < pct <= 100:
        raise ConfigError(f"Config.calibration_percentile must be a percentile in (50, 100], got {pct!r}")
    if config.precision != "int8" and method != "minmax":
        raise ConfigError(f"Config.calibration is read by precision='int8' only (precision is "
                          f"{config.precision!r}); leave it at its default")
    if method != "percentile" and pct != 99.999:
        raise ConfigError(f"Config.calibration_percentile is read by calibration='percentile' only "
                          f"(calibration is {method!r}); leave it at its default")


def _plain(value):
    return [_plain(v) for v in value] if isinstance(value, (tuple, list)) else value


def _tuples(value):
    return tuple(_tuples(v) for v in value) if isinstance(value, (tuple, list)) else value
