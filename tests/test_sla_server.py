"""SLA admission through the HTTP server (fake executor: no model): a 503 with Retry-After and
code `sla_unreachable` for a request predicted late, demotion to P3 with its header for a tenant
that opted in, early end of a waiting request that became late (opted-in tenant only), and the
metrics that count them."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import httpx
from prometheus_client.parser import text_string_to_metric_families

from tests.fake_engine import EOS, SlowFakeExecutor, tiny_tokenizer, words
from tests.server_utils import running_server
from tierserve.admission.sla import policy_for_sla_admission
from tierserve.api.settings import ServerSettings
from tierserve.clock import WallClock
from tierserve.config import (
    AdmissionConfig,
    CacheConfig,
    PolicyConfig,
    PriorityConfig,
    SchedulerConfig,
)
from tierserve.core.preemption import PreemptionCosts
from tierserve.engine.args import EngineArgs
from tierserve.engine.builder import BuiltEngine
from tierserve.engine.core import EngineCore

# P0's SLA is long here so that a realtime flood is admitted and pushes P1 back.
PRIORITIES = PriorityConfig(ttft_sla_s=(30.0, 2.0, 60.0, None))
BUDGET, STEP_S = 64, 0.02  # 3200 prompt tokens per second, at best

TENANTS = """
tenants:
  plain: {keys: [sk-plain]}
  demoter: {keys: [sk-demote], sla_demote: true}
  ender: {keys: [sk-end], sla_end_early: true}
"""


def sla_built() -> BuiltEngine:
    costs = PreemptionCosts(1.0, 1.0, prefill_tokens_per_s=BUDGET / STEP_S)
    ex = SlowFakeExecutor(2048, 4, step_s=STEP_S, costs=costs)
    policy = policy_for_sla_admission(PolicyConfig())
    core = EngineCore.build(
        ex,
        WallClock(),
        CacheConfig(4, 2048),
        SchedulerConfig(
            max_num_seqs=64, max_num_batched_tokens=BUDGET, max_model_len=4096, p0_express="off"
        ),
        policy,
        PRIORITIES,
    )
    args = EngineArgs(
        num_kv_blocks=2048,
        block_size=4,
        max_num_seqs=64,
        policy=policy,
        priorities=PRIORITIES,
        admission=AdmissionConfig(sla_admission=True, sla_margin=1.0, sla_recheck_s=0.1),
    )
    return BuiltEngine(
        core, tiny_tokenizer(), SimpleNamespace(eos_token_ids=(EOS,)), "fake", ex, args
    )


async def post(ac, url: str, key: str, tier: str, n: int, start: int = 1):
    body = {"prompt": words(n, start), "max_tokens": 2, "ignore_eos": True}
    headers = {"authorization": f"Bearer {key}", "x-request-tier": tier}
    return await ac.post(f"{url}/v1/completions", json=body, headers=headers, timeout=120)


def metrics(url: str) -> dict[tuple[str, tuple], float]:
    out = {}
    for fam in text_string_to_metric_families(httpx.get(f"{url}/metrics", timeout=10).text):
        for s in fam.samples:
            labels = tuple(sorted((k, v) for k, v in s.labels.items() if k != "model_name"))
            out[(s.name, labels)] = s.value
    return out


def test_refusal_demotion_and_early_end_through_the_server(tmp_path):
    path = tmp_path / "tenants.yaml"
    path.write_text(TENANTS)
    built = sla_built()
    with running_server(built, ServerSettings(tenants_file=str(path))) as (url, _state):

        async def scenario():
            async with httpx.AsyncClient() as ac:
                # Realtime work first (4000 tokens, over a second), then the opted-in and the
                # plain tenant's online requests, admitted behind it...
                first = [
                    asyncio.create_task(post(ac, url, "sk-plain", "p0", 400, 10 * i))
                    for i in range(10)
                ]
                await asyncio.sleep(0.2)
                ender = asyncio.create_task(post(ac, url, "sk-end", "p1", 100, 500))
                plain = asyncio.create_task(post(ac, url, "sk-plain", "p1", 100, 600))
                await asyncio.sleep(0.2)
                # ...then a realtime flood (P0 goes first): both now miss their 2 s SLA.
                flood = [
                    asyncio.create_task(post(ac, url, "sk-plain", "p0", 400, 7 * i))
                    for i in range(20)
                ]
                await asyncio.sleep(0.3)
                # Online requests now predicted late: refused, or demoted for the opted-in one.
                refused = await post(ac, url, "sk-plain", "p1", 200, 900)
                demoted = await post(ac, url, "sk-demote", "p1", 200, 950)
                rest = await asyncio.gather(*first, *flood, ender, plain)
                return refused, demoted, rest[-2], rest[-1], rest[:-2]

        refused, demoted, ender, plain, p0s = asyncio.run(scenario())
        assert refused.status_code == 503
        err = refused.json()["error"]
        assert (err["type"], err["code"]) == ("resource_exhausted", "sla_unreachable")
        assert "TTFT SLA of 2 s cannot be met" in err["message"]
        assert int(refused.headers["retry-after"]) >= 1 and err["retry_after"] > 0

        assert demoted.status_code == 200  # never silently late: the response says so
        assert demoted.headers["x-tierserve-demoted"] == "p3"
        assert demoted.headers["x-tierserve-priority"] == "p3"

        assert ender.status_code == 503, ender.text  # opted in: ended early once late
        err = ender.json()["error"]
        assert err["code"] == "sla_unreachable" and "ended early" in err["message"]
        assert int(ender.headers["retry-after"]) >= 1
        assert plain.status_code == 200  # not opted in: served, late
        assert all(r.status_code == 200 for r in p0s)
        ms = int(plain.headers["x-tierserve-predicted-ttft-ms"])
        assert 0 < ms <= 2000  # admitted: predicted within its SLA

        m = metrics(url)
        reasons = {
            (lab[0][1], lab[1][1]): v
            for (name, lab), v in m.items()
            if name == "llm_admission_rejections_total"
        }
        assert reasons[("P1", "sla_unreachable")] >= 1
        assert reasons[("P1", "sla_demoted")] == 1
        assert m[("llm_sla_ended_early_total", (("priority", "P1"),))] == 1
        assert m[("llm_ttft_prediction_error_seconds_count", (("priority", "P0"),))] == 30
