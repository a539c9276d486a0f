"""What the scheduler does with the output-length predictor (core/predict). Mixed into
``Scheduler``.

* Learning (always on): a request's P50/P90 are predicted when it is added and kept while it
  lives; when it finishes normally (EOS, a stop, or its ``max_tokens``) its real length teaches
  the predictor and the prediction's error is recorded. Aborted, failed or cut-off requests
  teach nothing (their length is not what the model would have produced).
* Order inside a class (``SchedulerConfig.predictive_order_s`` = A > 0): the policy's in-class
  key uses ``arrival + shift`` (and, with EDF, ``deadline + shift``), where
  ``shift = A * min(1, predicted remaining output / predictive_order_tokens)``. Shorter predicted
  work goes first among requests that arrived close together; since ``0 <= shift <= A``, **no
  request is ever served after a request of its class (and tenant lane) that arrived more than
  A seconds after it** (the aging bound).
* Reservation (``SchedulerConfig.predictive_reserve``): a waiting request of class c (not P0) is
  admitted, and a swapped-out one swapped back in, only when the peak over its predicted life of
  the blocks it and the running requests of c and of the classes above it will take
  (core/projection.py) fits in what c can use: its partition headroom plus the blocks held by
  running requests of less urgent classes (which c may preempt). The projection: one token a
  step for each, from now (a request still in its prefill counts its whole prompt at once and
  ends after its prefill chunks: early, on the safe side); a running request grows to prompt +
  P50 output and then frees all its blocks; one that has outrun its P50 grows to its survival
  median (the median of the lengths seen beyond what it has produced,
  ``LengthPredictor.predict_beyond``); the candidate grows to prompt + P90 output (its survival
  median once it has outrun that; less its prefix hits); the peak is at one of the ends or at
  the candidate's end. A more urgent class's blocks count only beyond the room it fills first
  and c cannot use (``KVCacheManager.own_rooms``: P0's floor; P1's reservation, unless c may
  borrow it): P1 growing inside its reservation takes nothing from P2, and frees give back
  only what it held beyond it. Class-blind policies count everyone's blocks in full. The
  running requests are projected once a step and each admitted request is added. So neither
  the new request nor its peers are expected to be preempted by growth already admitted.
  With no running request of c or above it is admitted as before. A request that outruns its
  prediction grows and preempts exactly as today; a request with no prediction is projected
  to keep what it holds. Gating the swap-in matters as much as the admission: a victim
  swapped back in as soon as its blocks are free is pushed out again by the growth that
  pushed it out first.
* Routing (``SchedulerConfig.predictive_routing``): the scheduler's record carries a
  ``PredictedLoad`` (``predicted_load``): per class, the KV blocks its running, swapped and
  waiting requests are predicted to hold when they end (prompt + P50 output, at least what
  they have), and the tokens all of them are predicted to still compute. The cluster's ranking
  (routing/rank.py) reads it from each replica's report instead of counting ``max_tokens``.
* Prediction for admission (``SchedulerConfig.predictive_ttft``): the scheduler's record
  (core/stats.py) counts the running and waiting requests' output still to come as predicted
  (P50) instead of as their ``max_tokens`` allows; the TTFT predictor of SLA admission and its
  ``Retry-After`` read it from there (engine/load.py ``engine_shape``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from tierserve.core.kv.manager import ComputedBlocks
from tierserve.core.predict import LengthPredictor, Prediction
from tierserve.core.projection import Candidate, Projection, ceil_blocks
from tierserve.priority import NUM_PRIORITIES, Priority
from tierserve.request import FinishReason, Request, RequestStatus

if TYPE_CHECKING:
    from tierserve.clock import Clock
    from tierserve.config import SchedulerConfig
    from tierserve.core.kv import KVCacheManager
    from tierserve.policies import Policy


@dataclass(frozen=True)
class PredictedLoad:
    """A replica's load as its predictor sees it (``Predictive.predicted_load``)."""

    blocks: tuple[int, ...]  # by current class: KV blocks held at the predicted end
    tokens: int  # tokens still to compute: prompts left + predicted output left (P50)


class Predictive:
    config: SchedulerConfig
    kv: KVCacheManager
    policy: Policy
    clock: Clock
    running: dict[str, Request]
    swapped: dict[str, Request]

    def _init_predictive(self, predictor: LengthPredictor | None) -> None:
        self.predictor = predictor or LengthPredictor()
        self.predictions: dict[str, Prediction] = {}  # live requests
        self._survival: dict[str, int] = {}  # outran their P50: predicted length (_beyond)
        self.reservation_waits = 0  # admission and swap-in checks the reservation failed
        if self.config.predictive_order_s > 0:
            self.policy.work_shift = self._work_shift

    def _predict(self, request: Request) -> None:
        p = self.predictions[request.request_id] = self.predictor.predict(request, self.clock.now())
        request.predicted_output = p.p50

    def _learn(self, request: Request) -> None:
        """`request` left the scheduler: learn its length if it ended the model's way."""
        p = self.predictions.pop(request.request_id, None)
        self._survival.pop(request.request_id, None)
        if p is None or request.status != RequestStatus.FINISHED:
            return
        n = request.num_output_tokens
        if request.finish_reason == FinishReason.STOP or n >= request.sampling_params.max_tokens:
            self.predictor.observe(request, n, self.clock.now(), p)
            request.length_observed = True

    def predicted_remaining(self, request: Request) -> int:
        """Output tokens `request` is predicted to still produce (P50; 0 when it has outrun it
        or has no prediction)."""
        p = self.predictions.get(request.request_id)
        return max(0, p.p50 - request.num_output_tokens) if p is not None else 0

    def output_left(self, request: Request) -> int:
        """Output tokens `request` may still produce, as the TTFT predictor counts them: what
        its ``max_tokens`` allows, or with ``predictive_ttft`` what is predicted (P50, at least
        one token while it runs, never above what ``max_tokens`` allows)."""
        allowed = max(0, request.sampling_params.max_tokens - request.num_output_tokens)
        if not self.config.predictive_ttft or request.request_id not in self.predictions:
            return allowed
        return min(allowed, max(1, self.predicted_remaining(request)))

    def predicted_load(self) -> PredictedLoad:
        """The running, swapped and waiting requests' predicted KV and work. O(requests)."""
        bs = self.kv.block_size
        blocks, tokens = [0] * NUM_PRIORITIES, 0
        running = (*self.running.values(), *self.swapped.values())
        for r in (*running, *self.policy.requests()):
            p = self.predictions.get(r.request_id)
            out = r.sampling_params.max_tokens if p is None else max(p.p50, r.num_output_tokens)
            blocks[r.priority] += ceil_blocks(r.num_prompt_tokens + out, bs)
            tokens += r.num_tokens - r.num_computed_tokens + max(0, out - r.num_output_tokens)
        return PredictedLoad(tuple(blocks), tokens)

    def _work_shift(self, request: Request) -> float:
        cfg = self.config
        work = self.predicted_remaining(request)
        return cfg.predictive_order_s * min(1.0, work / cfg.predictive_order_tokens)

    # -- reservation ---------------------------------------------------------------------------
    def _steps_left(self, request: Request, output: int) -> int:
        """Steps until `request` has `output` output tokens: its prefill still to compute (a
        chunk a step at most; a decode's one uncomputed token is not one) and one token a step
        after it."""
        chunk = self.config.max_num_batched_tokens
        long_cap = self.policy.traits.long_prefill_cap(request, self.config)
        if long_cap is not None:
            chunk = min(chunk, long_cap)
        prefill = request.num_tokens - request.num_computed_tokens - 1
        delay = -(-prefill // chunk) if prefill > 0 else 0
        return delay + max(0, output - request.num_output_tokens)

    def _project(self, request: Request, projection: Projection) -> None:
        """Add running `request` to `projection`: ending at prompt + P50 output, or, once it
        has outrun its P50, at its survival median (``_beyond``); kept as it is with no
        prediction."""
        held = self.kv.num_held_blocks(request.request_id)
        end = None
        if request.request_id in self.predictions:
            p50 = self._refresh(request).p50
            n = request.num_output_tokens
            end = self._steps_left(request, p50 if p50 > n else self._beyond(request))
        projection.add(self._reserve_class(request), request.num_tokens, held, end)

    def _beyond(self, request: Request) -> int:
        """The output length a request that outran its P50 is predicted to reach: the median
        of the lengths seen beyond what it has produced (``LengthPredictor.predict_beyond``),
        made again only once it outruns that too."""
        rid, n = request.request_id, request.num_output_tokens
        length = self._survival.get(rid, 0)
        if length <= n:
            length = self._survival[rid] = self.predictor.predict_beyond(
                request, n, self.clock.now()
            )
        return length

    def _reservations(self) -> Projection | None:
        """The running requests' projected blocks, made once a step (None: off)."""
        if not self.config.predictive_reserve:
            return None
        projection = Projection(self.kv.block_size)
        for r in self.running.values():
            self._project(r, projection)
        return projection

    def _reserve_class(self, request: Request) -> int:
        return int(request.priority) if self.policy.traits.class_aware else 0

    def _reservation_fits(
        self, request: Request, computed: ComputedBlocks, projection: Projection | None
    ) -> bool:
        """Whether `request` may be admitted, or swapped back in, under the reservation (see
        the module doc)."""
        aware = self.policy.traits.class_aware
        if projection is None or (request.priority == Priority.P0 and aware):
            return True
        c = self._reserve_class(request)
        if not any(self._reserve_class(r) <= c for r in self.running.values()):
            return True
        p = self._refresh(request)
        bs = self.kv.block_size
        n = request.num_output_tokens
        final = request.num_prompt_tokens + (p.p90 if p.p90 > n else self._beyond(request))
        cand = Candidate(
            request.num_tokens,
            final,
            computed.num_tokens // bs,
            self._steps_left(request, request.num_output_tokens),
        )
        room = self.kv.headroom(Priority(request.priority))
        if aware:
            room += sum(
                self.kv.num_held_blocks(r.request_id)
                for r in self.running.values()
                if r.priority > request.priority
            )
        # Class-aware: what more urgent classes grow into their own room (P0's floor, P1's
        # reservation) is not c's to reserve. Class-blind: everyone's blocks count.
        rooms = self.kv.own_rooms(Priority(c)) if aware else [None]
        if projection.peak(c, rooms, cand) <= room:
            return True
        self.reservation_waits += 1
        return False

    def _refresh(self, request: Request) -> Prediction:
        """`request`'s prediction, made again if it was a cold start (the predictor may have
        learned since it arrived)."""
        p = self.predictions.get(request.request_id)
        if p is None or p.level == "none":
            p = self.predictions[request.request_id] = self.predictor.predict(
                request, self.clock.now()
            )
        return p

    def _reserved(self, request: Request, projection: Projection | None) -> None:
        """`request` was admitted: it is projected with the running requests from now on."""
        if projection is not None:
            self._project(request, projection)
