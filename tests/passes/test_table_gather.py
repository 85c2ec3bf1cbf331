"""Gathers from a constant table by ids a constant makes predictable (``passes/table_gather.py``):
a transformer's position ids (a slice of a constant 0..N-1) and token-type ids (a buffer of
one value, sliced and expanded) read their rows as views of the table. Checked against
onnxruntime ORT_DISABLE_ALL at several batch sizes and lengths, with a symbolic sequence."""
from __future__ import annotations

import numpy as np
import pytest

import fusegraph as fg
from fusegraph.errors import FusegraphError
from oracle import assert_outputs_close, ort_run
from passes_util import I64, F, const, model, node

N, D = 16, 8


def _embeddings(positions: np.ndarray, token_type: int, opset: int = 18):
    """BERT's embeddings as exporters write them: word + position + token type, the last two
    gathered by ids sliced from constant buffers to the input's length."""
    rng = np.random.default_rng(0)
    nodes = [node("Shape", ["ids"], "shp"), node("Gather", ["shp", "one"], "seq", axis=0),
             node("Unsqueeze", ["seq", "zero_axes"], "seq1") if opset >= 13 else node("Unsqueeze", ["seq"], "seq1", axes=[0]),
             node("Slice", ["pos_buf", "zero_axes", "seq1", "one_axes"], "pos_ids"),
             node("Gather", ["pos_table", "pos_ids"], "pos"),
             node("Slice", ["tt_buf", "zero_axes", "seq1", "one_axes"], "tt_cut"),
             node("Expand", ["tt_cut", "shp"], "tt_ids"),
             node("Gather", ["tt_table", "tt_ids"], "tt"),
             node("Gather", ["word", "ids"], "w"), node("Add", ["w", "pos"], "wp"), node("Add", ["wp", "tt"], "y")]
    inits = [const("one", 1, np.int64), const("zero_axes", [0], np.int64), const("one_axes", [1], np.int64),
             const("pos_buf", positions.reshape(1, -1), np.int64),
             const("tt_buf", np.full((1, N), token_type), np.int64),
             const("pos_table", rng.standard_normal((N, D))), const("tt_table", rng.standard_normal((3, D))),
             const("word", rng.standard_normal((50, D)))]
    return model(nodes, [("ids", I64, ["batch", "seq"])], [("y", F, ["batch", "seq", D])], inits, opset=opset)


def _gather_tables(compiled) -> set[str]:
    return {n.inputs[0].name for n in compiled.graph.nodes if n.op_type == "Gather" and n.inputs[0].is_const}


@pytest.mark.parametrize("token_type", [0, 2, -1])
def test_position_and_token_type_rows_are_views_of_their_tables(token_type):
    m = _embeddings(np.arange(N), token_type)
    compiled = fg.compile(m, fg.Config(verify_each=True))
    assert _gather_tables(compiled) == {"word"}, [n.op_type for n in compiled.graph.nodes]
    rules = {n.meta.get("rule") for n in compiled.graph.nodes}
    assert {"gather_by_slice_of_range", "gather_of_uniform"} <= rules, rules
    rng = np.random.default_rng(1)
    for batch, seq in ((1, 5), (2, N), (1, 1), (3, 9), (1, 5)):
        feeds = {"ids": rng.integers(0, 50, (batch, seq)).astype(np.int64)}
        assert_outputs_close(compiled.run(feeds), ort_run(m, feeds), rtol=1e-5, atol=1e-6)


def test_a_length_past_the_tables_fails_as_it_did():
    """At a length past the position buffer the slice stops at N rows in both forms, and the
    sum of N position rows with more word rows fails, as onnxruntime's does."""
    m = _embeddings(np.arange(N), 0)
    compiled = fg.compile(m)
    feeds = {"ids": np.ones((1, N + 3), np.int64)}
    with pytest.raises(Exception):
        ort_run(m, feeds)
    with pytest.raises(FusegraphError):
        compiled.run(feeds)


@pytest.mark.parametrize("positions", [np.arange(N)[::-1].copy(), np.arange(1, N + 1) % N])
def test_ids_that_are_not_a_range_from_zero_are_gathered(positions):
    m = _embeddings(positions, 0)
    compiled = fg.compile(m)
    assert "pos_table" in _gather_tables(compiled)
    feeds = {"ids": np.random.default_rng(2).integers(0, 50, (2, 7)).astype(np.int64)}
    assert_outputs_close(compiled.run(feeds), ort_run(m, feeds), rtol=1e-5, atol=1e-6)


def test_an_opset_without_unsqueeze_inputs_is_left_alone():
    m = _embeddings(np.arange(N), 0, opset=12)
    compiled = fg.compile(m)
    assert _gather_tables(compiled) == {"word", "pos_table", "tt_table"}
    feeds = {"ids": np.random.default_rng(3).integers(0, 50, (1, 6)).astype(np.int64)}
    assert_outputs_close(compiled.run(feeds), ort_run(m, feeds), rtol=1e-5, atol=1e-6)


def test_the_frames_hold_no_copy_of_the_rows():
    """With a symbolic sequence the rows are computed once per input shape and held by its
    frame: as views of the tables they hold none of the frame's private bytes."""
    m = _embeddings(np.arange(N), 1)
    compiled = fg.compile(m)
    for seq in (3, 11, 16):
        compiled.run({"ids": np.ones((2, seq), np.int64)})
    frames = compiled._executor.frame_runner.frames
    tables = {v.const.untyped_storage().data_ptr() for v in compiled.graph.constants.values()}
    rows = [t for frame in frames.frames.values() for t in frame[:len(frames.memo_results)]
            if t.dtype.is_floating_point]
    assert len(rows) == 2 * len(frames.frames) >= 2, [tuple(t.shape) for t in rows]
    assert all(t.untyped_storage().data_ptr() in tables for t in rows)
    assert frames.frame_bytes < 64 * len(frames.frames), frames.frame_bytes    # the ids' few int64s
