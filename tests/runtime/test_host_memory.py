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
