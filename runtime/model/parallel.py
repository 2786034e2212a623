"""Tensor parallelism of our model: the rank group (torch.distributed), weight sharding at load, parallel layers.

Layout for tp_size T, rank r (Megatron style, as SGLang does it):
* q/k/v and gate/up are column-parallel: rank r holds heads [r*H/T, (r+1)*H/T) and its slice of the
  intermediate dimension; o_proj and down_proj are row-parallel (the matching input columns), followed by one
  all_reduce each. A row-parallel bias is kept by rank 0 alone (zeros elsewhere), so the sum adds it once.
* KV heads are split like the q heads; with fewer KV heads than ranks each rank holds the one KV head its
  q heads read (replicated across the ranks that share it). Each rank's KV pool holds its own heads only.
* The embedding is replicated (a lookup needs no collective, and the numbers are those of tp=1); the lm_head
  is vocab-parallel: rank r computes logits for its vocabulary slice (a view of the embedding when tied)
  and rank 0 gathers them. Slices are padded with zero rows when the vocabulary does not divide by T.
"""

from __future__ import annotations

import datetime
import pickle
from dataclasses import dataclass, field

import torch
from torch import nn
import torch.distributed as dist


class TPGroupError(RuntimeError):
    """A tensor-parallel collective failed (a rank died, hung past dist_timeout, or the group is broken)."""


@dataclass(frozen=True)
class ShardShape:
    """Per-rank sizes of one model under tensor parallelism."""

    heads: int  # q heads per rank
    kv_heads: int  # KV heads per rank
    kv_start: int  # first global KV head of this rank
    intermediate: int  # MLP intermediate size per rank
    vocab: int  # lm_head rows per rank (padded)
    expert_intermediate: int = 0  # each expert's intermediate size per rank (mixtures of experts)
    # the group whose all-reduce sums a block's partial outputs (a mixture of experts reduces its own: moe.py)
    group: TPGroup | None = field(default=None, compare=False, repr=False)


def shard_shape(config, size: int, rank: int, group: TPGroup | None = None) -> ShardShape:
    """Sizes of rank `rank` of `size` (and the group the model's blocks reduce over, when built for it); ValueError
    names the numbers that do not divide."""
    heads = config.num_attention_heads
    kv = getattr(config, "num_key_value_heads", None) or heads
    inter = config.intermediate_size
    if heads % size:
        raise ValueError(f"num_attention_heads ({heads}) is not divisible by tp_size ({size})")
    if kv % size and size % kv:
        raise ValueError(f"num_key_value_heads ({kv}) and tp_size ({size}): one must divide the other")
    if inter % size:
        raise ValueError(f"intermediate_size ({inter}) is not divisible by tp_size ({size})")
    experts = getattr(config, "num_local_experts", None) or getattr(config, "num_experts", None)
    expert_inter = (getattr(config, "moe_intermediate_size", None) or inter) if experts else 0
    if expert_inter % size:
        raise ValueError(f"moe_intermediate_size ({expert_inter}) is not divisible by tp_size ({size})")
    h_local = heads // size
    per_kv = heads // kv  # q heads per KV head
    return ShardShape(h_local, max(kv // size, 1), (rank * h_local) // per_kv, inter // size,
                      -(-config.vocab_size // size), expert_inter // size, group)


@dataclass
class TPGroup:
    """This process's place in the tensor-parallel group: compute collectives and the step-message channel.

    Process-group objects of its own (no torch.distributed default group), so a process may hold several.
    """

    rank: int
    size: int
    device: torch.device
    compute: object  # gloo (CPU) or NCCL (CUDA) group; a collective waits at most dist_timeout
    control: object  # gloo group for step messages (always CPU), no deadline: workers wait there between steps
    store: object  # the TCPStore the groups met through (rank 0 hosts it)

    def all_reduce(self, t: torch.Tensor) -> None:
        """Sum `t` over the ranks, in place."""
        self.compute.allreduce([t]).wait()

    def gather_first(self, t: torch.Tensor) -> list[torch.Tensor] | None:
        """Rank 0 gets every rank's `t` (same shape everywhere); others get None."""
        opts = dist.GatherOptions()
        opts.rootRank = 0
        parts = [torch.empty_like(t) for _ in range(self.size)] if self.rank == 0 else None
        self.compute.gather([parts] if parts is not None else [], [t], opts).wait()
        return parts

    def broadcast(self, t: torch.Tensor) -> None:
        """Rank 0's CPU tensor `t` to every rank (in place), over the control group."""
        opts = dist.BroadcastOptions()
        opts.rootRank = 0
        self.control.broadcast([t], opts).wait()

    def all_gather_object(self, obj) -> list:
        """Every rank's picklable `obj` (startup checks only)."""
        data = torch.frombuffer(bytearray(pickle.dumps(obj)), dtype=torch.uint8)
        sizes = [torch.zeros(1, dtype=torch.int64) for _ in range(self.size)]
        self.control.allgather([sizes], [torch.tensor([data.numel()])]).wait()
        n = int(max(s.item() for s in sizes))
        padded = torch.cat([data, data.new_zeros(n - data.numel())])
        parts = [torch.empty(n, dtype=torch.uint8) for _ in range(self.size)]
        self.control.allgather([parts], [padded]).wait()
        return [pickle.loads(p[:int(s.item())].numpy().tobytes()) for p, s in zip(parts, sizes)]

    def destroy(self) -> None:
        """Leave the group: drop the process groups and the store (their sockets close; peers see the end)."""
        for name in ("compute", "control"):
            pg = getattr(self, name)
            try:
                if hasattr(pg, "shutdown"):
                    pg.shutdown()
            except Exception:  # noqa: BLE001 - tearing down after a failure
                pass
        self.compute = self.control = self.store = None


def init_group(rank: int, size: int, addr: str, timeout_s: float, device: torch.device) -> TPGroup:
    """Join the tensor-parallel group at tcp://addr (rank 0 hosts the rendezvous): NCCL on CUDA, else gloo."""
    host, _, port = addr.rpartition(":")
    timeout = datetime.timedelta(seconds=timeout_s)
    try:
        store = dist.TCPStore(host, int(port), size, rank == 0, timeout=timeout)
        if device.type == "cuda":  # written for NCCL but untested: no multi-GPU machine here (docs/runtime.md)
            torch.cuda.set_device(device)
            opts = dist.ProcessGroupNCCL.Options()
            opts._timeout = timeout
            compute = dist.ProcessGroupNCCL(dist.PrefixStore("compute/", store), rank, size, opts)
        else:
            compute = dist.ProcessGroupGloo(dist.PrefixStore("compute/", store), rank, size, timeout)
        control = dist.ProcessGroupGloo(dist.PrefixStore("control/", store), rank, size,
                                        datetime.timedelta(days=365))
    except Exception as e:  # noqa: BLE001 - a rendezvous timeout or a refused connection
        raise TPGroupError(f"tensor-parallel rendezvous at {addr} failed for rank {rank} of {size}: {e}") from e
    return TPGroup(rank, size, device, compute, control, store)


class RowParallel(nn.Module):
    """A row-parallel projection: this rank's input columns, then the all_reduce that sums the ranks' parts."""

    def __init__(self, linear: nn.Module, group: TPGroup):
        super().__init__()
        self.linear, self.group = linear, group

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.linear(x)  # [tokens, hidden]: this rank's partial sum
        self.group.all_reduce(y)
        return y


class ShardHead(nn.Module):
    """Logits of one vocabulary slice: x @ weight.T (weight may be a view of the tied embedding)."""

    def __init__(self, weight: torch.Tensor):
        super().__init__()
        self.weight = weight  # [vocab slice, hidden]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x @ self.weight.t()


class VocabParallelHead(nn.Module):
    """Vocab-parallel lm_head: each rank's slice of the logits, gathered on rank 0 ([m, vocab]; others: [m, 0])."""

    def __init__(self, inner: nn.Module, group: TPGroup, vocab_size: int):
        super().__init__()
        self.inner, self.group, self.vocab_size = inner, group, vocab_size

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        part = self.inner(x).float().contiguous()  # [m, vocab slice]
        parts = self.group.gather_first(part)
        if parts is None:
            return part[:, :0]
        return torch.cat(parts, dim=1)[:, :self.vocab_size]


def _rows(t: torch.Tensor, start: int, n: int) -> torch.Tensor:
    """Rows start..start+n of t (dim 0), zero-padded past its end, as a new tensor."""
    out = t[start:start + n]
    if out.shape[0] < n:
        out = torch.cat([out, out.new_zeros((n - out.shape[0],) + tuple(t.shape[1:]))])
    return out.clone()


def shard_state(state: dict[str, torch.Tensor], config, group: TPGroup) -> dict[str, torch.Tensor]:
    """This rank's slice of every HF-named weight (replicated ones unchanged)."""
    s = shard_shape(config, group.size, group.rank)
    hd = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    r = group.rank
    out = {}
    for name, w in state.items():
        if name.endswith(("q_proj.weight", "q_proj.bias")):
            w = _rows(w, r * s.heads * hd, s.heads * hd)
        elif name.endswith(("k_proj.weight", "k_proj.bias", "v_proj.weight", "v_proj.bias")):
            w = _rows(w, s.kv_start * hd, s.kv_heads * hd)
        elif name.endswith("o_proj.weight"):
            w = w[:, r * s.heads * hd:(r + 1) * s.heads * hd].clone()
        elif name.endswith(("o_proj.bias", "down_proj.bias")):
            w = w.clone() if r == 0 else torch.zeros_like(w)  # added once by the all_reduce
        elif ".experts." in name and name.endswith(("gate_proj.weight", "up_proj.weight")):  # each expert's slice
            w = _rows(w, r * s.expert_intermediate, s.expert_intermediate)
        elif ".experts." in name and name.endswith("down_proj.weight"):
            w = w[:, r * s.expert_intermediate:(r + 1) * s.expert_intermediate].clone()
        elif name.endswith(("gate_proj.weight", "up_proj.weight")):
            w = _rows(w, r * s.intermediate, s.intermediate)
        elif name.endswith("down_proj.weight"):
            w = w[:, r * s.intermediate:(r + 1) * s.intermediate].clone()
        elif name == "lm_head.weight":
            w = _rows(w, r * s.vocab, s.vocab)
        out[name] = w
    return out


def parallelize(model: nn.Module, group: TPGroup) -> None:
    """Wrap a loaded, fused shard: row-parallel o/down projections and the vocab-parallel lm_head."""
    for layer in model.model.layers:
        layer.self_attn.o_proj = RowParallel(layer.self_attn.o_proj, group)
        if hasattr(layer.mlp, "down_proj"):  # a mixture of experts sums its experts' slices itself (its shard's group)
            layer.mlp.down_proj = RowParallel(layer.mlp.down_proj, group)
    s = shard_shape(model.config, group.size, group.rank)
    if model.tie_word_embeddings:  # a view of this rank's embedding rows (a copy only when padded)
        inner = ShardHead(_rows(model.model.embed_tokens.weight, group.rank * s.vocab, s.vocab)
                          if (group.rank + 1) * s.vocab > model.config.vocab_size
                          else model.model.embed_tokens.weight[group.rank * s.vocab:(group.rank + 1) * s.vocab])
    else:
        inner = model.lm_head
    model.set_lm_head(VocabParallelHead(inner, group, model.config.vocab_size))
