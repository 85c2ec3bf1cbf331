"""The shape program's integer arithmetic on Python values and its shared rule results
(``shape_program.py``, ``ops/shape_ints.py``) give what the op kernels and one rule call per
node give: on a GPT-2 decoder with a growing past (across the limit of a value held as Python
ints, where the arithmetic moves to the kernels) and at prompt lengths, every shape and every
computed value of the run is the same as a program's that runs each node's kernel and rule."""
import numpy as np
import pytest
import torch

import fusegraph as fg
from fusegraph.ops.shape_ints import MAX_ELEMENTS
from fusegraph.runtime.shape_program import ShapeProgram, ShapeStep, ValueStep
from model_builders import gpt2_kv_cache_onnx

LAYERS, HIDDEN, HEADS = 2, 64, 4


@pytest.fixture(scope="module")
def decoder(tmp_path_factory):
    path, _ = gpt2_kv_cache_onnx(tmp_path_factory.mktemp("kv") / "gpt2kv.onnx", layers=LAYERS, hidden=HIDDEN,
                                 heads=HEADS)
    model = fg.compile(str(path), fg.Config(threads=1))
    model.run(_feeds(model, 0, 5))
    return model


def _feeds(model, past: int, seq: int) -> dict:
    feeds = {}
    for v in model.graph.inputs:
        if v.name == "input_ids":
            feeds[v.name] = np.zeros((1, seq), np.int64)
        elif v.name == "attention_mask":
            feeds[v.name] = np.ones((1, past + seq), np.int64)
        else:
            feeds[v.name] = np.zeros((1, HEADS, past, HIDDEN // HEADS), np.float32)
    return feeds


def _shapes(model, past: int, seq: int) -> list[tuple]:
    return [tuple(a.shape) for a in _feeds(model, past, seq).values()]


def _programs(model) -> tuple[ShapeProgram, ShapeProgram]:
    """(the model's program, one of the same calls that runs every kernel and every rule)."""
    runner = model._executor.frame_runner
    calls = runner.binding.calls
    plain = ShapeProgram(runner.graph, [c.node for c in calls], set(), {id(c.node): c for c in calls})
    for step in plain.steps:
        if step.__class__ is ValueStep and not step.shape_of:
            step.small = None
        elif step.__class__ is ShapeStep:
            step.twin = None
    return runner.program, plain


def test_python_arithmetic_and_shared_rules_give_the_kernels_shapes_and_values(decoder):
    program, plain = _programs(decoder)
    assert [s.node.name for s in program.steps] == [s.node.name for s in plain.steps]
    assert any(s.__class__ is ValueStep and s.small is not None and not s.shape_of for s in program.steps)
    assert any(s.__class__ is ShapeStep and s.twin is not None for s in program.steps)
    walk = [(0, 7), (7, 1)] + [(p, 1) for p in range(8, MAX_ELEMENTS + 12)] + [(0, 3), (0, 70), (3, 2), (0, 7)]
    for past, seq in walk:
        got_values, want_values = {}, {}
        got = program.evaluate(_shapes(decoder, past, seq), {}, computed=got_values)
        want = plain.evaluate(_shapes(decoder, past, seq), {}, computed=want_values)
        assert got == want, (past, seq)
        assert got_values.keys() == want_values.keys() and got_values
        for k, t in want_values.items():
            g = got_values[k]
            assert g.dtype == t.dtype and g.shape == t.shape and torch.equal(g, t), (past, seq)


def test_a_decoders_layers_call_each_shape_rule_once_a_token(decoder):
    program, _ = _programs(decoder)
    attention = [s for s in program.steps if s.__class__ is ShapeStep and "Attention" in s.node.op_type]
    assert len(attention) == LAYERS
    calls = []
    for step in attention:
        rule = step.rule
        step.rule = lambda node, shapes, values, rule=rule: calls.append(node.name) or rule(node, shapes, values)
    try:
        for past in (40, 41, 42):
            shapes = program.evaluate(_shapes(decoder, past, 1), {})
            assert len(calls) == 1
            calls.clear()
            assert len({shapes[s.outs[0]] for s in attention}) == 1
    finally:
        for step in attention:
            step.rule = step.rule.__defaults__[0]
