"""Planning: execution order, lifetimes, memory offsets, streams. Never mutates the graph.

``plan_memory(graph, config) -> MemoryPlan`` is the entry point (``memory_plan.py``); the pure
offset planner is ``memory.plan(buffers, constraints)``.
"""
from .memory import Assignment, Buffer, Constraints, conflict_graph, lower_bound, plan
from .memory_plan import MemoryPlan, PlanOptions, plan_memory
from ..report.memory import MemoryReport

__all__ = ["Assignment", "Buffer", "Constraints", "MemoryPlan", "MemoryReport", "PlanOptions",
           "conflict_graph", "lower_bound", "plan", "plan_memory"]
