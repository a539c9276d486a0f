"""Fitting the run to the server: `--lengths auto` picks the simulator's lengths or the ~10x
shorter CPU ones from one timed request, and every run with too few measured requests in a
class is warned about (percentiles of one or two requests say nothing).

A new user running the README's `bench serve` against a CPU server with the simulator's lengths
measured 1 request at concurrency 1 and none at 4, drew empty plots, and was not told. Now a
short probe request (32 prompt tokens, up to 32 output tokens) is timed first: if a typical
request of the simulator's mix (P1's medians: 1,200 prompt and 250 output tokens) would take
more than a tenth of a level's measured window at that speed, the CPU lengths are used.
"""

from __future__ import annotations

from dataclasses import dataclass

from tierserve.loadgen.metrics import CLASSES

PROBE_PROMPT_TOKENS = 32
PROBE_OUTPUT_TOKENS = 32
TYPICAL_SIM = (1200, 250)  # P1's median prompt and output tokens (sim/workload.py)
MIN_SAMPLES = 20  # measured requests a class needs for its P95 to mean something
NO_WINDOW_S = 60.0  # the window assumed by --num-requests runs


@dataclass(frozen=True)
class Speed:
    ttft_s: float
    decode_tok_s: float | None  # None: fewer than 2 tokens came back

    def typical_sim_s(self) -> float:
        """Seconds a typical simulator-length request would take at this speed, alone."""
        prompt, output = TYPICAL_SIM
        prefill = self.ttft_s * prompt / PROBE_PROMPT_TOKENS
        decode = output / self.decode_tok_s if self.decode_tok_s else output * self.ttft_s
        return prefill + decode


def speed_of(record) -> Speed | None:
    """The probe's speed from its record (None if it did not complete)."""
    if record.outcome != "completed" or record.first_token is None:
        return None
    ttft = record.first_token - record.arrival
    times = record.chunk_times
    tok_s = None
    if len(times) >= 2 and times[-1] > times[0]:
        tok_s = (len(times) - 1) / (times[-1] - times[0])
    return Speed(ttft, tok_s)


def choose_lengths(speed: Speed | None, window_s: float | None) -> tuple[str, str]:
    """("sim" or "cpu", why) for a server measured at `speed`."""
    window = window_s or NO_WINDOW_S
    if speed is None:
        return "sim", "the probe request did not complete: keeping the simulator's lengths"
    t = speed.typical_sim_s()
    rate = f"{speed.decode_tok_s:.0f} tok/s" if speed.decode_tok_s else "?"
    seen = f"TTFT {speed.ttft_s:.2f} s, {rate} for one short request"
    if t > window / 10:
        return "cpu", (
            f"{seen}: a typical simulator-length request would take ~{t:.0f} s, too long for a "
            f"{window:g} s window; using the CPU lengths (about 10x shorter)"
        )
    return "sim", f"{seen}: a typical simulator-length request takes ~{t:.1f} s"


def sample_warnings(run: dict, mix: tuple[float, ...], title: str) -> list[str]:
    """One line per class of the mix with fewer than MIN_SAMPLES measured requests."""
    out = []
    for cls, share in zip(CLASSES, mix, strict=True):
        n = run["classes"][cls]["requests"]
        if share > 0 and n < MIN_SAMPLES:
            out.append(
                f"{title}: {cls} has {n} measured request(s), too few for its percentiles "
                f"(want {MIN_SAMPLES}+): run longer (--duration), or shorter requests "
                "(--lengths cpu, --length-scale)"
            )
    return out
