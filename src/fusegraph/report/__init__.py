"""The compile report's records: ``CompileReport`` and its parts (``PassStat``, ``FusionRecord``,
``MemoryReport``, ``StreamPlan``), one type whether a model was compiled or loaded; their
typed reading from JSON, and their short text renderings. Nothing here compiles or runs."""
from .compile_report import CompileReport, FusionRecord, PassStat
from .memory import MemoryReport, TensorPlan
from .streams import StreamEvent, StreamPlan

__all__ = ["CompileReport", "PassStat", "FusionRecord", "MemoryReport", "TensorPlan", "StreamEvent", "StreamPlan"]
