"""Graph optimisation passes (see passes/manager.py and passes/pipeline.py)."""
from __future__ import annotations


def optimize(graph, config, report) -> None:
    """Run the pipeline named by ``config.level`` on ``graph``, recording stats in ``report``.

    Placeholder until the pass manager lands: no pass runs.
    """
    return None
