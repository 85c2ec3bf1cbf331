"""fp16 on CPU: per model, float16 computed natively (every node on its portable ATen kernel,
``Config(cpu_kernels="portable")``) against the default, float16 storage whose convolutions
and products oneDNN computes in float32 (``runtime/backends/cpu/dnnl/compute.py``), beside
float32; and the fp16 default's relative L2 error against onnxruntime ORT_DISABLE_ALL.
(Since the oneDNN-primitive backend a stored float16 is always computed in float32 there: the
per-family switches the first tables in RESULTS.md used are gone.)

    python benchmarks/fp16_cpu.py [--models squeezenet,resnet50,bert] [--runs 20]

2 threads, batch 1; light models with random weights (``zoo.randomize_weights`` seed 0,
``zoo.random_feeds``), BERT / GPT-2 the 2-layer exports of ``tests/model_builders.py`` at
sequence 128. Latencies: median of ``--runs``, all variants in one process, alternating blocks.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

import onnx
import torch

import fusegraph as fg
from fusegraph.testing import zoo
from fusegraph.tools.bench import alternate
from fusegraph.compiler.accuracy import output_errors, worst_rel_l2

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from oracle import ort_run  # noqa: E402

# label -> (precision, Config.cpu_kernels)
VARIANTS = {"fp32": ("fp32", "auto"), "fp16 native (portable)": ("fp16", "portable"),
            "fp16 fp32c (default)": ("fp16", "auto")}


def models(names: list[str]):
    tmp = Path(tempfile.mkdtemp())
    for name in names:
        if name in ("bert", "gpt2"):
            from model_builders import build_transformer_models, static_shapes, transformer_feeds
            yield name, static_shapes(build_transformer_models(tmp)[name], 1, 128), transformer_feeds(seq=128)
        else:
            proto = zoo.randomize_weights(onnx.load(zoo.light_model_path(name)), seed=0)
            yield name, proto, zoo.random_feeds(proto)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default=",".join([*zoo.LIGHT_MODELS, "bert", "gpt2"]))
    ap.add_argument("--runs", type=int, default=20)
    args = ap.parse_args(argv)
    torch.set_num_threads(2)
    print("| model | " + " | ".join(VARIANTS) + " | rel-L2 fp16 |")
    print("|---|" + "---:|" * (len(VARIANTS) + 1))
    for name, proto, feeds in models(args.models.split(",")):
        built = {}
        for label, (precision, kernels) in VARIANTS.items():
            built[label] = fg.compile(proto, fg.Config(threads=2, precision=precision, cpu_kernels=kernels))
        error = worst_rel_l2(output_errors(built["fp16 fp32c (default)"].run(feeds), ort_run(proto, feeds)))
        times = alternate({k: (lambda m=m: m.run(feeds)) for k, m in built.items()}, runs=args.runs)
        cells = " | ".join(f"{statistics.median(times[k]):.1f}" for k in VARIANTS)
        print(f"| {name} | {cells} | {error:.1e} |", flush=True)


if __name__ == "__main__":
    main()
