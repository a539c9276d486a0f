"""Stateful property test of the KV cache manager: random sequences of allocate / compute /
append / free / fork / swap out / swap in / reclaim / floor resize on tiny pools, with the
manager's own invariant check (every block in one place, ref counts = holders, partition counters
= recount, floor never broken) as the oracle after every step."""

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from tests.helpers import make_request
from tierserve.config import CacheConfig, PartitionConfig
from tierserve.core.kv import KVCacheManager
from tierserve.priority import Priority

PRIOS = st.sampled_from(list(Priority))


class KVMachine(RuleBasedStateMachine):
    @initialize(
        num_blocks=st.integers(4, 24),
        block_size=st.sampled_from([1, 2, 4]),
        cpu=st.integers(0, 12),
        floor=st.floats(0, 0.3),
        reserve=st.floats(0, 0.4),
        ceiling_extra=st.floats(0, 0.3),
        borrowers=st.sampled_from([(), (Priority.P3,), (Priority.P2, Priority.P3)]),
        caching=st.booleans(),
    )
    def setup(self, num_blocks, block_size, cpu, floor, reserve, ceiling_extra, borrowers, caching):
        parts = PartitionConfig(
            p0_floor_min=0.0,
            p0_floor_max=floor,
            p0_ceiling=min(1.0, floor + ceiling_extra + 0.1),
            p1_reserve=reserve,
            borrowers=borrowers,
            window_s=1.0,
        )
        self.kv = KVCacheManager(
            CacheConfig(
                block_size=block_size,
                num_blocks=num_blocks,
                num_cpu_blocks=cpu,
                enable_prefix_caching=caching,
                partitions=parts,
            )
        )
        self.live: dict[str, object] = {}  # holds device blocks
        self.allocated: dict[str, int] = {}  # tokens the device blocks were allocated for
        self.swapped: dict[str, object] = {}
        self.now = 0.0

    def _pick(self, pool: dict, i: int):
        # Insertion order, not the ids: request ids come from a process-wide counter, so their
        # sorted order (and with it the run) would depend on the tests that ran before.
        keys = list(pool)
        return pool[keys[i % len(keys)]]

    # -- rules ---------------------------------------------------------------------------------
    @rule(prio=PRIOS, n=st.integers(1, 20), alphabet=st.integers(1, 3), computed=st.booleans())
    def add(self, prio, n, alphabet, computed):
        # A tiny alphabet makes prompts share prefixes often.
        req = make_request(tokens=[i % alphabet for i in range(n)], priority=prio)
        hit = self.kv.get_computed_blocks(req)
        assert hit.num_tokens < req.num_tokens
        ids = self.kv.allocate_slots(req, req.num_tokens - hit.num_tokens, hit)
        if ids is None:
            assert not self.kv.holds(req.request_id)
            return
        assert len(ids) * self.kv.block_size >= req.num_tokens
        req.num_computed_tokens = req.num_tokens if computed else hit.num_tokens
        self.kv.cache_blocks(req)
        self.live[req.request_id] = req
        self.allocated[req.request_id] = req.num_tokens

    @precondition(lambda self: self.live)
    @rule(i=st.integers(0, 100))
    def finish_compute(self, i):
        req = self._pick(self.live, i)
        req.num_computed_tokens = self.allocated[req.request_id]
        self.kv.cache_blocks(req)

    @precondition(lambda self: self.live)
    @rule(i=st.integers(0, 100), tok=st.integers(0, 2))
    def append(self, i, tok):
        req = self._pick(self.live, i)
        if req.num_computed_tokens < req.num_tokens:
            return
        req.append_output(tok)
        self.allocated[req.request_id] = req.num_tokens
        if self.kv.allocate_slots(req, 1) is None:
            # The caller would preempt; here the request just gives everything back.
            self.kv.free(req.request_id)
            del self.live[req.request_id]

    @precondition(lambda self: self.live)
    @rule(i=st.integers(0, 100))
    def free(self, i):
        req = self._pick(self.live, i)
        self.kv.free(req.request_id)
        del self.live[req.request_id]

    @precondition(lambda self: self.live)
    @rule(i=st.integers(0, 100))
    def swap_out(self, i):
        req = self._pick(self.live, i)
        mapping = self.kv.swap_out(req)
        if mapping is None:
            return
        assert len({c for _, c in mapping}) == len(mapping)
        del self.live[req.request_id]
        self.swapped[req.request_id] = req

    @precondition(lambda self: self.swapped)
    @rule(i=st.integers(0, 100))
    def swap_in(self, i):
        req = self._pick(self.swapped, i)
        n = self.kv.num_swapped_blocks(req.request_id)
        mapping = self.kv.swap_in(req)
        if mapping is None:
            return
        assert len(mapping) == n
        del self.swapped[req.request_id]
        self.live[req.request_id] = req
        self.allocated[req.request_id] = req.num_computed_tokens

    @precondition(lambda self: self.swapped)
    @rule(i=st.integers(0, 100))
    def abort_swapped(self, i):
        req = self._pick(self.swapped, i)
        self.kv.free(req.request_id)
        del self.swapped[req.request_id]

    @rule(prio=PRIOS, n=st.integers(1, 10))
    def reclaim(self, prio, n):
        victims = self.kv.reclaim_for(prio, n)
        for rid in victims:
            assert self.live[rid].priority > prio, "reclaim offered a same-or-higher class"
        if victims:
            for rid in victims:
                self.kv.free(rid)
                del self.live[rid]
            assert self.kv.headroom(prio) >= n, "reclaimed victims did not make enough room"

    @rule(floor=st.integers(0, 30))
    def resize_floor(self, floor):
        self.kv.set_p0_floor(floor)

    @rule(dt=st.floats(0, 2), p1_waiting=st.booleans())
    def tick(self, dt, p1_waiting):
        self.now += dt
        self.kv.set_p1_waiting(p1_waiting)
        self.kv.observe(self.now)

    # -- oracle --------------------------------------------------------------------------------
    @invariant()
    def invariants_hold(self):
        if hasattr(self, "kv"):
            self.kv.check_invariants()

    def teardown(self):
        if not hasattr(self, "kv"):
            return
        for rid in list(self.live) + list(self.swapped):
            self.kv.free(rid)
        self.kv.check_invariants()
        assert self.kv.pool.num_free == self.kv.pool.num_blocks
        assert self.kv.swap.num_free == self.kv.swap.num_blocks
        assert self.kv.ledger.used == [0, 0, 0, 0] and self.kv.ledger.borrowed == 0


KVMachine.TestCase.settings = settings(
    max_examples=300, stateful_step_count=60, deadline=None, print_blob=True
)
TestKVStateful = KVMachine.TestCase
