"""Per-run allocations reuse freed heap memory instead of faulting in fresh pages
(runtime/backends/cpu/host_memory.py), on kernels that allocate (the portable ones without an
arena: the oneDNN kernels write into it and allocate nothing). Page faults are counted, not
timed: each configuration runs in a fresh process, since the malloc setting is process-wide
and cannot be undone."""
import json
import subprocess
import sys

import pytest

from fusegraph.runtime.backends.cpu import host_memory

WORKER = r"""
import json, resource, sys
import fusegraph as fg
from fusegraph.testing import zoo
from fusegraph.tools.bench import random_feeds_for
model = fg.compile(zoo.light_model_path("inception_v1"), fg.Config(threads=1, keep_freed_memory=sys.argv[1] == "1",
                                                                   cpu_kernels="portable", memory="off"))
feeds = random_feeds_for(model)
for _ in range(8):
    model.run(feeds)
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(10):
    model.run(feeds)
print(json.dumps((resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) / 10))
"""


def _faults_per_run(keep: bool) -> float:
    out = subprocess.run([sys.executable, "-c", WORKER, "1" if keep else "0"], capture_output=True, text=True,
                         check=True, timeout=600)
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc malloc only")
def test_runs_stop_faulting_in_fresh_pages():
    kept, default = _faults_per_run(True), _faults_per_run(False)
    print(f"inception_v1 minor page faults per run: {kept:.0f} kept, {default:.0f} with malloc's defaults")
    # with the policy a run faults in almost no page; how many malloc's defaults fault depends on
    # glibc's dynamic mmap threshold, which the process's history moves (alone: ~2000-3500 a run;
    # after the whole suite in the same session: ~80; a fresh clone's CI run: 0, against 1.5 kept),
    # so only the kept side is bounded: a tenth of the ~3500 a run that malloc's defaults fault alone
    # (kept runs measured 0, 28 and once 171 on a loaded machine)
    assert kept < 350


def test_setting_is_made_once():
    first = host_memory.keep_freed_memory()
    assert host_memory.keep_freed_memory() is first and len(host_memory._done) == 1


def test_growth_release_releases_once_private_memory_grew_past_its_step(monkeypatch):
    """``GrowthRelease``: no release while private memory stays within ``growth`` of the last
    release (or the first run), one once it grew past it, measured again from what the
    release left; a process whose memory fell below the base takes that as the base."""
    readings = iter([100, 110, 116, 117, 90, 95, 130, 131])
    calls = []
    monkeypatch.setattr(host_memory, "private_resident_bytes", lambda: next(readings))
    monkeypatch.setattr(host_memory, "release_free_memory", lambda: calls.append(1) or True)
    release = host_memory.GrowthRelease(growth=15)
    for _ in range(3):
        release.after_run()                    # 100 (base), 110, 116 (> 115: release, base 117)
    assert calls == [1] and release.base == 117
    release.after_run()                        # 90: below the base, the new base
    assert release.base == 90 and calls == [1]
    release.after_run()                        # 95
    release.after_run()                        # 130 > 105: release, base 131
    assert calls == [1, 1] and release.base == 131 and release.releases == 2


@pytest.mark.parametrize("keep", [False, True])
def test_runs_of_symbolic_shapes_are_followed_by_the_growth_check(keep, monkeypatch):
    """A model with symbolic dims runs the backend's release check after each run (unless
    ``keep_freed_memory`` asked to keep freed memory); a model of fixed shapes, whose runs
    allocate the same sizes every time, does not."""
    import numpy as np
    from onnx import TensorProto, helper

    import fusegraph as fg
    seen = []
    monkeypatch.setattr(host_memory.GrowthRelease, "after_run", lambda self: seen.append(1))
    monkeypatch.setattr(host_memory, "keep_freed_memory", lambda: True)    # not this process's malloc for good

    def relu(dim):
        g = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [dim, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [dim, 4])])
        return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    dynamic = fg.compile(relu("n"), fg.Config(keep_freed_memory=keep))
    for n in (2, 3, 2):
        np.testing.assert_array_equal(dynamic.run({"x": -np.ones((n, 4), np.float32)})["y"], np.zeros((n, 4)))
    assert len(seen) == (0 if keep else 3)
    static = fg.compile(relu(2), fg.Config(keep_freed_memory=keep))
    static.run({"x": np.ones((2, 4), np.float32)})
    assert len(seen) == (0 if keep else 3)


@pytest.mark.skipif(not hasattr(__import__("os"), "fork") or host_memory.private_resident_bytes() is None,
                    reason="needs fork and /proc/self/statm")
def test_the_private_memory_read_is_the_calling_process_s_after_a_fork():
    """The statm file stays open between reads; a forked child reads its own, not its
    parent's through the inherited descriptor: 64 MiB it touched show in its reading only."""
    import os
    before = host_memory.private_resident_bytes()
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:                                   # the child: no torch, only the read
        try:
            block = bytearray(64 << 20)
            for i in range(0, len(block), 4096):
                block[i] = 1
            os.write(w, str(host_memory.private_resident_bytes()).encode())
        finally:
            os._exit(0)
    os.close(w)
    child = int(os.read(r, 64).decode())
    os.waitpid(pid, 0)
    after = host_memory.private_resident_bytes()
    assert child - before > 60 << 20 and abs(after - before) < 32 << 20, (before, child, after)
