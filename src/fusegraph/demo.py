"""``fusegraph demo``: the main job on a bundled model (resnet50 from the onnx package's light
models, with random weights), unoptimised (O0) beside optimised (O2), as a table."""
from __future__ import annotations

import time

import numpy as np
import onnx

from . import zoo


def run_demo(model_name: str = "resnet50", runs: int = 20) -> int:
    import fusegraph as fg
    from rich.console import Console
    from rich.table import Table

    from .timing import measure

    console = Console()
    console.print(f"[bold]fusegraph demo[/bold]: {model_name} (onnx light model, random He-scaled weights)")
    proto = zoo.randomize_weights(onnx.load(zoo.light_model_path(model_name)), seed=0)
    feeds = zoo.random_feeds(proto, seed=1)
    rows = []
    outputs = {}
    for level in ("O0", "O2"):
        t0 = time.perf_counter()
        model = fg.compile(proto, fg.Config(level=level))
        compile_s = time.perf_counter() - t0
        outputs[level] = model.run(feeds)
        lat = measure(lambda: model.run(feeds), runs=runs, warmup=2, budget_s=15)
        rows.append((level, model.report.nodes_imported, model.report.kernel_count, compile_s, lat))
    table = Table(title=f"{model_name}: unoptimised vs optimised")
    for col in ("pipeline", "nodes imported", "kernels / run", "compile s", "latency median ms",
                "p90 ms", "runs/s"):
        table.add_column(col, justify="right")
    for level, nodes, kernels, compile_s, lat in rows:
        table.add_row(level, str(nodes), str(kernels), f"{compile_s:.2f}", f"{lat.median_ms:.1f}",
                      f"{lat.p90_ms:.1f}", f"{lat.per_second:.1f}")
    console.print(table)
    diff = max(float(np.max(np.abs(outputs["O0"][k] - outputs["O2"][k]))) for k in outputs["O0"])
    console.print(f"max |O0 - O2| over outputs: {diff:.3g}")
    return 0
