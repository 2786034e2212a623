"""Prometheus metrics of the server, named like SGLang's `sglang:*` so existing dashboards work."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client import CONTENT_TYPE_LATEST  # noqa: F401 - re-exported for the /metrics route

_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)
_ITL_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 1.0, 2.5)


class ServerMetrics:
    """One registry per server (tests may run several servers in one process)."""

    def __init__(self, model_name: str):
        self.registry = CollectorRegistry()
        self.model_name = model_name  # the label value of every metric
        lab = ["model_name"]
        r = self.registry

        def counter(name, doc):
            return Counter(name, doc, lab, registry=r).labels(model_name)

        def gauge(name, doc):
            return Gauge(name, doc, lab, registry=r).labels(model_name)

        def hist(name, doc, buckets):
            return Histogram(name, doc, lab, buckets=buckets, registry=r).labels(model_name)

        self.num_requests = counter("sglang:num_requests", "Finished generation requests")
        self.num_aborted = counter("sglang:num_aborted_requests", "Requests aborted (client gone, abort, shutdown)")
        self.num_errors = counter("sglang:num_error_requests", "Requests answered with an error")
        self.num_rejected = counter("sglang:num_rejected_requests", "Requests refused with 503 (queue full)")
        self.num_so_requests = counter("sglang:num_so_requests", "Structured-output (constrained) requests")
        self.prompt_tokens = counter("sglang:prompt_tokens", "Prompt tokens of finished requests")
        self.generation_tokens = counter("sglang:generation_tokens", "Generated tokens of finished requests")
        self.cached_tokens = counter("sglang:cached_tokens", "Prompt tokens served from the prefix cache")
        self.ttft = hist("sglang:time_to_first_token_seconds", "Time to first token", _LATENCY_BUCKETS)
        self.itl = hist("sglang:inter_token_latency_seconds", "Time between output tokens", _ITL_BUCKETS)
        self.e2e = hist("sglang:e2e_request_latency_seconds", "Request latency, arrival to finish",
                        _LATENCY_BUCKETS)
        self.num_running = gauge("sglang:num_running_reqs", "Requests in the running batch")
        self.num_queue = gauge("sglang:num_queue_reqs", "Requests waiting in the engine queue")
        self.num_inflight = gauge("sglang:num_inflight_reqs", "Requests admitted by the server, not finished")
        self.num_used_tokens = gauge("sglang:num_used_tokens", "KV slots held by running requests")
        self.token_usage = gauge("sglang:token_usage", "Fraction of KV slots in use (running requests)")
        self.max_total_tokens = gauge("sglang:max_total_num_tokens", "KV pool size in tokens")
        self.cache_hit_rate = gauge("sglang:cache_hit_rate", "Prefix-cache hit rate (cached / prompt tokens)")
        self.engine_up = gauge("sglang:engine_up", "1 while the engine process is alive")
        # no SGLang equivalent (its server exits with the scheduler): sglpy-named
        self.engine_restarts = counter("sglpy:engine_restarts", "Engine processes started again after one died")
        self.engine_stalled = gauge("sglpy:engine_stalled", "1 while /health reports the step loop stalled")

    def record_finished(self, meta: dict, aborted: bool, constrained: bool) -> None:
        """Count one finished generation from its final meta_info."""
        self.num_requests.inc()
        if aborted:
            self.num_aborted.inc()
        if constrained:
            self.num_so_requests.inc()
        self.prompt_tokens.inc(int(meta.get("prompt_tokens") or 0))
        self.generation_tokens.inc(int(meta.get("completion_tokens") or 0))
        self.cached_tokens.inc(int(meta.get("cached_tokens") or 0))

    def update_engine_gauges(self, stats: "PoolStats", inflight: int, alive: bool) -> None:
        """Refresh the gauges from the engine's pool statistics (read at scrape time)."""
        self.num_inflight.set(inflight)
        self.engine_up.set(1 if alive else 0)
        if stats is None:
            return
        self.num_running.set(stats.num_running)
        self.num_queue.set(stats.num_waiting)
        self.num_used_tokens.set(stats.used_tokens)
        self.max_total_tokens.set(stats.total_tokens)
        self.token_usage.set(stats.used_tokens / stats.total_tokens if stats.total_tokens else 0.0)
        self.cache_hit_rate.set(stats.cache_hit_rate)

    def render(self) -> bytes:
        """The Prometheus text exposition of this registry."""
        return generate_latest(self.registry)


class PoolStats:
    """KV pool and scheduler numbers from Engine.get_server_info() (missing keys read as 0)."""

    def __init__(self, info: dict):
        def num(name, default=0):
            v = info.get(name, default)
            return v if isinstance(v, (int, float)) and not isinstance(v, bool) else default

        self.total_tokens = int(num("max_total_num_tokens"))
        self.used_tokens = int(num("kv_used"))  # held by running requests (not reclaimable)
        self.cached_tokens = int(num("kv_evictable"))  # prefix cache, reclaimable
        self.free_tokens = int(num("kv_free", self.total_tokens - self.used_tokens - self.cached_tokens))
        self.num_running = int(num("num_running_reqs"))
        self.num_waiting = int(num("num_waiting_reqs"))
        prompt, cached = num("prompt_tokens"), num("cached_tokens")  # cumulative engine counters
        self.cache_hit_rate = float(cached) / prompt if prompt else 0.0
