"""Reports: what the compiler did (passes, fusions, memory, streams) and what it gained."""
from .compile_report import CompileReport, PassStat, FusionRecord

__all__ = ["CompileReport", "PassStat", "FusionRecord"]
