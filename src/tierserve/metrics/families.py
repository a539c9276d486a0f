"""The metric families a server exports, created in one registry per server (no globals).

Two sets, fed by the same events:

* ``llm_*``: tierserve's series, labelled by priority class (and partition, tenant, ...);
* ``vllm:*``: the standard series of vLLM's V1 engine under their vLLM names and labels
  (``model_name``, ``engine``), so dashboards and alerts built for vLLM work unchanged.

Every family carries ``model_name`` first; ``Bound`` fills it in so callers pass only the rest.
"""

from __future__ import annotations

from prometheus_client import (
    GC_COLLECTOR,
    PLATFORM_COLLECTOR,
    PROCESS_COLLECTOR,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
)
from prometheus_client.gc_collector import GCCollector
from prometheus_client.platform_collector import PlatformCollector
from prometheus_client.process_collector import ProcessCollector

LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60, 120, 300)
TOKEN_LATENCY_BUCKETS = (
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5,
    5.0, 10.0,
)  # fmt: skip
STEP_BUCKETS = (1e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 0.01, 0.05, 0.1, 0.5)
TOKEN_COUNT_BUCKETS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000, 20000)
ITERATION_BUCKETS = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)
PARTITIONS = ("floor", "reserve", "shared")
_UNUSED = (GC_COLLECTOR, PLATFORM_COLLECTOR, PROCESS_COLLECTOR)  # the global ones: not ours


class Bound:
    """A labelled family with ``model_name`` (and, for vllm series, ``engine``) fixed."""

    def __init__(self, family, *fixed: str) -> None:
        self.family, self.fixed = family, fixed

    def labels(self, *values: str):
        return self.family.labels(*self.fixed, *values)


class Families:
    def __init__(self, model_name: str) -> None:
        self.registry = r = CollectorRegistry()
        ProcessCollector(registry=r)
        PlatformCollector(registry=r)
        GCCollector(registry=r)
        m = ("model_name",)

        def own(kind, name, doc, labels=(), **kw) -> Bound:
            return Bound(kind(name, doc, [*m, *labels], registry=r, **kw), model_name)

        def vllm(kind, name, doc, labels=(), **kw) -> Bound:
            fam = kind(name, doc, [*m, "engine", *labels], registry=r, **kw)
            return Bound(fam, model_name, "0")

        p = ("priority",)
        lat = {"buckets": LATENCY_BUCKETS}
        tok = {"buckets": TOKEN_LATENCY_BUCKETS}
        cnt = {"buckets": TOKEN_COUNT_BUCKETS}
        # -- llm_*: scheduler and memory state (gauges from the engine's snapshot) -----------
        self.queue_depth = own(Gauge, "llm_scheduler_queue_depth", "Waiting requests", p)
        self.running = own(Gauge, "llm_requests_running", "Running requests", p)
        self.waiting = own(Gauge, "llm_requests_waiting", "Waiting requests", p)
        self.swapped = own(Gauge, "llm_requests_swapped", "Requests swapped to host memory")
        self.kv_blocks = own(
            Gauge, "llm_kv_blocks", "KV blocks per partition", ("partition", "state")
        )
        self.kv_usage = own(Gauge, "llm_kv_cache_usage", "Fraction of KV blocks in use")
        self.prefix_queries = own(
            Counter, "llm_prefix_cache_queries", "Prompt tokens looked up in the prefix cache", p
        )
        self.prefix_hits = own(
            Counter, "llm_prefix_cache_hits", "Prompt tokens found in the prefix cache", p
        )
        # The seed's two ratio gauges, over a sliding window (metrics/window.py); the counters
        # above and llm_sla_met / llm_sla_requests let rate() take any other window.
        self.hit_rate = own(
            Gauge, "llm_kv_cache_hit_rate",
            "Prefix-cache hit rate: prompt tokens found / looked up over the last 60 s", p,
        )  # fmt: skip
        self.sla_attainment = own(
            Gauge, "llm_sla_attainment",
            "Requests ended in the last 60 s whose TTFT met the class SLA, as a share of those "
            "ended (1 when none ended; always 1 for a class without an SLA)",
            ("priority", "tier"),
        )  # fmt: skip
        # -- llm_*: requests -------------------------------------------------------------------
        self.wait = own(
            Histogram, "llm_scheduler_wait_seconds", "Queue time: arrival to first scheduled",
            p, **lat,
        )  # fmt: skip
        self.ttft = own(Histogram, "llm_ttft_seconds", "Time to first token", p, **lat)
        self.itl = own(
            Histogram, "llm_inter_token_latency_seconds", "Time between output tokens", p, **tok
        )
        self.tpot = own(
            Histogram, "llm_time_per_output_token_seconds",
            "Mean time per output token after the first, per request", p, **tok,
        )  # fmt: skip
        self.e2e = own(Histogram, "llm_e2e_seconds", "Arrival to finish", p, **lat)
        self.prefill_time = own(
            Histogram, "llm_request_prefill_seconds", "First scheduled to first token", p, **lat
        )
        self.decode_time = own(
            Histogram, "llm_request_decode_seconds", "First token to finish", p, **lat
        )
        self.inference_time = own(
            Histogram, "llm_request_inference_seconds", "First scheduled to finish", p, **lat
        )
        self.prompt_hist = own(
            Histogram, "llm_request_prompt_tokens", "Prompt tokens per request", p, **cnt
        )
        self.generation_hist = own(
            Histogram, "llm_request_generation_tokens", "Generated tokens per request", p, **cnt
        )
        self.tokens_in = own(Counter, "llm_prompt_tokens", "Prompt tokens", p)
        self.tokens_out = own(Counter, "llm_generation_tokens", "Generated tokens", p)
        self.tenant_in = own(
            Counter, "llm_tenant_prompt_tokens", "Prompt tokens of ended requests", ("tenant",)
        )
        self.tenant_out = own(
            Counter, "llm_tenant_generation_tokens", "Generated tokens", ("tenant",)
        )
        self.finished = own(
            Counter, "llm_requests", "Ended requests", ("priority", "finish_reason")
        )
        self.sla_met = own(
            Counter, "llm_sla_met", "Ended requests whose TTFT met the class SLA",
            ("priority", "tier"),
        )  # fmt: skip
        self.sla_total = own(
            Counter, "llm_sla_requests", "Ended requests of a class with a TTFT SLA",
            ("priority", "tier"),
        )  # fmt: skip
        self.preemptions = own(
            Counter, "llm_preemption", "Preempted requests", ("victim_priority", "reason")
        )
        self.rejections = own(
            Counter, "llm_admission_rejections",
            "Requests refused before the queue (reason: rate_limited, resource_exhausted, "
            "sla_unreachable; sla_demoted: run as best effort instead)",
            ("reason", "priority"),
        )  # fmt: skip
        self.sla_ended = own(
            Counter, "llm_sla_ended_early",
            "Waiting requests ended early: their class's TTFT SLA became unreachable", p,
        )  # fmt: skip
        self.ttft_error = own(
            Histogram, "llm_ttft_prediction_error_seconds",
            "SLA admission: |actual - predicted| time to first token", p, **lat,
        )  # fmt: skip
        self.length_error = own(
            Histogram, "llm_output_length_prediction_error_tokens",
            "|actual - predicted (P50)| output tokens of requests that ended the model's way",
            p, buckets=TOKEN_COUNT_BUCKETS,
        )  # fmt: skip
        # -- llm_*: steps ----------------------------------------------------------------------
        self.schedule_time = own(
            Histogram, "llm_schedule_seconds", "Scheduler time per step", buckets=STEP_BUCKETS
        )
        self.iteration_tokens = own(
            Histogram, "llm_iteration_tokens", "Tokens per engine step", buckets=ITERATION_BUCKETS
        )
        self.swap = own(
            Histogram, "llm_kv_swap_seconds", "KV swap copy time per step", ("direction",),
            buckets=STEP_BUCKETS,
        )  # fmt: skip
        self.cut_ins = own(
            Counter, "llm_p0_cut_in_steps",
            "Steps run for newly arrived P0 requests between two layers of another step",
        )  # fmt: skip
        # -- llm_*: speculative decoding ----------------------------------------------------------
        self.spec_draft = own(Counter, "llm_spec_draft_tokens", "Draft tokens verified", p)
        self.spec_accepted = own(Counter, "llm_spec_accepted_tokens", "Draft tokens accepted", p)
        self.spec_emitted = own(
            Counter, "llm_spec_emitted_tokens",
            "Tokens emitted by verification steps (accepted drafts + the sampled token)", p,
        )  # fmt: skip
        self.spec_acceptance = own(
            Gauge, "llm_spec_acceptance_rate", "Accepted / drafted tokens since the start", p
        )
        # -- vllm:* aliases ----------------------------------------------------------------------
        self.v_spec_drafts = vllm(
            Counter, "vllm:spec_decode_num_drafts", "Verification steps (drafts proposed)"
        )
        self.v_spec_draft_tokens = vllm(
            Counter, "vllm:spec_decode_num_draft_tokens", "Draft tokens verified"
        )
        self.v_spec_accepted = vllm(
            Counter, "vllm:spec_decode_num_accepted_tokens", "Draft tokens accepted"
        )
        self.v_running = vllm(Gauge, "vllm:num_requests_running", "Requests running")
        self.v_waiting = vllm(Gauge, "vllm:num_requests_waiting", "Requests waiting")
        self.v_kv_usage = vllm(Gauge, "vllm:kv_cache_usage_perc", "KV-cache usage, 1 = 100%")
        self.v_prefix_queries = vllm(
            Counter, "vllm:prefix_cache_queries", "Prefix-cache queries, in tokens"
        )
        self.v_prefix_hits = vllm(Counter, "vllm:prefix_cache_hits", "Prefix-cache hits, in tokens")
        self.v_preemptions = vllm(Counter, "vllm:num_preemptions", "Preemptions")
        self.v_prompt = vllm(Counter, "vllm:prompt_tokens", "Prefill tokens processed")
        self.v_generation = vllm(Counter, "vllm:generation_tokens", "Generation tokens processed")
        self.v_success = vllm(
            Counter, "vllm:request_success", "Successfully processed requests",
            ("finished_reason",),
        )  # fmt: skip
        self.v_prompt_hist = vllm(
            Histogram, "vllm:request_prompt_tokens", "Prompt tokens per request", **cnt
        )
        self.v_generation_hist = vllm(
            Histogram, "vllm:request_generation_tokens", "Generated tokens per request", **cnt
        )
        self.v_iteration = vllm(
            Histogram, "vllm:iteration_tokens_total", "Tokens per engine step",
            buckets=ITERATION_BUCKETS,
        )  # fmt: skip
        self.v_ttft = vllm(
            Histogram, "vllm:time_to_first_token_seconds", "Time to first token", **tok
        )
        self.v_itl = vllm(
            Histogram, "vllm:inter_token_latency_seconds", "Inter-token latency", **tok
        )
        self.v_tpot = vllm(
            Histogram, "vllm:request_time_per_output_token_seconds",
            "Mean time per output token, per request", **tok,
        )  # fmt: skip
        self.v_e2e = vllm(
            Histogram, "vllm:e2e_request_latency_seconds", "End-to-end request latency", **lat
        )
        self.v_queue = vllm(Histogram, "vllm:request_queue_time_seconds", "Queue time", **lat)
        self.v_prefill = vllm(
            Histogram, "vllm:request_prefill_time_seconds", "Prefill phase time", **lat
        )
        self.v_decode = vllm(
            Histogram, "vllm:request_decode_time_seconds", "Decode phase time", **lat
        )
        self.v_inference = vllm(
            Histogram, "vllm:request_inference_time_seconds", "Prefill + decode time", **lat
        )
