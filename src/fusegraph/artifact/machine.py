"""What machine an artifact was built for, and whether this one can run it.

An artifact records the CPU architecture, torch's CPU capability (the instruction set its
kernels were compiled for), the CPU flags that capability needs, and the CUDA capability;
``check_machine`` refuses an artifact this machine cannot run, with a hint to recompile.
"""
from __future__ import annotations

import functools
import platform
from typing import Any

import torch

from ..errors import ArtifactError

_CAP_FLAGS = {"AVX2": ["avx2", "fma"], "AVX512": ["avx2", "fma", "avx512f", "avx512bw", "avx512vl",
                                                  "avx512dq"]}
_CAP_RANK = {"DEFAULT": 0, "NO AVX": 0, "AVX2": 1, "AVX512": 2}
HINT = "recompile the model on this machine (fusegraph compile MODEL -o OUT.fgm)"




def cpu_requirements(capability: str, flags: set[str] | None) -> list[str]:
    """The CPU flags an artifact built at ``capability`` needs, as far as this CPU reports them."""
    return sorted(set(_CAP_FLAGS.get(capability, [])) & (flags or set()))


def _cpu_flags() -> set[str] | None:
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.startswith(("flags", "Features")):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return None


@functools.lru_cache(maxsize=1)
def machine() -> dict[str, Any]:
    """What this process can run: architecture, torch CPU capability, CPU flags, CUDA (cached)."""
    cuda = torch.cuda.is_available()
    return {"arch": platform.machine().lower(), "capability": torch.backends.cpu.get_cpu_capability(),
            "flags": _cpu_flags(),
            "cuda": list(torch.cuda.get_device_capability()) if cuda else None}


def check_machine(header: dict, here: dict, where: str) -> None:
    dev, cpu = header["device"], header["cpu"]
    req = cpu.get("requires", [])
    if not (isinstance(req, list) and all(isinstance(x, str) for x in req)):
        raise ArtifactError(f"{where}: cpu.requires is malformed")
    if dev.get("kind") not in ("cpu", "cuda"):
        raise ArtifactError(f"{where}: built for device {dev.get('kind')!r}, which fusegraph does not know; "
                            f"{HINT}")
    if dev["kind"] == "cuda" and here["cuda"] is None:
        raise ArtifactError(f"{where}: built for CUDA but this machine has no usable CUDA device; {HINT} "
                            f"with device='cpu'")
    if dev["kind"] == "cuda" and tuple(here["cuda"]) < tuple(dev.get("capability") or (0, 0)):
        raise ArtifactError(f"{where}: built for CUDA capability {dev['capability']}, this GPU has "
                            f"{here['cuda']}; {HINT}")
    if cpu.get("arch") != here["arch"]:
        raise ArtifactError(f"{where}: built for a {cpu.get('arch')} CPU, this machine is {here['arch']}; "
                            f"{HINT}")
    missing = sorted(set(req) - here["flags"]) if here["flags"] is not None else []
    built, have = cpu.get("capability"), here["capability"]
    if missing or (built != have and _CAP_RANK.get(built, 99) > _CAP_RANK.get(have, -1)):
        needs = f" (needs {', '.join(missing)})" if missing else ""
        raise ArtifactError(f"{where}: built for CPU instruction set {built}{needs}, which this machine "
                            f"lacks (it runs {have}); {HINT}, or build for older CPUs by compiling with "
                            f"ATEN_CPU_CAPABILITY=default")
