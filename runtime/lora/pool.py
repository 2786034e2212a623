"""The adapter memory pool beside the model: per decoder layer and fused projection, A [slots, slices * R, in] and
B transposed, Bt [slots, R, out], on the model's device (kernels/lora.py's layout); adapters are copied into slots when a batch needs them (lru or fifo
eviction of slots the batch does not use), and each projection is wrapped in a LoraLinear that adds its rows' deltas.

The runner sets LoraStep.segments before every forward (None: no row uses an adapter, the base path runs as is).
The fused CPU decode layers read the same pools (runtime/model/native_decode.py:build_lora_structs).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import torch
from torch import nn

from sglpy.kernels.lora import LoraSegments, group_rows, lora_delta_unchecked

from .adapter import BaseShapes, LoraAdapter

# fused projection -> (parent module, the HF modules its output slices stand for, in order)
PROJECTIONS = {
    "qkv_proj": ("self_attn", ("q_proj", "k_proj", "v_proj")),
    "o_proj": ("self_attn", ("o_proj",)),
    "gate_up_proj": ("mlp", ("gate_proj", "up_proj")),
    "down_proj": ("mlp", ("down_proj",)),
}
EVICTION_POLICIES = ("lru", "fifo")


class LoraStep:
    """The current forward's adapter segments, shared by the model's LoraLinear layers (set once per forward)."""

    segments: LoraSegments | None = None


class LoraLinear(nn.Module):
    """A projection plus the LoRA deltas of the rows that use an adapter (none: the base layer's output as is)."""

    def __init__(self, base: nn.Module, a: torch.Tensor, bt: torch.Tensor, offsets: tuple[int, ...], step: LoraStep):
        super().__init__()
        self.base, self.a, self.bt, self.offsets, self.step = base, a, bt, offsets, step
        self.in_features, self.out_features = base.in_features, base.out_features

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.base.forward(x)  # x: [t, in] -> y: [t, out]
        seg = self.step.segments
        if seg is not None:
            lora_delta_unchecked(x.contiguous(), y, self.a, self.bt, self.offsets, seg)
        return y


def base_shapes(model: nn.Module) -> BaseShapes:
    """The (in, out) features of each adaptable HF module of our (fused) model."""
    layer = model.model.layers[0]
    attn, hidden = layer.self_attn, model.config.hidden_size
    q, kv = attn.num_heads * attn.head_dim, attn.num_kv_heads * attn.head_dim
    modules = {"q_proj": (hidden, q), "k_proj": (hidden, kv), "v_proj": (hidden, kv), "o_proj": (q, hidden)}
    gate_up = getattr(layer.mlp, "gate_up_proj", None)
    if gate_up is not None:  # a mixture of experts has none
        inter = gate_up.out_features // 2
        modules.update(gate_proj=(hidden, inter), up_proj=(hidden, inter), down_proj=(inter, hidden))
    return BaseShapes(len(model.model.layers), modules)


@dataclass
class _Slot:
    uid: int = 0  # adapter in the slot (0: empty)
    rank: int = 0
    loaded_at: int = 0
    used_at: int = 0


class LoraPool:
    """Slots for max_loras_per_batch adapters of rank <= max_rank over `targets`, wrapped into `model`."""

    def __init__(self, model: nn.Module, slots: int, max_rank: int, targets: frozenset[str], policy: str,
                 device: torch.device, dtype: torch.dtype):
        if policy not in EVICTION_POLICIES:
            raise ValueError(f"lora_eviction_policy must be one of {EVICTION_POLICIES}, got {policy!r}")
        self.shapes = base_shapes(model)
        missing = sorted(set(targets) - set(self.shapes.modules))
        if missing:
            raise ValueError(f"lora_target_modules {missing} are not in this model (it has "
                             f"{sorted(self.shapes.modules)})")
        self.max_rank, self.targets, self.policy = max_rank, frozenset(targets), policy
        self.step = LoraStep()
        self.slots = [_Slot() for _ in range(slots)]
        self._clock = itertools.count(1)
        self.buffers: list[tuple[int, tuple[str, ...], torch.Tensor, torch.Tensor, tuple[int, ...]]] = []
        self.nbytes = 0
        for i, layer in enumerate(model.model.layers):
            for proj, (parent_name, names) in PROJECTIONS.items():
                if not self.targets & set(names):
                    continue
                parent = getattr(layer, parent_name)
                n_in = self.shapes.modules[names[0]][0]
                outs = [self.shapes.modules[n][1] for n in names]
                offsets = tuple(itertools.accumulate(outs, initial=0))
                a = torch.zeros(slots, len(names) * max_rank, n_in, device=device, dtype=dtype)
                bt = torch.zeros(slots, max_rank, offsets[-1], device=device, dtype=dtype)
                setattr(parent, proj, LoraLinear(getattr(parent, proj), a, bt, offsets, self.step))
                self.buffers.append((i, names, a, bt, offsets))
                self.nbytes += (a.numel() + bt.numel()) * a.element_size()

    def fits(self, adapter: LoraAdapter) -> None:
        """ValueError naming why `adapter` cannot take a slot (rank or target modules beyond the pool's)."""
        if adapter.rank > self.max_rank:
            raise ValueError(f"LoRA adapter {adapter.name!r} has rank {adapter.rank}, above max_lora_rank "
                             f"{self.max_rank} (start the server with a larger --max-lora-rank)")
        extra = sorted(adapter.target_modules - self.targets)
        if extra:
            raise ValueError(f"LoRA adapter {adapter.name!r} targets {extra}, outside lora_target_modules "
                             f"{sorted(self.targets)} (start the server with them in --lora-target-modules)")

    def _fill(self, slot: int, adapter: LoraAdapter) -> None:
        r_max = self.max_rank
        with torch.no_grad():
            for layer, names, a, bt, offsets in self.buffers:
                a[slot].zero_()
                bt[slot].zero_()
                for s, name in enumerate(names):
                    w = adapter.weights.get((layer, name))
                    if w is None:
                        continue
                    wa, wb = w
                    r = wa.shape[0]
                    a[slot, s * r_max:s * r_max + r].copy_(wa)
                    bt[slot, :r, offsets[s]:offsets[s + 1]].copy_(wb.t())
        self.slots[slot] = _Slot(adapter.uid, adapter.rank, next(self._clock), 0)

    def assign(self, adapters: list[LoraAdapter]) -> dict[int, int]:
        """Slot of each adapter (by uid), copying in the missing ones over slots this batch does not use."""
        want = {a.uid: a for a in adapters}
        if len(want) > len(self.slots):
            raise ValueError(f"a batch uses {len(want)} LoRA adapters, above max_loras_per_batch {len(self.slots)}")
        where = {s.uid: i for i, s in enumerate(self.slots) if s.uid}
        now = next(self._clock)
        for uid, adapter in want.items():
            if uid in where:
                continue
            free = [i for i, s in enumerate(self.slots) if s.uid not in want]
            key = (lambda i: self.slots[i].used_at) if self.policy == "lru" else (lambda i: self.slots[i].loaded_at)
            slot = min(free, key=lambda i: (self.slots[i].uid != 0, key(i)))  # an empty slot first
            where.pop(self.slots[slot].uid, None)
            self._fill(slot, adapter)
            where[uid] = slot
        for uid in want:
            self.slots[where[uid]].used_at = now
        return {uid: where[uid] for uid in want}

    def begin(self, row_adapters: list[LoraAdapter | None], device: torch.device) -> LoraSegments | None:
        """Set the segments of a forward whose token row i uses row_adapters[i] (None: the base); returns them."""
        used = [a for a in row_adapters if a is not None]
        if not used:
            self.step.segments = None
            return None
        slot_of = self.assign(used)
        row_slots = [-1 if a is None else slot_of[a.uid] for a in row_adapters]
        ranks = {slot_of[a.uid]: a.rank for a in used}
        self.step.segments = group_rows(row_slots, ranks, device)
        return self.step.segments

    def drop(self, uid: int) -> None:
        """Forget an unloaded adapter's slot (its weights are simply overwritten later)."""
        for i, s in enumerate(self.slots):
            if s.uid == uid:
                self.slots[i] = _Slot()
