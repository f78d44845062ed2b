"""Where each HF state-dict entry lives once FSDP1 has wrapped the model.

FSDP1 flattens each unit's parameters into one sharded FlatParameter and renames modules
(`_fsdp_wrapped_module.`), so HF names and full shapes are recorded before wrapping, together with
the module object that owns each entry (wrapping keeps those objects; with `use_orig_params=True`
their attributes show the full tensors while the owning unit is summoned).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP


@dataclass
class Entry:
    name: str
    """The key in the HF model's state_dict()."""
    module: torch.nn.Module
    attr: str
    dtype: torch.dtype
    shape: tuple[int, ...]
    is_param: bool


class UnitLayout:
    """The HF state dict in its own order, cut into consecutive runs that one FSDP unit owns."""

    def __init__(self, model: torch.nn.Module, blocks: list[torch.nn.Module]):
        """Call on the unwrapped model; `blocks` are the modules that become FSDP units of their own
        and are gathered whole (with any units nested in them); the root unit owns the rest."""
        block_of = {id(m): b for b in blocks for m in b.modules()}
        params = dict(model.named_parameters(remove_duplicate=False))
        self.entries: list[Entry] = []
        self._owners: list[torch.nn.Module | None] = []  # the block, None for the root unit
        for name, tensor in model.state_dict().items():
            path, _, attr = name.rpartition(".")
            module = model.get_submodule(path)
            shape = tuple(tensor.shape)
            self.entries.append(Entry(name, module, attr, tensor.dtype, shape, name in params))
            self._owners.append(block_of.get(id(module)))

    def runs(self, root: FSDP) -> list[tuple[FSDP, list[Entry]]]:
        """(FSDP unit, its entries) for each maximal run of consecutive entries of one unit, in
        state-dict order (the root appears twice for Llama: embeddings first, norm and LM head last)."""
        unit_of = {id(u.module): u for u in FSDP.fsdp_modules(root)}
        out: list[tuple[FSDP, list[Entry]]] = []
        for entry, owner in zip(self.entries, self._owners, strict=True):
            unit = root if owner is None else unit_of[id(owner)]
            if out and out[-1][0] is unit:
                out[-1][1].append(entry)
            else:
                out.append((unit, [entry]))
        # FSDP1 initialises lazily from the first unit summoned, which must therefore be the root
        assert out[0][0] is root, "the first state-dict entry must belong to the root FSDP unit"
        return out
