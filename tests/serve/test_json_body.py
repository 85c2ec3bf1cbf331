"""``serve/json_body.loads`` (issue 39 #4, #8) against ``json.loads`` as the oracle: the same
values for valid documents (long number arrays as numpy arrays of the same numbers), a
``ValueError`` for invalid ones, a nesting limit instead of a RecursionError, and parsing that
holds the interpreter only briefly (a ticking thread keeps ticking)."""
from __future__ import annotations

import json
import threading
import time

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fusegraph.serve.json_body import MAX_DEPTH, SMALL, loads


def _plain(v):
    """``v`` with numpy arrays as lists (what ``json.loads`` gives)."""
    if isinstance(v, np.ndarray):
        return v.tolist()
    if isinstance(v, dict):
        return {k: _plain(x) for k, x in v.items()}
    if isinstance(v, list):
        return [_plain(x) for x in v]
    return v


DOCS = ['{"a": [1, 2, 3]}', '[1,2,[3,[4]]]', '{"x": "s\\u00e9\\n", "y": null, "z": true, "w": false}', "[]", "{}",
        " [ ] ", '{"a":1,"a":2}', '"str"', "1.5", "[1e5, -2.5E-3, 0, -0]", '{"k": {"n": [[1, 2], [3, 4]]}}',
        "NaN", "[Infinity, -Infinity]"]


@pytest.mark.parametrize("doc", DOCS)
def test_small_documents_equal_json(doc):
    assert _plain(loads(doc)) == json.loads(doc) or doc in ("NaN",) and np.isnan(loads(doc))


json_values = st.recursive(st.none() | st.booleans() | st.integers(-2 ** 70, 2 ** 70) |
                           st.floats(allow_nan=False) | st.text(max_size=8),
                           lambda inner: st.lists(inner, max_size=6) | st.dictionaries(st.text(max_size=5), inner,
                                                                                       max_size=6), max_leaves=40)


@settings(max_examples=200, deadline=None)
@given(json_values)
def test_random_documents_equal_json(value):
    text = json.dumps(value)
    assert _plain(loads(text)) == json.loads(text)
    assert _plain(loads(text.encode())) == json.loads(text)


@pytest.mark.parametrize("kind", ["floats", "ints", "nested rows", "19-digit ints"])
def test_long_number_arrays_come_back_as_the_same_numbers(kind):
    rng = np.random.default_rng(0)
    if kind == "floats":
        values = (rng.standard_normal(50_000) * 10.0 ** rng.integers(-30, 30, 50_000)).tolist()
    elif kind == "ints":
        values = rng.integers(-10 ** 17, 10 ** 17, 50_000).tolist()
    elif kind == "19-digit ints":        # past int64's safe parse: the exact path (Python ints)
        values = rng.integers(-2 ** 63, 2 ** 63 - 1, 50_000, dtype=np.int64).tolist() + [2 ** 64 + 1]
    else:
        values = rng.standard_normal((40, 3000)).tolist()
    text = json.dumps({"data": values})
    got = loads(text)["data"]
    fast = isinstance(got, np.ndarray) or isinstance(got[0], np.ndarray)
    assert len(text) > SMALL and fast == (kind != "19-digit ints")
    assert _plain(got) == json.loads(text)["data"]       # bit for bit: numpy reads them as Python does


@pytest.mark.parametrize("bad", ["[1,,2]" + ",3" * 3000, "[" + "1," * 5000 + "]", "[" + "1e," * 3000 + "1]",
                                 "[" + "1.5 2," * 3000 + "1]", '{"a" 1}', "[1 2]", "[1,2", '{"a": }', "", "[",
                                 '{"a": 1} x', "[-]" + " " * SMALL, "[" + "1," * 3000 + "--1]"])
def test_invalid_documents_are_value_errors(bad):
    with pytest.raises(ValueError):
        loads(bad)


def test_nesting_is_limited():
    assert _plain(loads("[" * MAX_DEPTH + "]" * MAX_DEPTH)) == json.loads("[" * MAX_DEPTH + "]" * MAX_DEPTH)
    for doc in ("[" * 100_000 + "]" * 100_000, '{"a":' * (MAX_DEPTH + 1) + "1" + "}" * (MAX_DEPTH + 1)):
        with pytest.raises(ValueError, match=f"nested deeper than {MAX_DEPTH}"):
            loads(doc)
    with pytest.raises(ValueError):
        loads(b"\xff\xfe[1]")                              # not UTF-8


def test_a_large_body_leaves_other_threads_running():
    """While a 20 MB array parses on one thread, a second thread's 1 ms sleeps keep coming back
    within a few tenths of a second (json.loads holds the interpreter for the whole body)."""
    text = json.dumps({"data": np.random.default_rng(1).standard_normal(1_000_000).tolist()}).encode()
    gaps, stop = [], threading.Event()

    def tick():
        last = time.perf_counter()
        while not stop.is_set():
            time.sleep(0.001)
            now = time.perf_counter()
            gaps.append(now - last)
            last = now
    ticker = threading.Thread(target=tick)
    ticker.start()
    try:
        time.sleep(0.05)
        got = loads(text)
    finally:
        stop.set()
        ticker.join()
    assert got["data"].shape == (1_000_000,)
    assert max(gaps) < 0.5, max(gaps)
