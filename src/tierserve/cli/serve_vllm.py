"""vLLM's `serve` flags: one table (`VLLM_FLAGS`) says, for each, whether tierserve takes it with
the same meaning, takes it with a different one (and how), accepts it without effect, or refuses
it with one line saying what to use instead. A vLLM launch script either works or says why.

The table is also the docs: docs/api.md's "vLLM's flags" table is generated from it
(`python -m tierserve.cli.serve_vllm`), and a test fails when they drift apart.
"""

from __future__ import annotations

import argparse
import difflib
import re
from collections.abc import Callable
from dataclasses import dataclass

SAME, DIFFERENT, ACCEPTED, REFUSED = "same", "different", "accepted", "refused"


@dataclass(frozen=True)
class VllmFlag:
    """One vLLM flag. `ours`: tierserve's own flag of the same name (argparse has it already);
    else this table adds it (`switch`: no value; `type`: its value's). `verdict`: SAME,
    DIFFERENT (`note` says how), ACCEPTED (no effect here; logged at start) or REFUSED (`note`
    is the one line). `apply(value, opts)`: turns the value into tierserve's settings, returns
    a note to log or None; raises ValueError for a value that cannot apply."""

    flag: str
    verdict: str
    note: str
    ours: bool = False
    switch: bool = False
    type: Callable = str
    short: str | None = None
    apply: Callable[[object, dict], str | None] | None = None

    @property
    def key(self) -> str:
        return self.flag[2:].replace("-", "_")


def _same(opts: dict, ours: str, value, flag_ours: str, flag_theirs: str) -> None:
    if opts.get(ours) is not None and opts[ours] != value:
        raise ValueError(f"{flag_theirs} {value} contradicts {flag_ours} {opts[ours]}")
    opts[ours] = value


def _one_only(flag: str, instead: str):
    def apply(value, opts) -> None:
        if value != 1:
            raise ValueError(f"{flag} {value}: not supported; tierserve runs {instead}")

    return apply


def _alias(ours: str, flag_ours: str, flag_theirs: str, convert=lambda v: v):
    def apply(value, opts) -> None:
        _same(opts, ours, convert(value), flag_ours, flag_theirs)

    return apply


def _choices(flag: str, ok: tuple[str, ...], why: str):
    """A value in `ok` is accepted (no effect); another is refused with `why`."""

    def apply(value, opts) -> str | None:
        if str(value) not in ok:
            raise ValueError(f"{flag} {value}: {why}")
        return f"{flag} {value}: accepted, no effect ({why})"

    return apply


def _prefix_caching_on(value, opts) -> None:
    if value and (opts.get("no_enable_prefix_caching") or opts.get("no_prefix_caching")):
        raise ValueError("--enable-prefix-caching contradicts --no-(enable-)prefix-caching")


def _prefix_caching_off(value, opts) -> None:
    if value:
        opts["no_prefix_caching"] = True


VLLM_POLICIES = {"priority": "strict"}  # vLLM's priority policy: lower value first, preempting


def _policy(value, opts) -> None:
    ours = VLLM_POLICIES.get(value, value)
    _same(opts, "policy", ours, "--policy", "--scheduling-policy")


def _tool_parser(value, opts) -> str | None:
    if value in ("hermes", "json", "auto"):
        return None
    raise ValueError(
        f"--tool-call-parser {value}: not supported; tierserve parses Hermes <tool_call> and "
        "JSON tool calls in every model's output (no parser to choose)"
    )


DOWNLOADS = "tierserve downloads nothing: point --model at a local GGUF file or model folder"
LORA = "LoRA adapters are not supported: merge the adapter into the weights and serve those"
TLS = "tierserve serves plain HTTP: terminate TLS in a reverse proxy in front of it"

# fmt: off
VLLM_FLAGS: tuple[VllmFlag, ...] = (
    # -- the model ---------------------------------------------------------------------------
    VllmFlag("--model", SAME, "a GGUF file or a Hugging Face folder on disk (also positional)",
             ours=True),
    VllmFlag("--served-model-name", SAME, "", ours=True),
    VllmFlag("--tokenizer", SAME, "a folder with tokenizer.json, that file, or a GGUF file",
             ours=True),
    VllmFlag("--trust-remote-code", ACCEPTED, "no code runs from a model folder", switch=True),
    VllmFlag("--revision", REFUSED, DOWNLOADS),
    VllmFlag("--code-revision", REFUSED, DOWNLOADS),
    VllmFlag("--tokenizer-revision", REFUSED, DOWNLOADS),
    VllmFlag("--download-dir", REFUSED, DOWNLOADS),
    VllmFlag("--load-format", DIFFERENT, "auto only: safetensors folders and GGUF files",
             apply=_choices("--load-format", ("auto", "safetensors", "gguf"),
                            "safetensors folders and GGUF files are read as they are")),
    VllmFlag("--tokenizer-mode", DIFFERENT, "auto only (the tokenizers library)",
             apply=_choices("--tokenizer-mode", ("auto",), "tierserve uses the tokenizers "
                            "library's fast tokenizer")),
    VllmFlag("--task", DIFFERENT, "generate only",
             apply=_choices("--task", ("auto", "generate"),
                            "tierserve serves text generation only")),
    VllmFlag("--dtype", SAME, "float32, bfloat16 or float16", ours=True),
    VllmFlag("--quantization", DIFFERENT, "GGUF formats: auto (the file's own), none, q8_0, "
             "q4_0; vLLM's AWQ / GPTQ / FP8 methods are not supported", ours=True),
    VllmFlag("--max-model-len", SAME, "", ours=True),
    VllmFlag("--generation-config", DIFFERENT, "vllm only: no generation_config.json defaults "
             "are applied (a request's own parameters, or the server's)",
             apply=_choices("--generation-config", ("vllm",),
                            "tierserve applies no generation_config.json defaults")),
    VllmFlag("--seed", SAME, "", ours=True),
    VllmFlag("--device", SAME, "cpu or cuda", ours=True),
    # -- memory and the KV cache -------------------------------------------------------------
    VllmFlag("--gpu-memory-utilization", SAME, "cuda; no effect on the CPU", ours=True),
    VllmFlag("--kv-cache-dtype", SAME, "auto, float16, bfloat16, float32 (no fp8)", ours=True),
    VllmFlag("--block-size", SAME, "", ours=True),
    VllmFlag("--num-gpu-blocks-override", DIFFERENT, "sets --num-kv-blocks", type=int,
             apply=_alias("num_kv_blocks", "--num-kv-blocks", "--num-gpu-blocks-override")),
    VllmFlag("--swap-space", DIFFERENT, "sets --swap-space-gib (GiB of host memory)",
             type=float,
             apply=_alias("swap_space_gib", "--swap-space-gib", "--swap-space")),
    VllmFlag("--cpu-offload-gb", REFUSED, "weights are not offloaded: lower --max-num-seqs or "
             "use a smaller quantization"),
    VllmFlag("--enable-prefix-caching", SAME, "on by default", switch=True,
             apply=_prefix_caching_on),
    VllmFlag("--no-enable-prefix-caching", DIFFERENT, "sets --no-prefix-caching", switch=True,
             apply=_prefix_caching_off),
    VllmFlag("--disable-sliding-window", REFUSED, "windows are served as the model defines "
             "them"),
    # -- scheduling --------------------------------------------------------------------------
    VllmFlag("--max-num-seqs", SAME, "", ours=True),
    VllmFlag("--max-num-batched-tokens", SAME, "", ours=True),
    VllmFlag("--enable-chunked-prefill", ACCEPTED, "prefill is always chunked", switch=True),
    VllmFlag("--scheduling-policy", DIFFERENT, "fcfs or priority (= --policy strict); "
             "tierserve's policies by name too", apply=_policy),
    VllmFlag("--preemption-mode", SAME, "recompute or swap (auto, by cost, the default)",
             ours=True),
    VllmFlag("--enforce-eager", SAME, "cuda: no decode graphs", ours=True),
    VllmFlag("--max-seq-len-to-capture", ACCEPTED, "decode graphs cover --max-model-len",
             type=int),
    VllmFlag("--speculative-config", SAME, "ngram or a draft model; decided per class",
             ours=True),
    VllmFlag("--max-logprobs", ACCEPTED, "top logprobs are capped at 20", type=int),
    # -- parallelism -------------------------------------------------------------------------
    VllmFlag("--tensor-parallel-size", SAME, "Megatron split over N processes (NCCL on "
             "cuda, shared memory on the cpu); KV sizes per rank", ours=True, short="-tp"),
    VllmFlag("--pipeline-parallel-size", DIFFERENT, "1 only", type=int, short="-pp",
             apply=_one_only("--pipeline-parallel-size", "a model on one device (only 1)")),
    VllmFlag("--data-parallel-size", REFUSED, "use --replicas N (engine replicas on Ray "
             "Serve)", type=int, short="-dp"),
    VllmFlag("--distributed-executor-backend", ACCEPTED, "one engine per process"),
    VllmFlag("--disable-custom-all-reduce", ACCEPTED, "no all-reduce", switch=True),
    # -- LoRA --------------------------------------------------------------------------------
    VllmFlag("--enable-lora", REFUSED, LORA, switch=True),
    VllmFlag("--lora-modules", REFUSED, LORA),
    VllmFlag("--max-loras", REFUSED, LORA, type=int),
    VllmFlag("--max-lora-rank", REFUSED, LORA, type=int),
    VllmFlag("--max-cpu-loras", REFUSED, LORA, type=int),
    # -- the API -----------------------------------------------------------------------------
    VllmFlag("--host", SAME, "", ours=True),
    VllmFlag("--port", SAME, "", ours=True),
    VllmFlag("--api-key", SAME, "also TIERSERVE_API_KEY; --tenants for keys per tenant",
             ours=True),
    VllmFlag("--chat-template", SAME, "", ours=True),
    VllmFlag("--chat-template-content-format", DIFFERENT, "auto only: content is rendered as "
             "the template expects",
             apply=_choices("--chat-template-content-format", ("auto",),
                            "content is given to the template as it expects")),
    VllmFlag("--enable-auto-tool-choice", ACCEPTED, "tool_choice auto is always on",
             switch=True),
    VllmFlag("--tool-call-parser", DIFFERENT, "hermes (and JSON) only: both are always parsed",
             apply=_tool_parser),
    VllmFlag("--guided-decoding-backend", DIFFERENT, "auto, guidance or llguidance: "
             "llguidance is the one engine",
             apply=_choices("--guided-decoding-backend", ("auto", "guidance", "llguidance"),
                            "structured output runs on llguidance")),
    VllmFlag("--enable-reasoning", REFUSED, "reasoning parsers are not supported",
             switch=True),
    VllmFlag("--reasoning-parser", REFUSED, "reasoning parsers are not supported"),
    VllmFlag("--uvicorn-log-level", DIFFERENT, "sets --log-level (the server's and uvicorn's)",
             apply=_alias("log_level", "--log-level", "--uvicorn-log-level",
                          lambda v: {"critical": "warning", "error": "warning",
                                     "trace": "debug"}.get(v, v))),
    VllmFlag("--disable-log-requests", ACCEPTED, "requests are not logged one by one",
             switch=True),
    VllmFlag("--disable-log-stats", ACCEPTED, "no periodic stats log: /metrics has them",
             switch=True),
    VllmFlag("--disable-fastapi-docs", ACCEPTED, "only /openapi.json is served", switch=True),
    VllmFlag("--ssl-keyfile", REFUSED, TLS),
    VllmFlag("--ssl-certfile", REFUSED, TLS),
    VllmFlag("--root-path", REFUSED, "serve at / behind the proxy that adds the prefix"),
    VllmFlag("--allowed-origins", REFUSED, "no CORS headers are sent: add them in a proxy"),
    VllmFlag("--otlp-traces-endpoint", DIFFERENT, "OTLP over HTTP only (the collector's 4318 "
             "port; gRPC is refused): one span per request with its class, tenant, queue, "
             "prefill and decode times, preemptions and outcome", ours=True),
)
# fmt: on
BY_KEY = {f.key: f for f in VLLM_FLAGS}
OWN = [f for f in VLLM_FLAGS if not f.ours]  # the flags this table adds to argparse
# (serve.py's config-file schema: a vLLM name with a value, and the switches)
VLLM_OPTIONS = [(f.flag, f.type, f.note) for f in OWN if not f.switch]
VLLM_SWITCHES = [(f.flag, f.note) for f in OWN if f.switch]


def add_vllm_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("vLLM's names (docs/api.md: same, different or refused)")
    g.add_argument(
        "model_tag", nargs="?", default=None, metavar="MODEL", help="as --model (vLLM's form)"
    )
    for f in OWN:
        names = [f.flag, f.short] if f.short else [f.flag]
        text = f"vLLM's; {f.verdict}" + (f": {f.note}" if f.note else "")
        if f.switch:
            g.add_argument(*names, action="store_true", default=None, help=text)
        elif f.verdict == REFUSED:
            g.add_argument(*names, nargs="?", const=True, default=None, help=text)
        else:
            g.add_argument(*names, type=f.type, default=None, help=text)


def apply_vllm_options(opts: dict) -> list[str]:
    """Turn vLLM's names in `opts` (merged flags and file) into tierserve's, in place; raise
    ValueError naming a flag that does not apply. Returns notes to log at start."""
    notes = []
    tag = opts.pop("model_tag", None)
    if tag is not None:
        _same(opts, "model", tag, "--model", "the positional MODEL")
    for f in OWN:
        value = opts.pop(f.key, None)
        if value is None or (f.switch and value is False):
            continue
        if f.verdict == REFUSED:
            raise ValueError(f"{f.flag}: {f.note}")
        if f.apply is not None:
            note = f.apply(value, opts)
            if note:
                notes.append(note)
        elif f.verdict == ACCEPTED:
            notes.append(f"{f.flag}: accepted, no effect ({f.note})")
    return notes


def check_policy_name(name: str | None) -> None:
    """A policy name that does not exist, refused before the model loads."""
    from tierserve.policies import POLICIES

    names = POLICIES.names()
    if name is None or name in names:
        return
    close = difflib.get_close_matches(name, [*names, *VLLM_POLICIES], n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    raise ValueError(f"unknown policy {name!r}{hint}; choose one of {', '.join(names)}")


def _words(flag: str) -> set[str]:
    return set(re.findall(r"[a-z0-9]+", flag.lower()))


def closest_flag(flag: str, known: list[str]) -> str | None:
    """The known flag `flag` was most likely meant to be: a close spelling that shares a word
    with it (so `--revision` never points at `--replicas`), or a near-identical one."""
    for cand in difflib.get_close_matches(flag, known, n=5, cutoff=0.6):
        ratio = difflib.SequenceMatcher(None, flag, cand).ratio()
        if _words(flag) & _words(cand) or ratio >= 0.85:
            return cand
    return None


def unknown_flag_message(parser: argparse.ArgumentParser, extras: list[str]) -> str:
    """ "unrecognized argument --x (did you mean --y?)" for the first unknown flag in `extras`."""
    bad = next((a for a in extras if a.startswith("-")), extras[0])
    flag = bad.split("=", 1)[0]
    known = [s for a in parser._actions for s in a.option_strings]
    close = closest_flag(flag, known) if bad.startswith("-") else None
    hint = f" (did you mean {close}?)" if close else ""
    what = "argument" if bad.startswith("-") else "extra argument"
    return f"unrecognized {what} {bad}{hint}"


def markdown_table() -> str:
    """docs/api.md's table of vLLM's flags."""
    rows = ["| vLLM flag | here | how |", "|---|---|---|"]
    for f in VLLM_FLAGS:
        name = f"`{f.flag}`" + (f" / `{f.short}`" if f.short else "")
        rows.append(f"| {name} | {f.verdict} | {f.note or '–'} |")
    return "\n".join(rows)


if __name__ == "__main__":
    print(markdown_table())
