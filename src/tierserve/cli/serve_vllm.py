"""vLLM's `serve` flags, where their meaning matches tierserve's, and a one-line refusal naming
the flag where it does not apply, so that a vLLM command line either works or says why.

- `vllm serve MODEL` (positional): `--model MODEL`;
- `--tensor-parallel-size` / `-tp`: 1 only, one engine per process (`--replicas N` for more);
- `--enable-prefix-caching`: on, the default; `--no-enable-prefix-caching`: `--no-prefix-caching`;
- `--scheduling-policy fcfs | priority`: `--policy fcfs` / `--policy strict` (ours work too);
- `--trust-remote-code`: accepted, no effect (tierserve runs no code from a model folder);
- `--gpu-memory-utilization` and `--enforce-eager` are tierserve's own flags too (same meaning).
"""

from __future__ import annotations

import argparse
import difflib

VLLM_OPTIONS = [
    ("--tensor-parallel-size", int, "vLLM's name; 1 only (one engine per process)"),
    ("--scheduling-policy", str, "vLLM's name for --policy (fcfs, priority = strict, or ours)"),
]
VLLM_SWITCHES = [
    ("--enable-prefix-caching", "vLLM's name; prefix caching is on by default"),
    ("--no-enable-prefix-caching", "vLLM's name for --no-prefix-caching"),
    ("--trust-remote-code", "vLLM's; accepted, no effect (no code runs from a model folder)"),
]
SHORT = {"--tensor-parallel-size": "-tp"}
VLLM_POLICIES = {"priority": "strict"}  # vLLM's priority policy: lower value first, preempting


def add_vllm_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "model_tag", nargs="?", default=None, metavar="MODEL", help="as --model (vLLM's form)"
    )
    for flag, typ, text in VLLM_OPTIONS:
        names = [flag, SHORT[flag]] if flag in SHORT else [flag]
        p.add_argument(*names, type=typ, default=None, help=text)
    for flag, text in VLLM_SWITCHES:
        p.add_argument(flag, action="store_true", default=None, help=text)


def _same(opts: dict, ours: str, theirs: str, value, flag_ours: str, flag_theirs: str) -> None:
    if opts.get(ours) is not None and opts[ours] != value:
        raise ValueError(f"{flag_theirs} {value} contradicts {flag_ours} {opts[ours]}")
    opts[ours] = value


def apply_vllm_options(opts: dict) -> list[str]:
    """Turn vLLM's names in `opts` (merged flags and file) into tierserve's, in place; raise
    ValueError naming a flag that does not apply. Returns notes to log at start."""
    notes = []
    tag = opts.pop("model_tag", None)
    if tag is not None:
        _same(opts, "model", "model_tag", tag, "--model", "the positional MODEL")
    tp = opts.pop("tensor_parallel_size", None)
    if tp is not None and tp != 1:
        raise ValueError(
            f"--tensor-parallel-size {tp}: not supported; tierserve runs one engine per process "
            "(only 1): for more engines use --replicas N"
        )
    if opts.pop("trust_remote_code", None):
        notes.append("--trust-remote-code: accepted, no effect (no code runs from a model folder)")
    on, off = opts.pop("enable_prefix_caching", None), opts.pop("no_enable_prefix_caching", None)
    if on and (off or opts.get("no_prefix_caching")):
        raise ValueError("--enable-prefix-caching contradicts --no-(enable-)prefix-caching")
    if off:
        opts["no_prefix_caching"] = True
    policy = opts.pop("scheduling_policy", None)
    if policy is not None:
        ours = VLLM_POLICIES.get(policy, policy)
        _same(opts, "policy", "scheduling_policy", ours, "--policy", "--scheduling-policy")
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


def unknown_flag_message(parser: argparse.ArgumentParser, extras: list[str]) -> str:
    """ "unrecognized argument --x (did you mean --y?)" for the first unknown flag in `extras`."""
    bad = next((a for a in extras if a.startswith("-")), extras[0])
    flag = bad.split("=", 1)[0]
    known = [s for a in parser._actions for s in a.option_strings]
    close = difflib.get_close_matches(flag, known, n=1, cutoff=0.6)
    hint = f" (did you mean {close[0]}?)" if close else ""
    what = "argument" if bad.startswith("-") else "extra argument"
    return f"unrecognized {what} {bad}{hint}"
