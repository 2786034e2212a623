"""Runs the model: loads it, and turns a scheduled batch into one forward over the KV buffers (read access only)."""

from __future__ import annotations

import logging

import torch

from sglpy.kernels.cpu_native import native_lib, native_status

from ..config import CPU_MAX_TOTAL_TOKENS, EngineConfig
from ..core import BatchEntry, ForwardOutput
from ..device_io import to_device
from ..memory.kv_manager import KVBuffers
from ..memory.kv_pool import KVPool, kv_cache_torch_dtype
from .cuda_graph import DecodeGraphRunner, DecodeInputs, capture_buckets, resolve_future_ids
from .extend_graph import MAX_BS as EXTEND_GRAPH_MAX_BS, ExtendGraphRunner
from .forward_batch import ForwardBatch, build_host_batch
from .families import check_feature, determinism_blocker, fit_quantization
from .loader import load_model
from .mm_batch import EncoderCache, build_mm_batch
from .parallel import TPGroup, TPGroupError
from .quantization import LayerPacker, quantize_model, resolve_quantization

logger = logging.getLogger(__name__)

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


class ModelRunner:
    """Owns the model; reads and writes K/V only through the buffers and slot ids each forward is given.

    With tp_size > 1 the runner of rank 0 (the engine process) starts this node's other ranks, joins the group
    and broadcasts every forward to them (model/tp_step.py); a worker rank builds its runner with `group`.
    """

    def __init__(self, cfg: EngineConfig, model_path: str, group: TPGroup | None = None):
        if cfg.device == "auto":
            self.device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        else:
            self.device = torch.device(cfg.device)
        self.dtype = _DTYPES[cfg.dtype]
        self.group, self.ranks, self.mirror = group, None, None
        if cfg.enable_deterministic_inference:
            refuse_nondeterministic(cfg, self.device)
        if cfg.tp_size > 1 and group is None:
            self._start_group(cfg, model_path)
        try:
            self._load(cfg, model_path)
            error = None
        except Exception as e:  # noqa: BLE001 - every rank reports before any raises, so none waits forever
            error = e
        if self.group is not None:
            self._check_ranks_agree(cfg, error)
        elif error is not None:
            raise error

    def _load(self, cfg: EngineConfig, model_path: str) -> None:
        if self.group is not None and self.group.device.type == "cuda":
            self.device = self.group.device
        # deterministic inference: one kernel path per row count and fixed attention blocks (docs/determinism.md);
        # the fused decode layer then runs its attention as one-token extends (the per-op path's kernel), and prompt
        # rows read a dense copy of the quantized weights in fixed tiles
        det = cfg.enable_deterministic_inference
        packer = None
        if self.group is None:  # each layer is packed as it loads (what runs: none, int8 or int4; auto judges the
            from transformers import AutoConfig  # first and last layers' weights)

            from .vlm import is_vision_config

            from .pack_cache import PackCache

            config = AutoConfig.from_pretrained(model_path)
            if not is_vision_config(config):
                mode = fit_quantization(config, cfg.quantization)
                cache = PackCache.open(model_path, mode, self.device, keep_dense=det)  # a GGUF's packing, on disk
                packer = LayerPacker(mode, self.device, keep_dense=det, cache=cache)
        self.model = load_model(model_path, self.dtype, self.device, self.group, packer, batch_invariant=det)
        if packer is not None:
            packer.finish()
        blocker = determinism_blocker(self.model.config, self.device.type)
        if cfg.enable_deterministic_inference and blocker is not None:
            raise ValueError(f"enable_deterministic_inference is not supported with {type(self.model).__name__}: "
                             f"{blocker}, outside the batch-invariant kernels "
                             "(docs/determinism.md); unset the flag for this model")
        streamed = packer is not None and packer.used
        if streamed:
            self.quantization = packer.mode or resolve_quantization("auto", self.device)
        else:  # tensor parallel (every rank packs its loaded shard), or a vision-language model loaded whole
            mode = fit_quantization(self.model.config, cfg.quantization)
            self.quantization = resolve_quantization(mode, self.device, self.model, self.group is not None)
        quantize_model(self.model, self.quantization, dense=det, skip_layers=streamed)
        self.lora = None  # runtime/lora/manager.LoraManager when LoRA adapters are served (wraps the projections)
        if cfg.lora_enabled:
            from ..lora.manager import LoraManager, pool_dtype

            dtype = pool_dtype(cfg.lora_dtype, self.dtype, self.device, self.quantization)
            self.lora = LoraManager(self.model, cfg.lora_paths or (), cfg.max_loras_per_batch, cfg.max_loaded_loras,
                                    cfg.max_lora_rank, cfg.lora_target_modules, cfg.lora_eviction_policy,
                                    self.device, dtype)
        self.model.prepare_native_decode()  # after the LoRA pool wrapped the projections: the fused layers read it
        # built (once per machine) or loaded here, not in the first request's forward; None off CPU (Triton runs)
        self.cpu_kernels = native_status() if self.device.type == "cpu" else None
        hf = self.model.config
        self.hf_config = hf
        self.vocab_size = hf.vocab_size
        self.max_context = cfg.max_context_len or int(getattr(hf, "max_position_embeddings", 4096))
        self.model.init_rope(self.max_context, self.device, torch.float32)
        # what a KV pool for this model needs: per-layer K/V of [slots, kv_heads, head_dim] (this rank's heads)
        self.num_layers, self.num_kv_heads, self.head_dim = hf.num_hidden_layers, self.model.num_kv_heads, \
            self.model.head_dim
        self.graphs: DecodeGraphRunner | None = None
        self.extend_graphs: ExtendGraphRunner | None = None  # multi-token steps (jump-forward, drafts)
        # vision models: encoder outputs by image hash; forwards with image tokens (or M-RoPE) run eagerly
        self.vision = hasattr(self.model, "vision")
        self.encoder_cache = EncoderCache(cfg.vision_cache_tokens) if self.vision else None

    def kv_dtype(self, kv_cache_dtype: str) -> torch.dtype:
        """The KV pool's storage dtype for this model (kv_pool.kv_cache_torch_dtype): 'auto' is bf16 for a quantized
        model on CPU whose native attention kernels read it, else the model dtype."""
        compact = self.device.type == "cpu" and self.quantization != "none" and native_lib() is not None
        return kv_cache_torch_dtype(kv_cache_dtype, self.dtype, compact)

    def _start_group(self, cfg: EngineConfig, model_path: str) -> None:
        """Rank 0: check the split, start this node's other ranks, and join the group."""
        from transformers import AutoConfig

        from .parallel import init_group, shard_shape
        from .tp_step import RowMirror
        from .tp_worker import LocalRanks, free_loopback_addr, rank_device, threads_per_rank

        config = AutoConfig.from_pretrained(model_path)
        check_feature(config, "tp", f"tensor parallelism (tp_size={cfg.tp_size})")  # before any spawn
        shard_shape(config, cfg.tp_size, 0)  # a bad split fails before any spawn
        if cfg.node_rank != 0:
            raise ValueError(f"the engine runs on node 0; node_rank {cfg.node_rank} only starts ranks (serve_node)")
        addr = cfg.dist_init_addr or free_loopback_addr()
        if not cfg.num_threads:
            torch.set_num_threads(threads_per_rank(cfg))
        self.ranks = LocalRanks(cfg, addr, model_path)
        try:
            self.group = init_group(0, cfg.tp_size, addr, cfg.dist_timeout, rank_device(cfg, 0))
        except BaseException:
            self.ranks.stop(0)
            raise
        self.mirror = RowMirror()

    def _check_ranks_agree(self, cfg: EngineConfig, error: Exception | None) -> None:
        """Every rank loaded the same model split with the same pool settings; else all raise, naming the difference."""
        facts = None if error is not None else {
            "model": (self.hf_config.num_hidden_layers, self.hf_config.hidden_size, self.vocab_size),
            "tp_size": cfg.tp_size, "dtype": cfg.dtype, "quantization": cfg.quantization,
            "kv_cache_dtype": cfg.kv_cache_dtype, "max_total_tokens": cfg.max_total_tokens,
            "max_running_requests": cfg.max_running_requests, "max_context": self.max_context}
        try:
            every = self.group.all_gather_object(facts if error is None else f"{type(error).__name__}: {error}")
        except Exception as e:  # noqa: BLE001
            self.fail()
            raise TPGroupError(f"tensor-parallel startup check failed: {e}") from e
        problem = next((f"rank {i} failed to load: {f}" for i, f in enumerate(every) if isinstance(f, str)), None)
        if problem is None:
            for i, f in enumerate(every):
                diff = sorted(k for k in f if f[k] != every[0][k])
                if diff:
                    problem = f"rank {i} differs from rank 0 in {diff}: {[f[k] for k in diff]} vs " \
                              f"{[every[0][k] for k in diff]} (start every node with the same flags)"
                    break
        if problem is not None:
            self.fail()
            if error is not None:
                raise error
            raise ValueError(problem)

    def init_decode_graphs(self, cfg: EngineConfig, kv: KVBuffers, padding: tuple[int, int]) -> None:
        """Set up the padded-bucket decode path (runtime/model/cuda_graph.py) per cfg.disable_cuda_graph.

        None (auto): captured on CUDA, off on CPU. False: captured on CUDA, eager padded buckets on CPU (tests).
        Capture needs the Triton kernels (the torch references sync with the host): without them, graphs are off.
        """
        cuda = self.device.type == "cuda"
        if cfg.disable_cuda_graph or (cfg.disable_cuda_graph is None and not cuda):
            return
        if getattr(self.model, "mrope", False):  # every decode row needs its request's M-RoPE offset
            if cfg.disable_cuda_graph is False:
                raise ValueError("CUDA graphs (disable_cuda_graph=False) are not supported with M-RoPE models "
                                 "(Qwen2-VL): decode positions depend on each request's images")
            logger.warning("CUDA graphs off for an M-RoPE model (Qwen2-VL); decode runs eagerly")
            return
        if self.lora is not None:  # a graph would replay the captured step's adapter segments
            logger.warning("CUDA graphs off with LoRA adapters; decode runs eagerly")
            return
        if cfg.disable_cuda_graph is False:  # asked for explicitly: a family that cannot is refused
            check_feature(self.hf_config, "cuda_graph", "CUDA graphs (disable_cuda_graph=False)", self.max_context)
        try:
            check_feature(self.hf_config, "cuda_graph", "CUDA graphs", self.max_context)
        except ValueError as e:
            logger.warning("%s; decode runs eagerly", e)
            return
        if self.group is not None:
            logger.warning("CUDA graphs off under tensor parallelism (the step is broadcast to the other ranks)")
            return
        capture = cuda
        if cuda:
            from sglpy.kernels._dispatch import triton_module

            if triton_module("decode_attention_triton", kv.req_to_token) is None:
                logger.warning("CUDA graphs off: the Triton kernels are disabled or unavailable")
                return
        buckets = capture_buckets(cfg.max_running_requests, cfg.cuda_graph_max_bs)
        self.graphs = DecodeGraphRunner(lambda fb: self.model(fb, kv), kv, padding, buckets, self.device, capture)
        if cfg.cuda_graph_extend_tokens > 1:
            small = capture_buckets(cfg.max_running_requests, min(cfg.cuda_graph_max_bs, EXTEND_GRAPH_MAX_BS))
            self.extend_graphs = ExtendGraphRunner(lambda fb: self.model(fb, kv), kv, padding, small,
                                                   cfg.cuda_graph_extend_tokens, self.device, capture)

    def forward(self, entries: list[BatchEntry], num_decode: int, kv: KVBuffers,
                future_tokens: torch.Tensor | None = None) -> ForwardOutput:
        """Run one forward over entries (decode entries first); slots must already be allocated.

        future_tokens: [k] int64 on the device, the previous step's sampled ids (overlap scheduling); an input
        id -1 - j stands for future_tokens[j], resolved on the device.
        """
        # drafted entries (speculative decoding) after the decode entries run as k + 1 decode rows each
        decode_rows = num_decode == len(entries) or all(e.draft for e in entries[num_decode:])
        images = self.vision and _reads_images(entries, self.model.mrope)
        if self.graphs is not None and decode_rows and not images and self.graphs.can_run(_num_rows(entries)) \
                and not any(e.req.wants_input_logprobs() for e in entries):
            return self._decode_graph(entries, future_tokens)
        hb = build_host_batch(entries, num_decode)
        if self.extend_graphs is not None and not images and self.extend_graphs.accepts(hb, num_decode):
            return ForwardOutput(self.extend_graphs.run(hb, future_tokens), hb.input_rows, hb.input_first_pos,
                                 hb.sample_row)
        ids, pos, loc, rows = hb.input_ids, hb.positions, hb.out_cache_loc, hb.logits_rows
        input_rows, input_first, sample_row = hb.input_rows, hb.input_first_pos, hb.sample_row
        if self.group is not None:
            return ForwardOutput(self._forward_tp(entries, num_decode, kv, ids, pos, loc, rows),
                                 input_rows, input_first, sample_row)
        dev = self.device
        as_long = lambda xs: to_device(xs, torch.int64, dev)  # noqa: E731 - no host wait on CUDA
        input_ids = as_long(ids)
        if ids and min(ids) < 0:
            input_ids = resolve_future_ids(input_ids, future_tokens)
        fb = ForwardBatch(
            input_ids=input_ids, positions=as_long(pos), out_cache_loc=as_long(loc), num_decode=hb.num_decode,
            req_pool_indices=as_long(hb.req_rows), prefix_lens=as_long(hb.prefix_lens),
            extend_lens=as_long(hb.extend_lens),
            seq_lens=as_long([a + b for a, b in zip(hb.prefix_lens, hb.extend_lens)]),
            req_to_token=kv.req_to_token, logits_indices=as_long(rows),
            max_extend_len=max(hb.extend_lens[hb.num_decode:], default=1),
            lora=None if self.lora is None else self.lora.pool.begin(_row_adapters(entries), dev),
            mm=build_mm_batch(self.model, self.encoder_cache, entries, pos, dev) if images else None,
        )
        if self.model.row_split is not None:  # deterministic inference: prompt rows and generated rows
            self.model.row_split.prepare(entries)
        logits = self.model(fb, kv)
        return ForwardOutput(logits, input_rows, input_first, sample_row)

    def _forward_tp(self, entries: list[BatchEntry], num_decode: int, kv: KVBuffers, ids: list[int],
                    pos: list[int], loc: list[int], rows: list[int]) -> torch.Tensor:
        """Rank 0: broadcast the step, run this rank's shard; any failure here breaks the group (TPGroupError)."""
        from .tp_step import StepMessage

        updates = []
        for e in entries:
            u = self.mirror.updates(e.req.row, e.req.slots, e.prefix_len + e.extend_len)
            if u is not None:
                updates.append(u)
        msg = StepMessage.forward(ids, pos, loc, [e.req.row for e in entries], [e.prefix_len for e in entries],
                                  [e.extend_len for e in entries], num_decode, rows, updates)
        try:
            msg.send(self.group)
            return self.model(msg.batch(kv.req_to_token, self.device), kv)  # logits: [m, vocab]
        except Exception as e:
            self.fail()
            raise TPGroupError(f"tensor-parallel forward failed: {type(e).__name__}: {e}") from e

    def ranks_alive(self) -> str | None:
        """Why a local tensor-parallel rank is gone, or None (always None for tp_size 1)."""
        return self.ranks.dead() if self.ranks is not None else None

    def rank_pids(self) -> list[int]:
        """Process ids of this node's other tensor-parallel ranks (empty for tp_size 1)."""
        return [p.pid for _, p in self.ranks.procs] if self.ranks is not None else []

    def fail(self) -> None:
        """The group is broken: end this node's other ranks and leave it (no collective is attempted)."""
        if self.ranks is not None:
            self.ranks.stop(0)
        if self.group is not None:
            self.group.destroy()
            self.group = None

    def close(self) -> None:
        """Stop the other ranks (STOP message) and leave the group; a no-op for tp_size 1."""
        if self.group is None:
            return
        if self.group.rank == 0:
            from .tp_step import StepMessage

            try:
                StepMessage.stop().send(self.group)
            except Exception:  # noqa: BLE001 - a broken group: the ranks end on their own
                pass
        if self.ranks is not None:
            self.ranks.stop(10.0)
            self.ranks = None  # stopped on purpose: no longer a reason to report the engine dead
        self.group.destroy()
        self.group = None

    def _decode_graph(self, entries: list[BatchEntry], future_tokens: torch.Tensor | None) -> ForwardOutput:
        """A decode-only step through the padded buckets (one new token per request, every row sampled; a drafted
        entry is k + 1 rows of its request, as in build_host_batch)."""
        if not any(e.draft for e in entries):
            reqs = [e.req for e in entries]
            inp = DecodeInputs(input_ids=[_token_at(r, e.prefix_len) for r, e in zip(reqs, entries)],
                               positions=[e.prefix_len for e in entries],
                               out_cache_loc=[r.slots[e.prefix_len] for r, e in zip(reqs, entries)],
                               req_pool_indices=[r.row for r in reqs], seq_lens=[e.prefix_len + 1 for e in entries])
            sample_row = list(range(len(entries)))
        else:
            inp, sample_row = DecodeInputs([], [], [], [], []), []
            for e in entries:
                r, p, n = e.req, e.prefix_len, 1 + len(e.draft)
                sample_row.append(len(inp.input_ids))
                inp.input_ids.extend([_token_at(r, p), *e.draft])
                inp.positions.extend(range(p, p + n))
                inp.out_cache_loc.extend(r.slots[p:p + n])
                inp.req_pool_indices.extend([r.row] * n)
                inp.seq_lens.extend(range(p + 1, p + n + 1))
        logits = self.graphs.run(inp, future_tokens)  # [rows, vocab]
        n = len(entries)
        return ForwardOutput(logits, [range(0)] * n, [1] * n, sample_row)


def refuse_nondeterministic(cfg: EngineConfig, device: torch.device) -> None:
    """ValueError naming why enable_deterministic_inference cannot hold here (docs/determinism.md)."""
    if device.type == "cuda":
        from sglpy.kernels._dispatch import triton_module

        if triton_module("extend_attention_triton", torch.empty(0, device=device)) is None:
            raise ValueError("enable_deterministic_inference on CUDA needs the Triton kernels (the torch references' "
                             "attention blocks depend on the batch); they are disabled or unavailable here")
        if cfg.dtype == "float32":
            raise ValueError("enable_deterministic_inference on CUDA holds in bfloat16 and float16, not in float32 "
                             "(on an H100, 2 of 6 seeded requests sampled differently batched than alone); pass "
                             "dtype='bfloat16' or run on CPU")
    if cfg.tp_size > 1:
        raise ValueError(f"enable_deterministic_inference is not supported with tensor parallelism "
                         f"(tp_size={cfg.tp_size}): the all-reduce order is not fixed; unset one of them")
    status = native_status() if device.type == "cpu" else "native"
    if not status.startswith("native"):
        raise ValueError("enable_deterministic_inference needs the native CPU kernels (the torch fallback's "
                         f"attention blocks depend on the prompt and prefix lengths); here: {status}")


def kv_buffers_for(runner: ModelRunner, cfg: EngineConfig) -> KVBuffers:
    """A worker rank's own KV pool (its heads) and its mirror of rank 0's request-to-token table."""
    pool = KVPool(runner.num_layers, cfg.max_total_tokens or CPU_MAX_TOTAL_TOKENS, runner.num_kv_heads, runner.head_dim,
                  runner.kv_dtype(cfg.kv_cache_dtype), runner.device)
    mirror = torch.zeros(cfg.max_running_requests, runner.max_context, dtype=torch.int32, device=runner.device)
    return KVBuffers(pool.k_buffer, pool.v_buffer, mirror)


def _reads_images(entries: list[BatchEntry], mrope: bool) -> bool:
    """True when this forward computes image tokens, or (M-RoPE) holds a request with images at all."""
    return any(e.req.mm is not None and (mrope or e.prefix_len < e.req.mm.images[-1].end) for e in entries)


def _num_rows(entries: list[BatchEntry]) -> int:
    """Decode rows of a decode-only step (a drafted entry has k + 1)."""
    return sum(1 + len(e.draft) for e in entries)


def _row_adapters(entries: list[BatchEntry]) -> list:
    """The adapter of each token row of the forward (None: the base), in build_host_batch's row order."""
    rows = []
    for e in entries:
        rows.extend([e.req.lora] * (1 + len(e.draft) if e.draft else e.extend_len))
    return rows


def _token_at(req, pos: int) -> int:
    """all_ids[pos] without building all_ids."""
    n = len(req.input_ids)
    return req.input_ids[pos] if pos < n else req.output_ids[pos - n]
