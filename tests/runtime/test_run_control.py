"""Runs that can be stopped and capped (issue 39 #1, #5, #11): ``model.run(feeds, timeout=...,
cancel=token)`` stops between kernels and between Loop / Scan iterations with a typed error and
leaves the model ready for its next run; ``Config.max_loop_iterations`` and ``max_run_bytes``
refuse a run that asks for more before anything is allocated; ``close()`` during a run waits
for it. Every wait here is bounded; the models are tiny."""
from __future__ import annotations

import threading
import time

import numpy as np
import pytest
from onnx import TensorProto as T, helper as H, numpy_helper as NH

import fusegraph as fg
from fusegraph.errors import RunCancelled, RunDeadlineExceeded, RunLimitExceeded, UsageError
from stream_plans import rebind

OPSET = [H.make_opsetid("", 17)]


def loop_model(scan: bool = False):
    """``y = x + n`` by a Loop of ``n`` iterations (``n`` is a feed), each adding 1; with
    ``scan``, the Loop also stacks each iteration's running sum (a scan output ``s``)."""
    body_nodes = [H.make_node("Add", ["acc_in", "one"], ["acc_out"]), H.make_node("Identity", ["c_in"], ["c_out"])]
    body_outs = [H.make_tensor_value_info("c_out", T.BOOL, []), H.make_tensor_value_info("acc_out", T.FLOAT, [4])]
    if scan:
        body_nodes.append(H.make_node("Identity", ["acc_out"], ["s_out"]))
        body_outs.append(H.make_tensor_value_info("s_out", T.FLOAT, [4]))
    body = H.make_graph(body_nodes, "body",
                        [H.make_tensor_value_info("i", T.INT64, []), H.make_tensor_value_info("c_in", T.BOOL, []),
                         H.make_tensor_value_info("acc_in", T.FLOAT, [4])], body_outs,
                        [NH.from_array(np.ones(4, np.float32), "one")])
    outs = ["y", "s"] if scan else ["y"]
    g = H.make_graph([H.make_node("Loop", ["n", "", "x"], outs, body=body)], "loop",
                     [H.make_tensor_value_info("n", T.INT64, []), H.make_tensor_value_info("x", T.FLOAT, [4])],
                     [H.make_tensor_value_info(o, T.FLOAT, None) for o in outs])
    return H.make_model(g, opset_imports=OPSET)


def _loop_feeds(n):
    return {"n": np.array(n, np.int64), "x": np.arange(4, dtype=np.float32)}


def chain_model(length: int = 12, rows=8):
    """A straight chain of ``length`` elementwise nodes (no fusion at O0); ``rows`` "N": a
    symbolic first dim (one compile for every shape: frames)."""
    nodes, prev = [], "x"
    for i in range(length):
        nodes.append(H.make_node("Sin" if i % 2 else "Cos", [prev], [f"t{i}"]))
        prev = f"t{i}"
    g = H.make_graph(nodes, "chain", [H.make_tensor_value_info("x", T.FLOAT, [rows, 8])],
                     [H.make_tensor_value_info(prev, T.FLOAT, None)])
    return H.make_model(g, opset_imports=OPSET)


def test_timeout_stops_a_loop_whose_trip_count_comes_from_the_feeds():
    """issue 39 #1: a Loop of 10^12 iterations with a 0.3 s timeout stops (between two
    iterations) with RunDeadlineExceeded, a TimeoutError; the model's next run is right."""
    model = fg.compile(loop_model())
    t0 = time.monotonic()
    with pytest.raises(RunDeadlineExceeded, match=r"node 'y'.*deadline of 0\.300 s passed") as info:
        model.run(_loop_feeds(10 ** 12), timeout=0.3)
    assert time.monotonic() - t0 < 10, "the run went on long past its deadline"
    assert isinstance(info.value, TimeoutError) and info.value.reason == "deadline"
    np.testing.assert_array_equal(model.run(_loop_feeds(5))["y"], np.arange(4, dtype=np.float32) + 5)


def test_cancel_token_stops_a_run_from_another_thread():
    """issue 39 #1: ``token.cancel()`` from another thread stops a running Loop; the token stays
    cancelled (a later run given it stops before its first kernel); a fresh token runs."""
    model = fg.compile(loop_model())
    token = fg.CancelToken()
    timer = threading.Timer(0.2, token.cancel)
    timer.start()
    with pytest.raises(RunCancelled, match="cancelled by the caller") as info:
        model.run(_loop_feeds(10 ** 12), cancel=token)
    timer.join()
    assert not isinstance(info.value, RunDeadlineExceeded) and token.cancelled
    with pytest.raises(RunCancelled, match="before its first kernel"):
        model.run(_loop_feeds(1), cancel=token)
    got = model.run(_loop_feeds(3), cancel=fg.CancelToken(), timeout=60)
    np.testing.assert_array_equal(got["y"], np.arange(4, dtype=np.float32) + 3)


@pytest.mark.parametrize("rows", [8, "N"])
def test_cancel_stops_between_kernels_of_straight_line_code(rows):
    """issue 39 #1: a token cancelled while node k runs stops the run before node k+1: no later
    kernel starts (the hook sees them), and a KernelError is not what comes out; the same with
    a symbolic dim (the frames' generated code reads the flag too)."""
    model = fg.compile(chain_model(12, rows), fg.Config(level="O0"))
    assert "_RC.stop" in model.source
    token = fg.CancelToken()
    started = []

    def hook(index, phase, outs):
        if phase == 0:
            started.append(index)
            if index == 4:
                token.cancel("stop here")
    with pytest.raises(RunCancelled, match=r"stop here \(before node") as info:
        model.run({"x": np.ones((8, 8), np.float32)}, hook=hook, cancel=token)
    assert started == [0, 1, 2, 3, 4] and info.value.node == model.plan.order[5]
    x = np.random.default_rng(0).standard_normal((8, 8)).astype(np.float32)
    ref = fg.compile(chain_model(12, rows), fg.Config(level="O0", memory="off")).run({"x": x})
    np.testing.assert_array_equal(model.run({"x": x}, timeout=30)[model.outputs[0].name], next(iter(ref.values())))


def test_cancel_stops_every_stream_and_the_model_runs_again():
    """issue 39 #1: with two CPU streams, a cancel raised on one stream stops the other at its
    next wait; the next run matches a one-stream run."""
    from test_stream_runtime import _random_dag
    proto, feeds = _random_dag(7)
    base = fg.compile(proto, fg.Config(memory="off", level="O0"))
    want = base.run(feeds)
    model = rebind(base, "balanced", 2, seed=1)
    assert model.plan.streams is not None and model.plan.streams.num_streams == 2
    token = fg.CancelToken()
    seen = []

    def hook(index, phase, outs):
        seen.append(index)
        if phase == 1 and len(seen) >= 4:
            token.cancel()
    with pytest.raises(RunCancelled):
        model.run(feeds, hook=hook, cancel=token)
    assert len({i for i in seen}) < len(model.plan.order)
    got = model.run(feeds, timeout=60)
    for k in want:
        np.testing.assert_allclose(got[k], want[k], rtol=1e-5, atol=1e-6)
    model.close()


def test_timeout_covers_the_wait_for_another_run():
    """issue 39 #1: a run waiting for the model's lock gives up at its own deadline."""
    model = fg.compile(loop_model())
    token = fg.CancelToken()
    busy = threading.Thread(target=lambda: pytest.raises(RunCancelled, model.run, _loop_feeds(10 ** 12),
                                                         cancel=token))
    busy.start()
    try:
        time.sleep(0.2)
        with pytest.raises(RunDeadlineExceeded, match="while it waited for another run"):
            model.run(_loop_feeds(1), timeout=0.2)
    finally:
        token.cancel()
        busy.join(30)
    assert not busy.is_alive()


def test_bad_timeouts_and_tokens_are_refused():
    model = fg.compile(chain_model(2))
    x = {"x": np.ones((8, 8), np.float32)}
    for bad in (-1, float("nan"), "2", True):
        with pytest.raises(UsageError, match="timeout"):
            model.run(x, timeout=bad)
    with pytest.raises(UsageError, match="CancelToken"):
        model.run(x, cancel=object())
    with pytest.raises(RunDeadlineExceeded):
        model.run(x, timeout=0)


def test_max_loop_iterations():
    """issue 39 #1: ``Config.max_loop_iterations`` refuses the iteration past the cap, naming
    the node; a Loop within the cap runs."""
    model = fg.compile(loop_model(), fg.Config(max_loop_iterations=1000))
    with pytest.raises(RunLimitExceeded, match=r"node 'y' \(Loop\) would run more than 1000 iterations") as info:
        model.run(_loop_feeds(10 ** 12))
    assert info.value.limit == 1000
    np.testing.assert_array_equal(model.run(_loop_feeds(1000))["y"], np.arange(4, dtype=np.float32) + 1000)
    for bad in (0, -3, 2.5, True):
        with pytest.raises(fg.errors.ConfigError, match="max_loop_iterations"):
            fg.Config(max_loop_iterations=bad)


def test_loop_scan_outputs_are_capped_by_max_run_bytes():
    """issue 39 #1/#5: a Loop's scan output is refused once its stacked size would pass
    ``max_run_bytes`` (16 bytes per iteration here: 65 536 iterations pass 1 MiB)."""
    model = fg.compile(loop_model(scan=True), fg.Config(max_run_bytes=1 << 20))
    with pytest.raises(RunLimitExceeded, match=r"scan output 0 of shape \[65537, 4\] \(1048592 bytes\).*"
                                               r"max_run_bytes \(1048576 bytes\)"):
        model.run(_loop_feeds(10 ** 12))
    got = model.run(_loop_feeds(3))
    np.testing.assert_array_equal(got["s"], np.arange(4, dtype=np.float32) + np.arange(1, 4)[:, None])


def test_close_during_a_stream_run_waits_for_it():
    """issue 39 #11: ``close()`` while a two-stream run is in progress returns only after the
    run has finished (its outputs right), and no stream worker dies (no 'release unlocked
    lock'); a run after close raises ModelClosedError."""
    from test_stream_runtime import _random_dag
    proto, feeds = _random_dag(7)
    base = fg.compile(proto, fg.Config(memory="off", level="O0"))
    want = base.run(feeds)
    errors = []
    old_hook = threading.excepthook
    threading.excepthook = lambda args: errors.append(args.exc_value)
    try:
        for trial in range(3):
            model = rebind(base, "balanced", 2, seed=1)
            model.run(feeds)                      # the workers exist
            workers = list(model._executor._runner._workers)
            inside = threading.Event()
            result, finished = {}, []

            def hook(index, phase, outs):
                if phase == 0 and index == 1:
                    inside.set()
                    time.sleep(0.1)
                if phase == 1:
                    finished.append(index)

            def run():
                result["y"] = model.run(feeds, hook=hook)
            t = threading.Thread(target=run)
            t.start()
            assert inside.wait(30)
            model.close()
            assert len(finished) == len(model.plan.order), "close() returned while the run was still going"
            t.join(30)
            for k in want:
                np.testing.assert_allclose(result["y"][k], want[k], rtol=1e-5, atol=1e-6)
            with pytest.raises(fg.errors.ModelClosedError):
                model.run(feeds)
            for w in workers:
                w.thread.join(5)
                assert not w.thread.is_alive()
    finally:
        threading.excepthook = old_hook
    assert not errors, errors
