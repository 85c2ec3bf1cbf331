"""``fusegraph demo``: the main job on a bundled model — resnet50 from the onnx package's light
models with random weights — compared unoptimised (O0) vs optimised (O2), then saved as an
.fgm artifact, reloaded without compiling, and checked to give identical outputs."""
from __future__ import annotations

import tempfile
import time
from pathlib import Path

import numpy as np
import onnx

from ..testing import zoo


def run_demo(model_name: str = "resnet50", threads: int | None = None) -> int:
    """``threads``: the intra-op threads both compiles run at (None: ``Config``'s default,
    fewer where other processes keep cores busy)."""
    import fusegraph as fg
    from rich.console import Console

    from .compare import compare, render

    console = Console()
    config = fg.Config(threads=threads)
    console.print(f"[bold]fusegraph demo[/bold]: {model_name} (onnx light model, random He-scaled "
                  f"weights, calibrated BatchNorm), {config.threads or 'default'} threads")
    proto = zoo.randomize_weights(onnx.load(zoo.light_model_path(model_name)), seed=0)
    feeds = zoo.random_feeds(proto, seed=1)
    columns = compare(proto, runs=15, budget_s=6.0, feeds=feeds, config=config)
    console.print(render(columns, f"{model_name}: unoptimised (O0) vs optimised (O2)"))

    model = fg.compile(proto, config)
    expected = model.run(feeds)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / f"{model_name}.fgm"
        model.save(path)
        t0 = time.perf_counter()
        loaded = fg.load(path)
        load_ms = (time.perf_counter() - t0) * 1000
        got = loaded.run(feeds)
        size_mb = path.stat().st_size / 1e6
    same = all(np.array_equal(expected[k], got[k]) for k in expected)
    console.print(f"saved {model_name}.fgm ({size_mb:.1f} MB), reloaded in {load_ms:.0f} ms with no pass or "
                  f"planning step and no kernel compiled (oneDNN compiles them at their first call); "
                  f"outputs bitwise identical: {same}")
    return 0 if same else 1
