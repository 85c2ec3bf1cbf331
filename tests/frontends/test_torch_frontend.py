"""The PyTorch frontend (torch.export -> IR): whole models against torch eager (the oracle),
dynamic Dims, names and nested outputs, zero-copy parameters, and typed errors."""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import fusegraph as fg
from fusegraph.errors import ModelLoadError, UnsupportedOpError

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import model_builders as mb  # noqa: E402

MODELS = ["bert", "gpt2", "vit", "t5", "resnet50", "mobilenetv2"]


def build(name):
    if name == "resnet50":
        return mb.resnet50_style(), (torch.randn(1, 3, 64, 64),), ["input"]
    if name == "mobilenetv2":
        return mb.mobilenetv2_style(), (torch.randn(1, 3, 64, 64),), ["input"]
    return mb.small_transformer(name)


def assert_close(got, ref):
    ref = ref.detach().numpy()
    scale = float(np.abs(ref).max())
    assert got.shape == ref.shape
    np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-4 * scale)


def eager(module, args):
    with torch.no_grad():
        return module(*args)


@pytest.mark.parametrize("name", MODELS)
def test_model_matches_eager(name):
    module, args, names = build(name)
    model = fg.compile(module, example_inputs=args)
    assert [i.name for i in model.inputs] == names
    out = model.run(dict(zip(names, args)))
    assert list(out) == ["output"]
    assert_close(out["output"], eager(module, args))
    if name in ("resnet50", "mobilenetv2"):  # logits differ across inputs: the net is not degenerate
        other = (torch.randn(1, 3, 64, 64),)
        assert_close(model.run({"input": other[0]})["output"], eager(module, other))
        assert np.abs(eager(module, other).numpy() - out["output"]).max() > 1e-2


def test_dynamic_batch_and_sequence():
    from torch.export import Dim
    module, args, names = mb.small_transformer("bert")
    batch, seq = Dim("batch", min=1, max=32), Dim("seq", min=2, max=64)
    model = fg.compile(module, example_inputs=args, dynamic_shapes={n: {0: batch, 1: seq} for n in names})
    assert [tuple(i.shape) for i in model.inputs] == [("batch", "seq")] * 2
    for b, s in ((1, 7), (3, 33)):
        f = mb.transformer_feeds(seed=b, batch=b, seq=s, pad=2)
        feeds = [torch.from_numpy(f[n]) for n in names]
        assert_close(model.run(dict(zip(names, feeds)))["output"], eager(module, feeds))


def test_dynamic_batch_cnn():
    from torch.export import Dim
    module = mb.mobilenetv2_style()
    model = fg.compile(module, example_inputs=(torch.randn(2, 3, 32, 32),),
                       dynamic_shapes={"input": {0: Dim("n", min=1, max=16)}})
    assert model.inputs[0].shape == ("n", 3, 32, 32)
    for b in (1, 5):
        x = torch.randn(b, 3, 32, 32)
        assert_close(model.run({"input": x})["output"], eager(module, (x,)))


class Nested(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(8, 4)
        self.register_buffer("offset", torch.arange(4.0))

    def forward(self, x, y):
        h = self.lin(x) + self.offset
        return {"logits": h, "pair": (h.relu(), y * 2.0)}


def test_exported_program_names_and_nested_outputs():
    module = Nested().eval()
    x, y = torch.randn(3, 8), torch.randn(5)
    ep = torch.export.export(module, (x, y))
    model = fg.compile(ep)
    assert [i.name for i in model.inputs] == ["x", "y"]
    out = model.run({"x": x, "y": y})
    assert list(out) == ["logits", "pair_0", "pair_1"]
    ref = module(x, y)
    assert_close(out["logits"], ref["logits"])
    assert_close(out["pair_0"], ref["pair"][0])
    assert_close(out["pair_1"], ref["pair"][1])
    assert "logits" in model.graph.meta["torch_out_spec"]


def test_parameters_are_not_copied():
    from fusegraph.frontends.torch import import_torch
    module = Nested().eval()
    graph = import_torch(module, (torch.randn(3, 8), torch.randn(5)))
    ptrs = {v.const.data_ptr() for v in graph.constants.values()}
    assert module.lin.weight.data_ptr() in ptrs and module.offset.data_ptr() in ptrs


class Sorts(torch.nn.Module):
    def forward(self, x):
        return torch.sort(x).values + 1  # the unmapped op is on this line


def test_unsupported_op_names_op_and_source_line():
    with pytest.raises(UnsupportedOpError) as info:
        fg.compile(Sorts(), example_inputs=(torch.randn(4, 4),))
    msg = str(info.value)
    assert "aten.sort" in msg and "test_torch_frontend.py" in msg and "the unmapped op" in msg
    assert info.value.op_type.startswith("aten.sort")


def test_module_needs_example_inputs():
    with pytest.raises(ModelLoadError, match="example_inputs"):
        fg.compile(Nested())


def test_training_mode_dropout_is_refused():
    module = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Dropout(0.5)).train()
    with pytest.raises(UnsupportedOpError, match="eval"):
        fg.compile(module, example_inputs=(torch.randn(2, 4),))


MAKE_MODEL = '''
import torch

def make_model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.ReLU(), torch.nn.Flatten())
'''


def test_cli_compiles_a_torch_model_from_python(tmp_path, capsys):
    from fusegraph.cli.main import main
    src = tmp_path / "net.py"
    src.write_text(MAKE_MODEL)
    out = tmp_path / "net.fgm"
    assert main(["compile", f"{src}:make_model", "--example-input", "2x3x8x8", "-o", str(out)]) == 0
    model = fg.load(out)
    assert model.inputs[0].shape == (2, 3, 8, 8)
    x = torch.randn(2, 3, 8, 8)
    import importlib.util
    spec = importlib.util.spec_from_file_location("net_ref", src)
    ref = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(ref)
    assert_close(model.run({"input": x})["output"], eager(ref.make_model().eval(), (x,)))
    with pytest.raises(ModelLoadError, match="does not exist"):   # the API never runs a string as Python
        fg.compile(f"{src}:make_model")
    capsys.readouterr()
    assert main(["compile", f"{src}:make_model", "-o", str(out)]) == 2
    assert "example" in capsys.readouterr().err


class Indexing(torch.nn.Module):
    def forward(self, x, i, j):
        return x[i[:, None], j[None, :]] + x[-1, 2] + x[:, 1:4:2].sum()


def test_advanced_indexing_with_negative_indices():
    x, i, j = torch.randn(4, 5, 3), torch.tensor([0, -1, 2]), torch.tensor([1, 4, -2, 0])
    model = fg.compile(Indexing(), example_inputs=(x, i, j))
    assert_close(model.run({"x": x, "i": i, "j": j})["output"], Indexing()(x, i, j))


@pytest.mark.parametrize("name", ["bert", "resnet50"])
def test_same_kernels_as_the_onnx_export(name, tmp_path):
    import warnings
    module, args, names = build(name)
    path = tmp_path / f"{name}.onnx"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(module, args, str(path), opset_version=17, dynamo=False, input_names=names,
                          output_names=["output"])
    via_onnx = fg.compile(str(path)).report.kernel_count
    via_torch = fg.compile(module, example_inputs=args).report.kernel_count
    assert abs(via_torch - via_onnx) <= 0.1 * via_onnx, (via_torch, via_onnx)
