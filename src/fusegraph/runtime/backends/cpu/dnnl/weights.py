"""Constant weights in the layouts oneDNN primitives want, each held once per layout.

A primitive made with weights of format ``any`` picks a blocked layout (``OIhw16i16o``-like
for convolutions, a packed one for products). ``WeightStore.form(name, plain, plain_md, want)``
returns the bytes of weight ``name`` laid out as ``want``: the plain tensor itself when the
layouts agree, a form made before (two nodes sharing a weight share its packed bytes), a form
an artifact provided whose description matches (used as it is, no reorder: ``provide``), or a
new reorder, of the plain tensor or of a provided form read back with ``blocked.unpack``
(``reorders`` counts them: a load that finds its forms reorders nothing). ``export()`` gives
each weight's forms with their descriptions; ``plain(name, ...)`` reads one back (``save()``
and code that needs the plain tensor after the graph's copy was released).
"""
from __future__ import annotations

import torch

from .blocked import unpack
from .memory import MemDesc, reorder


class Packed:
    __slots__ = ("desc", "data")

    def __init__(self, desc: dict, data: torch.Tensor):
        self.desc, self.data = desc, data


class WeightStore:
    def __init__(self):
        self.forms: dict[str, list[Packed]] = {}
        self.provided: dict[str, list[Packed]] = {}
        self.reorders = 0

    def holds(self, name: str) -> bool:
        return name in self.forms or name in self.provided

    def provide(self, name: str, desc: dict, data: torch.Tensor) -> None:
        """A stored form (an artifact's, checked): used as it is when a primitive wants ``desc``."""
        self.provided.setdefault(name, []).append(Packed(desc, data))

    def form(self, name: str, plain: torch.Tensor | None, plain_md: MemDesc, want: MemDesc) -> torch.Tensor:
        """The bytes of weight ``name`` in layout ``want`` (a tensor the caller keeps alive);
        ``plain`` may be None when the store was provided a form of it."""
        if plain is not None and plain.device.type != "meta" and want == plain_md:
            return plain
        desc = want.describe()
        for p in self.forms.get(name, ()):
            if p.desc == desc:
                return p.data
        for p in self.provided.get(name, ()):
            if p.desc == desc and p.data.numel() == want.size:
                self.forms.setdefault(name, []).append(p)
                return p.data
        if plain is None or plain.device.type == "meta":
            plain = self._plain_from_provided(name)
        if plain is None:
            raise KeyError(f"no plain or stored form of weight {name!r}")
        plain = plain.contiguous()
        with torch.inference_mode(False):
            data = torch.empty(max(want.size, 1), dtype=torch.uint8)
        reorder(plain_md, plain.data_ptr(), want, data.data_ptr())
        self.reorders += 1
        self.forms.setdefault(name, []).append(Packed(desc, data))
        return data

    def _plain_from_provided(self, name: str) -> torch.Tensor | None:
        for p in self.provided.get(name, ()):
            return unpack(p.desc, p.data)
        return None

    def plain(self, name: str, shape, dtype: torch.dtype) -> torch.Tensor:
        """Weight ``name`` as a plain tensor of ``shape`` (from any of its forms)."""
        for p in self.forms.get(name, []) + self.provided.get(name, []):
            if p.data.dtype != torch.uint8:          # the plain tensor itself
                return p.data.reshape(shape)
            t = unpack(p.desc, p.data)
            if t.numel() == torch.Size(shape).numel():   # a float16 weight is packed as float32: exact back
                return t.to(dtype).reshape(shape)
        raise KeyError(f"no form of weight {name!r}")

    def export(self) -> dict[str, list[tuple[dict, torch.Tensor]]]:
        """``{name: [(description, bytes)]}`` of every packed form made or provided (a weight
        bound in its plain layout has none: the graph keeps it)."""
        out: dict[str, list] = {}
        for name in sorted(set(self.forms) | set(self.provided)):
            seen = []
            for p in self.forms.get(name, []) + self.provided.get(name, []):
                if p.data.dtype == torch.uint8 and p.desc not in seen:
                    seen.append(p.desc)
                    out.setdefault(name, []).append((p.desc, p.data))
        return out
