"""Every engine, cache and policy setting in one frozen record (what `tierserve serve` flags and
`tierserve.LLM(...)` keywords fill in), and the builder that turns it into a running engine."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from tierserve.config import (
    AdmissionConfig,
    CacheConfig,
    PartitionConfig,
    PolicyConfig,
    PriorityConfig,
    SchedulerConfig,
)
from tierserve.core.speculation.config import SpecConfig, with_draft_model
from tierserve.model.config import QUANTIZATIONS

PREDICTIVE_USES = ("order", "reserve", "ttft", "routing")
PREDICTIVE_ORDER_S = 5.0  # the aging bound of --predictive order (docs/scheduling.md)


def parse_predictive(words) -> tuple[str, ...]:
    """`--predictive off | all | order reserve ttft routing` (any of the four) -> the uses."""
    words = [words] if isinstance(words, str) else list(words)
    if words in (["off"], ["none"], []):
        return ()
    if words == ["all"]:
        return PREDICTIVE_USES
    return tuple(dict.fromkeys(words))


# --kv-cache-dtype: each accepted name and the dtype it means (None: the model's own).
KV_CACHE_DTYPES = {
    "auto": None,
    "float32": "float32",
    "float16": "float16",
    "fp16": "float16",
    "half": "float16",
    "bfloat16": "bfloat16",
    "bf16": "bfloat16",
}


@dataclass(frozen=True)
class EngineArgs:
    model: str | None = None  # None: the embedded default model
    # Where the tokenizer comes from when not from the model itself (vLLM's --tokenizer): a
    # folder with tokenizer.json, that file, or a GGUF file.
    tokenizer: str | None = None
    device: str | None = None  # None: cuda if available, else cpu
    dtype: str | None = None  # None: bfloat16 on cuda, float32 on cpu
    # auto: the file's own precision (the embedded GGUF runs q4_1 / q8_0); none: float32;
    # q8_0 / q4_0: requantize (model/weights.py)
    quantization: str = "auto"
    # Products of the quantized kernels: float32, or bfloat16 (float32 sums) where the CPU has
    # AVX512_BF16; auto: bfloat16 there, float32 elsewhere (model/weights.py)
    activations: str = "auto"
    # CPU kernels: outputs independent of the batch, chunking, prefix cache, preemption and
    # speculation (one step path; every prompt through paged attention). False: fastest path
    # per step size.
    batch_invariant: bool = True
    # None: 1 GiB on the CPU; on CUDA what `gpu_memory_utilization` leaves (engine/builder.py)
    kv_cache_gib: float | None = None
    # CUDA: the share of the GPU's memory this engine may use (weights, activations, graphs and
    # KV); after the weights load and one profiling step, the KV cache takes what is left
    # (vLLM's flag and default). An explicit kv_cache_gib or num_kv_blocks overrides it.
    gpu_memory_utilization: float = 0.9
    # CUDA: run every step eagerly (vLLM's --enforce-eager): no decode graphs.
    enforce_eager: bool = False
    # The KV cache's element type: float32, float16 or bfloat16 (vLLM's spellings fp16 and
    # bf16 too); auto: the model's dtype (engine/builder.py, kv_cache_dtype).
    kv_cache_dtype: str = "auto"
    num_kv_blocks: int | None = None  # overrides kv_cache_gib
    # Host swap space for preempted KV. None: 4 GiB on CUDA, none on the CPU (there the device
    # pool and host memory are the same RAM, so swap space would only be more KV memory).
    swap_space_gib: float | None = None
    block_size: int = 16
    max_num_seqs: int = 64
    # None: 2048 on CUDA, 512 on the CPU, where a step of 2048 prompt tokens lasts ~1 s and a P0
    # arriving during it waits for all of it (docs/performance.md, flood).
    max_num_batched_tokens: int | None = None
    max_model_len: int | None = None  # None: the model's context length
    enable_prefix_caching: bool = True
    preemption_mode: str = "auto"
    swap_cost_ratio: float = 0.3
    # None: "exclusive" on the CPU, "decode" on CUDA (see SchedulerConfig.p0_express).
    p0_express: str | None = None
    # P0 cut-in (core/cut_in.py): a P0 arriving mid-step gets a step between two of its layers.
    p0_cut_in: bool = SchedulerConfig().p0_cut_in
    # A step's prefill ends within this fraction of P0's TTFT SLA (None: sized by tokens only).
    step_time_fraction: float | None = SchedulerConfig().step_time_fraction
    # ... and the tighter one while P0 is about (None: none).
    p0_step_time_fraction: float | None = SchedulerConfig().p0_step_time_fraction
    # Calm steps (core/calm.py): background decodes paced while P0 is about (None: off).
    p0_calm_fraction: float | None = SchedulerConfig().p0_calm_fraction
    # Prefix-cache retention by class (CacheConfig.prefix_retention; all 0: plain LRU).
    prefix_retention: tuple[float, ...] = CacheConfig().prefix_retention
    seed: int | None = None
    # Threads of the engine's parallel regions (torch/OpenMP), set on the thread that builds the
    # engine and on the one that steps it. None: torch's default (`tierserve serve` resolves
    # its `--cpu-threads auto` to a number first: cpu_threads.py).
    cpu_threads: int | None = None
    partitions: PartitionConfig = field(default_factory=PartitionConfig)
    policy: PolicyConfig = field(default_factory=PolicyConfig)
    priorities: PriorityConfig = field(default_factory=PriorityConfig)
    admission: AdmissionConfig = field(default_factory=AdmissionConfig)
    measure_costs: bool = True
    # Speculative decoding (core/speculation): None (off), or which drafter and how far; the
    # scheduler decides per class and per step whether drafts pay (docs/scheduling.md).
    speculative_config: SpecConfig | None = None
    # `--speculative-model PATH`: a draft model (GGUF file or HF folder) as the drafter; merged
    # into `speculative_config` (method "draft_model") when the args are built.
    speculative_model: str | None = None
    # Predictive scheduling (core/predictive.py): which uses of the output-length predictor are
    # on: "order" (shortest predicted first in a class, 5 s aging bound), "reserve", "ttft".
    # The predictor learns either way; its state is kept in the cache dir across restarts
    # unless `predictor_state` is False.
    predictive: tuple[str, ...] = ()
    predictor_state: bool = True
    # Tensor parallelism (vLLM's -tp): the model split across this many processes, each with its
    # part of every layer and of the KV cache (`executor/tp_worker.py`); KV sizes are per rank.
    tensor_parallel_size: int = 1

    def __post_init__(self) -> None:
        spec = with_draft_model(self.speculative_config, self.speculative_model)
        object.__setattr__(self, "speculative_config", spec)  # (frozen: set once, here)
        bad = set(self.predictive) - set(PREDICTIVE_USES)
        if bad:
            raise ValueError(
                f"predictive uses are {', '.join(PREDICTIVE_USES)}; got {', '.join(sorted(bad))}"
            )
        if self.kv_cache_gib is not None and self.kv_cache_gib <= 0 and self.num_kv_blocks is None:
            raise ValueError(f"kv_cache_gib must be positive, got {self.kv_cache_gib}")
        if not 0 < self.gpu_memory_utilization <= 1:
            raise ValueError(
                f"gpu_memory_utilization must lie in (0, 1], got {self.gpu_memory_utilization}"
            )
        if self.swap_space_gib is not None and self.swap_space_gib < 0:
            raise ValueError(f"swap_space_gib must not be negative, got {self.swap_space_gib}")
        if self.tensor_parallel_size < 1:
            raise ValueError(
                f"tensor_parallel_size must be at least 1, got {self.tensor_parallel_size}"
            )
        if self.cpu_threads is not None and self.cpu_threads < 1:
            raise ValueError(f"cpu_threads must be at least 1, got {self.cpu_threads}")
        if self.quantization not in QUANTIZATIONS:
            raise ValueError(
                f"quantization must be one of {', '.join(QUANTIZATIONS)}, got {self.quantization!r}"
            )
        if self.activations not in ("auto", "float32", "bfloat16", "int8"):
            raise ValueError(
                f"activations must be auto, float32, bfloat16 or int8, got {self.activations!r}"
            )
        if self.kv_cache_dtype not in KV_CACHE_DTYPES:
            raise ValueError(
                f"kv_cache_dtype must be one of {', '.join(KV_CACHE_DTYPES)}, "
                f"got {self.kv_cache_dtype!r}"
            )
        if self.dtype not in (None, "float32", "bfloat16", "float16"):
            raise ValueError(f"dtype must be float32, bfloat16 or float16, got {self.dtype!r}")


# The defaults that depend on the device, for an EngineArgs field left None: (cpu, cuda).
# `resolve_defaults` is the one place they are applied (engine/builder.py, once the device is
# known); the flags' help and docs/api.md quote them.
DEVICE_DEFAULTS: dict[str, tuple[Any, Any]] = {
    "dtype": ("float32", "bfloat16"),
    # On CUDA the KV cache takes what gpu_memory_utilization leaves (None: sized at start).
    "kv_cache_gib": (1.0, None),
    # On the CPU a step of 2048 prompt tokens lasts ~1 s, and a P0 arriving during it waits for
    # all of it (docs/performance.md, flood).
    "max_num_batched_tokens": (512, 2048),
    # On the CPU the device pool and host memory are the same RAM: swap would only be more KV.
    "swap_space_gib": (0.0, 4.0),
    # SchedulerConfig.p0_express: on a GPU a decode step hides under compute-bound prefill.
    "p0_express": ("exclusive", "decode"),
}


def resolve_defaults(args: EngineArgs, device: str) -> EngineArgs:
    """`args` with every device-dependent setting left None filled in for `device`."""
    cuda = str(device).startswith("cuda")
    return replace(
        args, **{k: pair[cuda] for k, pair in DEVICE_DEFAULTS.items() if getattr(args, k) is None}
    )
