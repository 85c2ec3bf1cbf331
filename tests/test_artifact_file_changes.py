"""A loaded artifact does not depend on its file: rewritten in place (``cp`` over it),
truncated, or deleted after ``fg.load``, the model computes exactly what it computed before,
and no signal is raised (the file is read into private memory once, at load)."""
from __future__ import annotations

import os
import shutil

import numpy as np
import onnx
import pytest

import fusegraph as fg
from fusegraph.testing import zoo


@pytest.fixture(scope="module")
def two_artifacts(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("fgm_change")
    proto = onnx.load(zoo.light_model_path("squeezenet"))
    paths = []
    for seed in (0, 1):
        path = tmp / f"m{seed}.fgm"
        fg.compile(zoo.randomize_weights(proto, seed=seed)).save(path)
        paths.append(path)
    return proto, paths


def _rewrite_in_place(src, dst):
    with open(src, "rb") as f, open(dst, "r+b") as g:   # same inode, as `cp` over a file does
        shutil.copyfileobj(f, g)
        g.truncate()


@pytest.mark.parametrize("change", ["rewrite", "truncate", "zero", "delete"])
def test_a_changed_file_changes_nothing(two_artifacts, tmp_path, change):
    proto, (first, second) = two_artifacts
    path = tmp_path / "live.fgm"
    shutil.copy(first, path)
    feeds = zoo.random_feeds(proto)
    model = fg.load(path)
    want = model.run(feeds)
    if change == "rewrite":
        _rewrite_in_place(second, path)
        assert not np.array_equal(next(iter(fg.load(path).run(feeds).values())), next(iter(want.values())))
    elif change == "truncate":
        os.truncate(path, 4096)
    elif change == "zero":
        with open(path, "r+b") as f:
            f.write(b"\0" * os.path.getsize(path))
    else:
        os.remove(path)
    got = model.run(feeds)
    for name in want:
        np.testing.assert_array_equal(got[name], want[name])
