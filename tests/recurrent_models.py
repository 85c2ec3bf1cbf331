"""Small recurrent ONNX models for tests: one LSTM / GRU / RNN node with the attributes and
optional inputs a test asks for (He-scaled random weights), and the forms torch's exporter
writes (``nn.LSTM`` / ``nn.GRU`` stacks with their Transposes, Squeezes and zero initial
states built from Shape / Expand)."""
from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
from onnx import TensorProto, helper, numpy_helper

GATES = {"LSTM": 4, "GRU": 3, "RNN": 1}


def recurrent_model(op: str, steps: int = 5, batch: int = 3, inputs: int = 4, hidden: int = 6,
                    direction: str = "forward", initial: bool = True, bias: bool = True, layout: int = 0,
                    peepholes: bool = False, seq_lens=None, const_initial: bool = False, seed: int = 0,
                    outputs: int | None = None, opset: int = 14, **attrs):
    """(model, feeds) of one ``op`` node; ``attrs`` go on the node as they are (activations,
    clip, linear_before_reset, input_forget ...). ``initial``: h0 (and c0) are graph inputs
    (``const_initial``: initializers); ``seq_lens``: a constant int32 ``sequence_lens``;
    ``outputs``: how many of Y, Y_h, Y_c the node gives (all by default)."""
    dirs = 2 if direction == "bidirectional" else 1
    g = GATES[op]
    rng = np.random.default_rng(seed)

    def he(*shape):
        return (rng.standard_normal(shape) * np.sqrt(2.0 / shape[-1])).astype(np.float32)
    x_shape = [batch, steps, inputs] if layout else [steps, batch, inputs]
    s_shape = [batch, dirs, hidden] if layout else [dirs, batch, hidden]
    inits = [numpy_helper.from_array(he(dirs, g * hidden, inputs), "W"),
             numpy_helper.from_array(he(dirs, g * hidden, hidden), "R")]
    graph_inputs = [helper.make_tensor_value_info("X", TensorProto.FLOAT, x_shape)]
    feeds = {"X": rng.standard_normal(x_shape).astype(np.float32)}
    names = ["X", "W", "R", "B" if bias else ""]
    if bias:
        inits.append(numpy_helper.from_array((rng.standard_normal((dirs, 2 * g * hidden)) * 0.3).astype(np.float32),
                                             "B"))
    if seq_lens is not None:
        inits.append(numpy_helper.from_array(np.asarray(seq_lens, np.int32), "L"))
    names.append("L" if seq_lens is not None else "")
    states = ["h0", "c0"] if op == "LSTM" else ["h0"]
    for s in states:
        if not initial:
            names.append("")
            continue
        value = rng.standard_normal(s_shape).astype(np.float32)
        if const_initial:
            inits.append(numpy_helper.from_array(value, s))
        else:
            graph_inputs.append(helper.make_tensor_value_info(s, TensorProto.FLOAT, s_shape))
            feeds[s] = value
        names.append(s)
    if peepholes:
        inits.append(numpy_helper.from_array((rng.standard_normal((dirs, 3 * hidden)) * 0.5).astype(np.float32), "P"))
        names.append("P")
    while names and not names[-1]:
        names.pop()
    y_shape = [batch, steps, dirs, hidden] if layout else [steps, dirs, batch, hidden]
    outs = [("Y", y_shape), ("Y_h", s_shape), ("Y_c", s_shape)][:len(states) + 1][:outputs]
    node = helper.make_node(op, names, [n for n, _ in outs], hidden_size=hidden, direction=direction,
                            **({"layout": 1} if layout else {}), **attrs)
    graph = helper.make_graph([node], f"{op.lower()}_test", graph_inputs,
                              [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in outs], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    return model, feeds


def torch_recurrent_onnx(path: Path, kind: str = "lstm", layers: int = 2, hidden: int = 32, features: int = 12,
                         steps: int = 9, bidirectional: bool = False, seed: int = 0, dynamic: bool = False) -> Path:
    """``nn.LSTM`` / ``nn.GRU`` (batch-first, zero initial states) and a linear head, exported
    by ``torch.onnx.export`` at opset 17 as the zoo's lstm_2l / gru_bi are: input
    ``features`` ``[1, steps, features]`` (``dynamic``: ``[batch, seq, features]``), output
    ``logits``."""
    import torch

    torch.manual_seed(seed)
    cls = torch.nn.LSTM if kind == "lstm" else torch.nn.GRU

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.rnn = cls(features, hidden, num_layers=layers, batch_first=True, bidirectional=bidirectional)
            self.head = torch.nn.Linear(hidden * (2 if bidirectional else 1), 5)

        def forward(self, x):
            return self.head(self.rnn(x)[0])
    net = Net().eval()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(net, (torch.randn(1, steps, features),), str(path), opset_version=17, dynamo=False,
                          input_names=["features"], output_names=["logits"],
                          dynamic_axes={n: {0: "batch", 1: "seq"} for n in ("features", "logits")} if dynamic else None)
    return path
