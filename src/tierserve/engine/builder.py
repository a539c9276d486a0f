"""Build a real engine (model + TorchExecutor + scheduler) from EngineArgs."""

from __future__ import annotations

import threading
from dataclasses import dataclass

import torch

from tierserve.clock import Clock, WallClock
from tierserve.config import CacheConfig, SchedulerConfig
from tierserve.engine.args import EngineArgs
from tierserve.engine.core import EngineCore
from tierserve.executor.torch_executor import (
    TorchExecutor,
    blocks_for_gib,
    default_device,
    default_dtype,
)
from tierserve.model.config import ModelConfig
from tierserve.model.loader import load_model
from tierserve.model.registry import build_model
from tierserve.model.tokenizer import ChatTokenizer

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass
class BuiltEngine:
    engine: EngineCore
    tokenizer: ChatTokenizer
    model_config: ModelConfig
    model_name: str
    executor: TorchExecutor
    args: EngineArgs


def build_engine(args: EngineArgs, clock: Clock | None = None) -> BuiltEngine:
    loaded = load_model(args.model)
    device = args.device or default_device()
    dtype = _DTYPES[args.dtype] if args.dtype else default_dtype(device)
    model = build_model(
        loaded.config, loaded.weights, device, dtype, quantization=args.quantization
    )
    loaded.weights = {}  # the model took what it needs
    num_blocks = args.num_kv_blocks or blocks_for_gib(model, args.block_size, args.kv_cache_gib)
    num_cpu = (
        blocks_for_gib(model, args.block_size, args.swap_space_gib) if args.swap_space_gib else 0
    )
    executor = TorchExecutor(
        model,
        num_blocks,
        args.block_size,
        num_cpu,
        seed=args.seed,
        measure=args.measure_costs,
        tokenizer=loaded.tokenizer,
    )
    max_len = min(
        args.max_model_len or loaded.config.max_position_embeddings,
        loaded.config.max_position_embeddings,
    )
    engine = EngineCore.build(
        executor,
        clock or WallClock(),
        CacheConfig(
            block_size=args.block_size,
            num_blocks=num_blocks,
            num_cpu_blocks=num_cpu,
            enable_prefix_caching=args.enable_prefix_caching,
            partitions=args.partitions,
        ),
        SchedulerConfig(
            max_num_seqs=args.max_num_seqs,
            max_num_batched_tokens=args.max_num_batched_tokens
            or (2048 if model.device.type == "cuda" else 512),
            max_model_len=max_len,
            preemption_mode=args.preemption_mode,
            swap_cost_ratio=args.swap_cost_ratio,
            p0_express=args.p0_express
            or ("decode" if model.device.type == "cuda" else "exclusive"),
        ),
        args.policy,
        args.priorities,
    )
    name = args.model or "SmolLM2-135M-Instruct"
    return BuiltEngine(engine, loaded.tokenizer, loaded.config, name, executor, args)


def build_engine_off_main(args: EngineArgs, clock: Clock | None = None) -> BuiltEngine:
    """`build_engine` on a short-lived thread, for an engine that will step on its own thread.

    libgomp spins between parallel regions only while the threads it manages (every team's
    workers plus the first thread) are no more than the CPUs; past that it throttles to ~100
    spins, and every region of a decode step pays a futex wake-up. Loading the model runs
    parallel regions, so loading on the main thread leaves a team there for the process's life,
    and the engine thread's own team then pushes the count past two CPUs: on 2 cores a decode
    step took 24 ms instead of 19 ms (issue 13, docs/performance.md). A thread's team goes away
    with the thread, so loading here keeps the engine thread's team the only one.
    """
    box: dict[str, BuiltEngine | BaseException] = {}

    def build() -> None:
        try:
            box["built"] = build_engine(args, clock)
        except BaseException as exc:  # re-raised on the caller's thread
            box["error"] = exc

    thread = threading.Thread(target=build, name="tierserve-build")
    thread.start()
    thread.join()
    if "error" in box:
        raise box["error"]
    return box["built"]  # type: ignore[return-value]
