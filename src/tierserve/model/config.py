"""Model shape, as read from a GGUF file or a Hugging Face config.json. Plain data only.

`architecture` is a registered architecture name (`model/registry.py`; a ``model_type`` such
as ``"llama"`` is accepted and normalised). `extra` holds the settings only one architecture
reads (sliding windows, soft-caps, ...), as its file's ``settings`` read them from config.json.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from tierserve.model.registry import canonical

# --quantization: auto (the file's own precision), none (float32), or requantize (model/weights.py)
QUANTIZATIONS = ("auto", "none", "q8_0", "q4_0")


@dataclass(frozen=True)
class ModelConfig:
    architecture: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rope_theta: float = 10000.0
    rms_norm_eps: float = 1e-5
    max_position_embeddings: int = 4096
    tie_word_embeddings: bool = False
    attention_bias: bool = False  # the checkpoint has attention biases (loaded as found)
    # Hugging Face style rope scaling dict, e.g. {"rope_type": "llama3", "factor": 8.0, ...}.
    rope_scaling: dict | None = None
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = field(default_factory=tuple)
    name: str = "model"
    extra: dict = field(default_factory=dict)  # the architecture's own settings (JSON types)

    def __post_init__(self) -> None:
        object.__setattr__(self, "architecture", canonical(self.architecture))
        if self.num_heads % self.num_kv_heads:
            raise ValueError(
                f"num_heads {self.num_heads} is not a multiple of num_kv_heads {self.num_kv_heads}"
            )

    @property
    def q_size(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_kv_heads * self.head_dim

    def kv_bytes_per_token(self, dtype_bytes: int) -> int:
        return 2 * self.num_layers * self.kv_size * dtype_bytes

    def num_parameters(self) -> int:
        h, i, v = self.hidden_size, self.intermediate_size, self.vocab_size
        attn = h * (self.q_size + 2 * self.kv_size) + self.q_size * h
        layer = attn + 3 * h * i + 2 * h
        head = 0 if self.tie_word_embeddings else v * h
        return v * h + self.num_layers * layer + h + head

    def to_dict(self) -> dict:
        d = asdict(self)
        d["eos_token_ids"] = list(self.eos_token_ids)
        return d

    @classmethod
    def from_dict(cls, d: dict) -> ModelConfig:
        d = dict(d)
        d["eos_token_ids"] = tuple(d.get("eos_token_ids", ()))
        return cls(**d)
