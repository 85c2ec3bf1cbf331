"""Constant weights in the layouts oneDNN primitives want, each held once per layout.

A primitive made with weights of format ``any`` picks a blocked layout (``OIhw16i16o``-like
for convolutions, a packed one for products). Its operand is the graph's weight seen through
``perm`` (``weight.permute(perm)`` reshaped to the operand's dims: a grouped convolution's
``[g, O/g, I/g, kh, kw]``, a product's ``[K, N]`` which is ``W^T`` under ``trans_b``).

``WeightStore.form(name, weight, perm, operand_md, want)`` returns the bytes of that operand in
layout ``want``: the weight itself when the layouts agree, a form made before (two nodes
sharing a weight and its orientation share the packed bytes), a provided form whose layout
and orientation match (an artifact's, used as it is: ``provide``), or a new reorder of the
plain weight or of a provided form read back with ``blocked.unpack`` (``reorders`` counts
them: a load that finds its forms reorders nothing).

After binding the graph keeps a shape-only "meta" placeholder for a weight the store holds
(``release``); the placeholder remembers its store, so a later bind of the same graph (another
backend, a rebinding) takes the packed forms from there instead of needing the plain tensor,
and ``plain(name, placeholder)`` reads the weight back (``save()`` where no form is stored,
a portable kernel, another device). ``export()`` gives each weight's forms with their
descriptions and orientation.

New forms are cut from 2 MiB-page mappings where the kernel gives them (``huge_pages.py``: a
product streams its weight on every call, and 4 KiB pages cost it a TLB miss per page).

``SharedForms`` lets several stores (the per-shape compiles of one dynamic model,
``compiler/specialize.py``) share the packed forms of the weights they all read. A form is keyed by the
plain weight's contents (a SHA-256 of its bytes), its orientation and its layout, never by
name (a pass of one compile may give a name another compile's weight also has).
"""
from __future__ import annotations

import weakref

import torch

from ..huge_pages import HugeBuffers
from .blocked import unpack
from .memory import DTYPES, TORCH_OF, MemDesc
from .primitive import reorder

_OWNERS: dict[int, tuple] = {}    # id(placeholder) -> (weakref to it, the store holding its weight)
REDUCED = (torch.bfloat16, torch.float16)


def owner_of(t: torch.Tensor):
    """The store holding the weight a placeholder stands for (None: not a released weight)."""
    got = _OWNERS.get(id(t))
    return got[1] if got is not None and got[0]() is t else None


class Packed:
    __slots__ = ("desc", "data", "perm")

    def __init__(self, desc: dict, data: torch.Tensor, perm: tuple[int, ...]):
        self.desc, self.data, self.perm = desc, data, tuple(perm)


class SharedForms:
    """Packed forms shared by the stores made with it (the per-shape compiles of one model,
    ``Config.shape_cache``), keyed by the plain weight *itself* (its storage, offset, geometry
    and version: the same tensor object every compile's graph copy shares; nothing hashes its
    bytes), its orientation and the layout. A compile whose passes derive a new weight (a
    folded BatchNorm) packs that one anew. The plain tensors are kept beside their forms, so a
    storage address is never reused by another weight while its key lives."""

    def __init__(self):
        self._forms: dict[tuple, torch.Tensor] = {}
        self._plains: dict[tuple, torch.Tensor] = {}
        self.hits = 0

    @staticmethod
    def key(weight: torch.Tensor, perm, desc: dict) -> tuple:
        return (weight.untyped_storage().data_ptr(), weight.storage_offset(), str(weight.dtype), tuple(weight.shape),
                tuple(weight.stride()), weight._version, tuple(perm), repr(sorted(desc.items())))

    def get(self, key: tuple):
        got = self._forms.get(key)
        self.hits += got is not None
        return got

    def put(self, key: tuple, data: torch.Tensor, weight: torch.Tensor) -> None:
        self._forms[key] = data
        self._plains[key] = weight

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self._forms.values())


class WeightStore:
    def __init__(self, shared: SharedForms | None = None):
        self.forms: dict[str, list[Packed]] = {}
        self.provided: dict[str, list[Packed]] = {}
        self.reorders = 0
        self.shared = shared
        self.buffers = HugeBuffers()      # new forms' bytes: in 2 MiB pages where the kernel gives them

    def drop_forms(self, counts: dict[str, int]) -> None:
        """Forget the forms made after each weight's first ``counts[name]`` (a binding's trial),
        the last made first, their bytes reused where they were the last ones cut."""
        for name in list(self.forms):
            keep = counts.get(name, 0)
            for p in reversed(self.forms[name][keep:]):
                self.buffers.give_back(p.data)
            if keep:
                del self.forms[name][keep:]
            else:
                del self.forms[name]

    def holds(self, name: str) -> bool:
        return name in self.forms or name in self.provided

    def provide(self, name: str, desc: dict, data: torch.Tensor, perm) -> None:
        """A stored form (an artifact's, checked): used as it is when a primitive wants ``desc``."""
        self.provided.setdefault(name, []).append(Packed(desc, data, perm))

    def release(self, name: str, weight: torch.Tensor) -> torch.Tensor:
        """The shape-only placeholder the graph keeps for ``weight`` (held here)."""
        ph = torch.empty_strided(tuple(weight.shape), tuple(weight.stride()), dtype=weight.dtype, device="meta")
        key = id(ph)
        _OWNERS[key] = (weakref.ref(ph, lambda _r: _OWNERS.pop(key, None)), self)
        return ph

    def form(self, name: str, weight: torch.Tensor, perm, operand_md: MemDesc, want: MemDesc,
             own: bool = False) -> torch.Tensor:
        """The bytes of weight ``name`` seen through ``perm`` in layout ``want`` (a tensor the
        caller keeps alive); ``weight`` is the plain tensor, or a placeholder. ``own``: the
        caller's node is the weight's only reader, so a weight already in layout ``want`` is
        copied into the store's 2 MiB pages too (where they exist and it is large), and the
        graph's plain tensor is then released like any packed weight's (held once)."""
        perm = tuple(perm)
        plain = weight.device.type != "meta"
        if plain and want == operand_md and not (own and self.buffers.takes(want.size)):
            return weight
        owner = None if plain else owner_of(weight)
        if owner is not None and owner is not self:          # a rebinding of a released graph
            for p in owner.forms.get(name, []) + owner.provided.get(name, []):
                if all(p is not q for q in self.provided.get(name, ())):
                    self.provided.setdefault(name, []).append(p)
        desc = want.describe()
        for p in self.forms.get(name, ()):
            if p.desc == desc and p.perm == perm:
                return p.data
        for p in self.provided.get(name, ()):
            if p.desc == desc and p.perm == perm and p.data.numel() == want.size:
                self.forms.setdefault(name, []).append(p)
                return p.data
        shared_key = SharedForms.key(weight, perm, desc) if plain and self.shared is not None else None
        if shared_key is not None and (data := self.shared.get(shared_key)) is not None:
            self.forms.setdefault(name, []).append(Packed(desc, data, perm))
            return data
        if plain:
            if not weight.is_contiguous():
                raise ValueError(f"weight {name!r} is not contiguous")
            src, src_md = weight, operand_md
        else:
            # in the form's type first: a reduced weight widened by ATen, not by a converting reorder
            # (AVX2's bfloat16 -> float32 blocked one is oneDNN's generic loop: RESULTS.md, AVX2 only)
            src = self.plain(name, weight, dtype=TORCH_OF.get(desc.get("dt"))).permute(perm).contiguous()
            src_md = MemDesc.of(_operand_dims(want), src.dtype)
        data = self.buffers.empty(want.size)
        reorder(src_md, src.data_ptr(), want, data.data_ptr())
        self.reorders += 1
        if shared_key is not None:
            self.shared.put(shared_key, data, weight)
        self.forms.setdefault(name, []).append(Packed(desc, data, perm))
        return data

    def plain(self, name: str, placeholder: torch.Tensor, dtype: torch.dtype | None = None) -> torch.Tensor:
        """Weight ``name`` read back from one of its forms as a plain contiguous tensor of the
        placeholder's shape, in ``dtype`` (default the placeholder's); ``ValueError`` when no
        form holds it (another element count or type)."""
        shape = tuple(placeholder.shape)
        owner = owner_of(placeholder)
        stores = [self] + ([owner] if owner is not None and owner is not self else [])
        # a reduced weight's form holds it as stored, or as float32 where a CPU computes it so
        # (``compute.py``: float16 always, bfloat16 without its arithmetic; the artifact may come
        # from either kind of machine)
        held = {placeholder.dtype, torch.float32} if placeholder.dtype in REDUCED else {placeholder.dtype}
        for store in stores:
            for p in store.forms.get(name, []) + store.provided.get(name, []):
                operand = unpack(p.desc, p.data)
                if len(p.perm) != len(shape) or sorted(p.perm) != list(range(len(shape))):
                    continue
                seen = tuple(shape[i] for i in p.perm)
                if operand.numel() != placeholder.numel() or operand.dtype not in held:
                    raise ValueError(f"the packed form of weight {name!r} holds {operand.dtype} "
                                     f"{tuple(operand.shape)}, not {placeholder.dtype} {shape}")
                inverse = [p.perm.index(i) for i in range(len(shape))]
                w = operand.reshape(seen).permute(inverse)
                return w.to(dtype or placeholder.dtype).contiguous()
        raise ValueError(f"no packed form of weight {name!r} is held here")

    def export(self, stored: dict[str, torch.dtype] | None = None) -> dict[str, list[tuple]]:
        """``{name: [(description, bytes, perm)]}`` of every packed form made or provided (a
        weight bound in its plain layout has none: the graph keeps it). A form holding a
        bfloat16 / float16 weight (``stored[name]``) widened to float32, for a CPU that computes
        it so (``compute.py``), is exported as the weight's operand in its own dtype and plain
        layout: the artifact keeps the reduced bytes, and a load packs them for its CPU."""
        out: dict[str, list] = {}
        for name in sorted(set(self.forms) | set(self.provided)):
            seen = []
            reduced = (stored or {}).get(name) in REDUCED
            for p in self.forms.get(name, []) + self.provided.get(name, []):
                if p.data.dtype != torch.uint8:
                    continue
                desc, data = p.desc, p.data
                if reduced and desc.get("dt") == DTYPES[torch.float32]:
                    desc, data = _narrowed(p, stored[name])
                if (desc, p.perm) not in seen:
                    seen.append((desc, p.perm))
                    out.setdefault(name, []).append((desc, data, p.perm))
        return out


def _narrowed(p: Packed, dtype: torch.dtype) -> tuple[dict, torch.Tensor]:
    """A float32 form of a ``dtype`` weight as its operand in ``dtype``, plain layout (exact:
    the float32 values were ``dtype`` values)."""
    dims = tuple(p.desc["dims"])
    operand = unpack(p.desc, p.data).reshape(dims).to(dtype).contiguous()
    return MemDesc.of(dims, dtype).describe(), operand.view(-1).view(torch.uint8)


def _operand_dims(md: MemDesc) -> tuple[int, ...]:
    return tuple(md.describe()["dims"])
