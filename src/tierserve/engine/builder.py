"""Build a real engine (model + TorchExecutor + scheduler) from EngineArgs."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import partial

import torch

from tierserve.clock import Clock, WallClock
from tierserve.config import CacheConfig, SchedulerConfig
from tierserve.core.predict import LengthPredictor
from tierserve.core.predict.store import load_state, save_state
from tierserve.core.speculation import Speculation
from tierserve.engine.args import (
    KV_CACHE_DTYPES,
    PREDICTIVE_ORDER_S,
    EngineArgs,
    resolve_defaults,
)
from tierserve.engine.core import EngineCore
from tierserve.engine.gpu_memory import kv_blocks_for_utilization
from tierserve.executor.draft_loader import load_drafter
from tierserve.executor.draft_model import DraftModel
from tierserve.executor.kv_memory import blocks_for_gib, kv_bytes_per_block
from tierserve.executor.parallel import TPGroup
from tierserve.executor.torch_executor import TorchExecutor, default_device
from tierserve.executor.tp_worker import (
    TPDriverExecutor,
    TPFollowerExecutor,
    TPWorkers,
    WorkerSpec,
    free_port,
    rank_device,
)
from tierserve.model.config import ModelConfig
from tierserve.model.loader import load_model
from tierserve.model.registry import build_model
from tierserve.model.sharding import ShardingError, check_divisible
from tierserve.model.tokenizer import ChatTokenizer
from tierserve.setting import carried

log = logging.getLogger("tierserve.engine")

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass
class BuiltEngine:
    engine: EngineCore
    tokenizer: ChatTokenizer
    model_config: ModelConfig
    model_name: str
    executor: TorchExecutor
    args: EngineArgs
    torch_threads: int | None = None  # for the engine thread (split_threads)


DEFAULT_THREADS = torch.get_num_threads()  # torch's own choice, before anyone sets it


def bind_threads(threads: int | None) -> None:
    """Set this thread's OpenMP team size (torch's intra-op threads). Teams are per thread: it
    must run on the thread that builds the engine (loading and the kernels' probe run parallel
    regions) and on the one that steps it; None keeps torch's default."""
    if threads is not None:
        torch.set_num_threads(threads)


def split_threads(model, threads: int | None, block_size: int) -> int | None:
    """Where the model can run every step in the compiled kernels (the fused layer), their own
    pool takes the CPU threads and PyTorch's ops run on one: an OpenMP team (PyTorch's) waits
    for its slowest thread, so on a host that shares its cores every parallel op of a step waits
    a time slice for a descheduled thread, where the kernels' threads claim work and never wait
    for one that is not running (kernels/csrc/parallel.h). A model that needs PyTorch's
    attention keeps PyTorch's threads. Returns the torch thread count the engine thread keeps."""
    if model.kernels is None or "fused" not in model.paths(block_size):
        return threads
    model.kernels.set_kernel_threads(threads or DEFAULT_THREADS)
    torch.set_num_threads(1)
    log.info(
        "the compiled kernels run on %d thread(s), PyTorch's ops on 1", threads or DEFAULT_THREADS
    )
    return 1


def engine_thread_start(threads: int | None) -> None:
    """Run first on the engine thread (AsyncEngine.on_thread_start): its team, logged."""
    bind_threads(threads)
    log.info("engine thread: %d CPU thread(s) for PyTorch's ops", torch.get_num_threads())


def context_length(requested: int | None, model_max: int) -> int:
    """The served context: the model's, or `requested` below it; above it, clamped (logged)."""
    if requested is None:
        return model_max
    if requested > model_max:
        log.warning(
            "--max-model-len %d is above the model's context of %d tokens: clamped to %d",
            requested,
            model_max,
            model_max,
        )
        return model_max
    return requested


def kv_cache_dtype(name: str, model) -> torch.dtype:
    """The KV cache's dtype for `--kv-cache-dtype` `name`; ``auto``: the model's own dtype.
    float16 makes decode steps at 1,024 tokens of context 13-37% shorter on the CPU and fits
    twice the tokens, at logits within ~1e-3 of a float32 cache's with float32 products; with
    int8 products it re-rolls their rounding, and the README's own example flips at a 0.02-nat
    near-tie, so it is not the default (docs/performance.md, "A 16-bit KV cache")."""
    chosen = KV_CACHE_DTYPES[name]
    return model.dtype if chosen is None else _DTYPES[chosen]


def _no_stage(text: str) -> None:
    pass


def _model(args: EngineArgs, loaded, device: str, dtype: torch.dtype, tp: TPGroup | None = None):
    model = build_model(
        loaded.config,
        loaded.weights,
        device,
        dtype,
        quantization=args.quantization,
        activations=args.activations,
        tp=tp,
    )
    model.kv_dtype = kv_cache_dtype(args.kv_cache_dtype, model)
    model.set_batch_invariant(args.batch_invariant)
    return model


def tp_threads(args: EngineArgs, device: str) -> int | None:
    """Each rank's CPU threads under tensor parallelism on the CPU: the engine's, shared out."""
    if args.tensor_parallel_size == 1 or str(device).startswith("cuda"):
        return args.cpu_threads
    return max(1, (args.cpu_threads or DEFAULT_THREADS) // args.tensor_parallel_size)


def tp_group(args: EngineArgs, device: str, config: ModelConfig) -> TPGroup | None:
    """Rank 0's group under `--tensor-parallel-size` N > 1 (the model's shape and the devices
    checked first: one line each), else None."""
    n = args.tensor_parallel_size
    if n == 1:
        return None
    check_divisible(config, n)
    if str(device).startswith("cuda"):
        have = torch.cuda.device_count()
        if have < n:
            raise ShardingError(
                f"--tensor-parallel-size {n} needs {n} GPUs; this machine has {have}"
            )
    return TPGroup.for_rank0(n, rank_device(device, 0))


def build_engine(
    args: EngineArgs, clock: Clock | None = None, on_stage: Callable[[str], None] = _no_stage
) -> BuiltEngine:
    """`on_stage(text)` hears what the build is doing (the server's start-up progress)."""
    device = args.device or default_device()
    args = replace(args, cpu_threads=tp_threads(args, device))
    bind_threads(args.cpu_threads)
    on_stage("loading the model")
    loaded = load_model(args.model, args.tokenizer)
    on_stage("building the model (a first start compiles the CPU kernels: about a minute)")
    resolved = resolve_defaults(args, device)  # the device-dependent defaults, in one place
    dtype = _DTYPES[resolved.dtype]
    group = tp_group(args, device, loaded.config)
    if group is not None:
        device = str(group.device)
    model = _model(args, loaded, device, dtype, group)
    torch_threads = split_threads(model, args.cpu_threads, args.block_size)
    loaded.weights = {}  # the model took what it needs (the tokenizer stays: a draft model's
    # vocabulary is checked against it)
    max_len = context_length(args.max_model_len, loaded.config.max_position_embeddings)
    cuda = str(device).startswith("cuda")
    graphs = cuda and not args.enforce_eager
    if args.num_kv_blocks:
        num_blocks = args.num_kv_blocks
    elif resolved.kv_cache_gib is not None:
        num_blocks = blocks_for_gib(model, args.block_size, resolved.kv_cache_gib)
    else:  # CUDA: what --gpu-memory-utilization leaves after weights and activations
        num_blocks = kv_blocks_for_utilization(
            model,
            args.block_size,
            args.gpu_memory_utilization,
            min(resolved.max_num_batched_tokens, max_len),
            args.max_num_seqs,
            max_len,
            graphs,
        )
    kv_bytes = num_blocks * kv_bytes_per_block(model, args.block_size)
    num_cpu = (
        blocks_for_gib(model, args.block_size, resolved.swap_space_gib)
        if resolved.swap_space_gib
        else 0
    )
    spec = args.speculative_config
    drafter = None
    if spec is not None and spec.method == "draft_model":
        drafter = load_drafter(
            spec.model or "",
            loaded,
            device,
            dtype,
            kv_bytes,
            args.block_size,
            activations=args.activations,
            kv_dtype=model.kv_dtype,
        )
    if args.batch_invariant or group is not None:
        on_stage("preparing the executor (one step path for every size)")
    else:
        on_stage("measuring the step paths (a first start on this machine times them)")
    make = TorchExecutor
    if group is not None:
        on_stage(f"starting {group.size - 1} tensor-parallel worker(s)")
        make = partial(TPDriverExecutor, workers=start_workers(args, group, num_blocks, num_cpu))
    executor = make(
        model,
        num_blocks,
        args.block_size,
        num_cpu,
        seed=args.seed,
        measure=args.measure_costs,
        tokenizer=loaded.tokenizer,
        drafter=drafter,
        decode_graphs="capture" if graphs else "off",
        max_model_len=max_len,
        max_seqs=args.max_num_seqs,
    )
    log.info(
        "KV cache%s: %d blocks of %d tokens, %s (%.2f GiB)",
        " (each rank's part)" if group is not None else "",
        num_blocks,
        args.block_size,
        str(model.kv_dtype).removeprefix("torch."),
        kv_bytes / (1 << 30),
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
            prefix_retention=args.prefix_retention,
        ),
        SchedulerConfig(
            **carried(
                SchedulerConfig,
                args,
                max_num_batched_tokens=resolved.max_num_batched_tokens,
                max_model_len=max_len,
                p0_express=resolved.p0_express,
            ),
            predictive_order_s=PREDICTIVE_ORDER_S if "order" in args.predictive else 0.0,
            predictive_reserve="reserve" in args.predictive,
            predictive_ttft="ttft" in args.predictive,
            predictive_routing="routing" in args.predictive,
        ),
        args.policy,
        args.priorities,
        speculation(args, drafter),
        predictor(args),
    )
    name = args.model or "SmolLM2-135M-Instruct"
    return BuiltEngine(engine, loaded.tokenizer, loaded.config, name, executor, args, torch_threads)


def start_workers(args: EngineArgs, group: TPGroup, num_blocks: int, num_cpu: int) -> TPWorkers:
    """Ranks 1..N-1 started, the group joined, every shard built (or the first error raised)."""
    port = free_port()
    level = logging.getLogger().getEffectiveLevel()
    specs = [
        WorkerSpec(
            args,
            rank=r,
            size=group.size,
            port=port,
            device=rank_device(str(group.device), r),
            num_blocks=num_blocks,
            num_cpu_blocks=num_cpu,
            threads=args.cpu_threads,
            log_level=level,
            shm_path=group.shm_path,
        )
        for r in range(1, group.size)
    ]
    workers = TPWorkers(specs)
    try:
        workers.connect(group, port)
        workers.wait_loaded()  # (each worker mapped the shared-memory file as it joined)
    except BaseException:
        workers.stop(timeout=1.0)
        group.close()
        raise
    finally:
        group.unlink_shm()
    log.info("tensor parallel: %d ranks (worker pids %s)", group.size, workers.pids())
    return workers


def build_follower(spec: WorkerSpec, group: TPGroup, on_loaded: Callable[[], None]):
    """A worker's executor (executor/tp_worker.py): its shard, its part of the KV cache, the
    engine's settings; `on_loaded` once the shard is built (rank 0 waits for it)."""
    args = spec.args
    bind_threads(spec.threads)
    loaded = load_model(args.model, args.tokenizer)
    dtype = _DTYPES[resolve_defaults(args, spec.device).dtype]
    model = _model(args, loaded, spec.device, dtype, group)
    split_threads(model, spec.threads, args.block_size)
    loaded.weights = {}
    on_loaded()
    cuda = spec.device.startswith("cuda")
    return TPFollowerExecutor(
        model,
        spec.num_blocks,
        args.block_size,
        spec.num_cpu_blocks,
        seed=args.seed,
        measure=args.measure_costs,
        decode_graphs="capture" if cuda and not args.enforce_eager else "off",
        max_model_len=context_length(args.max_model_len, loaded.config.max_position_embeddings),
        max_seqs=args.max_num_seqs,
    )


def speculation(args: EngineArgs, drafter: DraftModel | None) -> Speculation | None:
    """The scheduler's speculation state; with a draft model, its measured pass time (read on
    the engine thread, where both the scheduler and the executor run) prices its drafts."""
    if args.speculative_config is None:
        return None
    if drafter is None:
        return Speculation(args.speculative_config)
    drafter.measure()
    return Speculation(args.speculative_config, draft_pass_s=lambda: drafter.pass_s)


def predictor(args: EngineArgs) -> LengthPredictor:
    """The output-length predictor, restored from the cache dir unless `predictor_state` is
    off (a missing file is a cold start; a corrupt one is logged and ignored)."""
    p = LengthPredictor()
    if args.predictor_state:
        load_state(p)
    return p


def save_predictor(built: BuiltEngine) -> None:
    """Keep what the predictor learned for the next start (engine thread, as it stops)."""
    if not built.args.predictor_state:
        return
    try:
        save_state(built.engine.scheduler.predictor)
    except OSError as exc:  # a read-only cache dir: the next start is cold, nothing else
        log.warning("could not save the predictor's state: %s", exc)


def build_engine_off_main(
    args: EngineArgs, clock: Clock | None = None, on_stage: Callable[[str], None] = _no_stage
) -> BuiltEngine:
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
            box["built"] = build_engine(args, clock, on_stage)
        except BaseException as exc:  # re-raised on the caller's thread
            box["error"] = exc

    thread = threading.Thread(target=build, name="tierserve-build")
    thread.start()
    thread.join()
    if "error" in box:
        raise box["error"]
    return box["built"]  # type: ignore[return-value]
