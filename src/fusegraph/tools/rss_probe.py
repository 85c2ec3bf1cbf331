"""Private memory (RssAnon) of one saved model, measured in a fresh process: what
``fusegraph compare --precision`` reports per side (two models in one process would share
and mask each other's allocations).

``rss_anon(path, threads)`` runs ``python -m fusegraph.tools.rss_probe PATH THREADS`` (this
interpreter, this fusegraph) and returns the child's RssAnon in bytes after it loaded the
``.fgm`` and ran it once on random inputs of its specs; ``rss_anon(None, threads)``: the same
process with fusegraph and torch imported and nothing loaded (the baseline). The path is an
argument, never code; the child has ``TIMEOUT_S`` seconds.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

TIMEOUT_S = 300


def read_rss_anon() -> int:
    """This process's RssAnon in bytes (0 where /proc does not say)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("RssAnon:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def rss_anon(path: str | Path | None, threads: int) -> int:
    import fusegraph
    src = str(Path(fusegraph.__file__).resolve().parent.parent)
    env = {**os.environ, "PYTHONPATH": src + os.pathsep + os.environ.get("PYTHONPATH", "")}
    out = subprocess.run([sys.executable, "-m", "fusegraph.tools.rss_probe", str(path or ""), str(threads)],
                         capture_output=True, text=True, timeout=TIMEOUT_S, env=env, check=False)
    if out.returncode != 0:
        raise RuntimeError(f"rss probe of {path or 'the baseline'} failed: {out.stderr.strip()[-500:]}")
    return int(json.loads(out.stdout.strip().splitlines()[-1])["rss_anon"])


def _main(argv: list[str]) -> int:
    import torch

    import fusegraph as fg
    from fusegraph.runtime.feeds import random_feeds
    path, threads = argv[0], int(argv[1])
    torch.set_num_threads(threads)
    if path:
        model = fg.load(path, threads=threads)
        model.run(random_feeds(model.inputs, 0))
    print(json.dumps({"rss_anon": read_rss_anon()}))
    return 0


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
