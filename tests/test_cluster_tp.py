"""`--replicas R --tensor-parallel-size N` on Ray Serve (issue 44): a replica is one engine of N
processes, placed on one node by its placement group; the router sees one replica. One replica
of TP=2 on a tiny random Llama answers what TP=1 answers (greedy, through the ingress)."""

import shutil

import httpx
import pytest

from tests.server_utils import free_port
from tests.test_architectures import save_tiny
from tests.test_batch_invariance import prompts
from tierserve import LLM
from tierserve.api.settings import ServerSettings
from tierserve.engine.args import EngineArgs
from tierserve.sampling_params import SamplingParams

ray = pytest.importorskip("ray")
from ray import serve  # noqa: E402

from tierserve.cluster.launch import ClusterOptions, deploy, engine_placement, start_ray  # noqa: E402

pytestmark = [pytest.mark.cluster]
NEW = 8


def test_a_tp_replica_reserves_its_ranks_in_one_bundle():
    opts = ClusterOptions(replicas=2, replica_cpus=0.5)
    assert engine_placement(EngineArgs(device="cpu"), opts) == {
        "ray_actor_options": {"num_cpus": 0.5}
    }
    tp = engine_placement(EngineArgs(device="cpu", tensor_parallel_size=4), opts)
    assert tp["placement_group_bundles"] == [{"CPU": 2.0}]
    assert tp["ray_actor_options"] == {"num_cpus": 2.0}
    gpu = engine_placement(EngineArgs(device="cuda", tensor_parallel_size=2), opts)
    assert gpu["placement_group_bundles"] == [{"CPU": 1.0, "GPU": 2}]
    assert gpu["placement_group_strategy"] == "STRICT_PACK"
    assert gpu["ray_actor_options"] == {"num_cpus": 1.0, "num_gpus": 2}


def test_one_replica_of_two_ranks_answers_as_one_rank(tmp_path):
    save_tiny(tmp_path, "LlamaForCausalLM", seed=5)
    greedy = SamplingParams(temperature=0, max_tokens=NEW, ignore_eos=True)
    ids = prompts(0)[:3]
    with LLM(model=str(tmp_path), num_kv_blocks=64, measure_costs=False) as one:
        want = [o.token_ids for o in one.generate(ids, greedy)]
    opts = ClusterOptions(replicas=1, replica_cpus=0.5, stats_period_s=0.2)
    temp_dir = start_ray(opts, tp=2, log_to_driver=False)
    try:
        settings = ServerSettings(
            port=free_port(), log_level="warning", served_model_names=("tiny",)
        )
        args = EngineArgs(
            model=str(tmp_path), device="cpu", num_kv_blocks=64, tensor_parallel_size=2,
            measure_costs=False, predictor_state=False,
        )  # fmt: skip
        deploy(args, settings, opts)
        url = f"http://127.0.0.1:{settings.port}/v1/completions"
        for p, tokens in zip(ids, want, strict=True):
            body = {"model": "tiny", "prompt": p, "max_tokens": NEW, "temperature": 0}
            r = httpx.post(url, json=body | {"ignore_eos": True, "logprobs": 1}, timeout=120)
            assert r.status_code == 200, r.text
            text = r.json()["choices"][0]["text"]
            assert text.split() == [f"w{t}" for t in tokens]
    finally:
        serve.shutdown()
        ray.shutdown()
        shutil.rmtree(temp_dir, ignore_errors=True)
