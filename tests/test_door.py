"""The door (api/door.py): generation requests do their costly pre-admission work in priority
order, and a request's clock starts at its first byte."""

from __future__ import annotations

import asyncio
import socket
import time

import httpx
from prometheus_client.parser import text_string_to_metric_families

from tests.fake_engine import fake_built
from tests.server_utils import running_server
from tierserve.api.door import Door, PriorityGate, door_class
from tierserve.api.tenancy import TenantRegistry
from tierserve.priority import Priority


def test_the_gate_lets_the_most_urgent_in_first_then_by_arrival():
    async def main():
        gate = PriorityGate(seats=1)
        first = await gate.enter(Priority.P3)  # takes the seat
        order: list[str] = []

        async def one(name: str, prio: Priority):
            ticket = await gate.enter(prio)
            order.append(name)
            await asyncio.sleep(0)
            ticket.leave()

        tasks = [
            asyncio.create_task(one(n, p))
            for n, p in [
                ("p3a", Priority.P3),
                ("p1", Priority.P1),
                ("p0a", Priority.P0),
                ("p3b", Priority.P3),
                ("p0b", Priority.P0),
            ]
        ]
        await asyncio.sleep(0.01)
        assert order == [] and gate.num_waiting == 5
        first.leave()
        await asyncio.gather(*tasks)
        assert order == ["p0a", "p0b", "p1", "p3a", "p3b"]
        assert gate.inside == 0

    asyncio.run(main())


def test_a_waiter_that_goes_away_does_not_keep_a_seat():
    async def main():
        gate = PriorityGate(seats=1)
        held = await gate.enter(Priority.P2)
        gone = asyncio.create_task(gate.enter(Priority.P0))
        later = asyncio.create_task(gate.enter(Priority.P3))
        await asyncio.sleep(0.01)
        gone.cancel()
        held.leave()
        ticket = await asyncio.wait_for(later, 1)  # the seat passed over the cancelled one
        assert gate.inside == 1
        ticket.leave()
        ticket.leave()  # twice: no harm
        assert gate.inside == 0

    asyncio.run(main())


def test_the_door_classifies_by_key_and_tier_header_before_the_body():
    tenants = TenantRegistry.open()
    classify = door_class(tenants)
    assert classify(None, None, "p2") == (Priority.P2, True)
    default = tenants.authenticate(None, None).default_priority
    assert classify(None, None, None) == (default, False)  # the body may say otherwise
    assert classify(None, None, "not-a-tier") == (Priority.P0, True)  # refused at once: first
    keyed = door_class(TenantRegistry.single_key("sk-x"))
    assert keyed("Bearer wrong", None, "p3") == (Priority.P0, True)  # a 401 is cheap: first


def test_the_door_serves_waiting_requests_by_priority_through_asgi():
    """At the ASGI boundary: with the one seat held by a slow request, a burst of P3 then P0
    requests is let through P0 first; every request is stamped with its arrival."""
    entered: list[tuple[str, float]] = []

    async def app(scope, receive, send):
        state = scope["state"]
        entered.append((dict(scope["headers"])[b"x-request-tier"].decode(), state["arrived"]))
        await asyncio.sleep(0.05 if not entered[1:] else 0.001)
        state["door"].leave()  # admitted: the next may come in while this one streams
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})

    clock = time.monotonic
    door = Door(app, now=clock, classify=door_class(TenantRegistry.open()), seats=1)

    async def main():
        transport = httpx.ASGITransport(app=door)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as ac:

            def post(tier):
                return ac.post("/v1/completions", json={}, headers={"x-request-tier": tier})

            first = asyncio.create_task(post("p2"))
            await asyncio.sleep(0.01)
            rest = [asyncio.create_task(post(t)) for t in ("p3", "p3", "p1", "p0", "p3", "p0")]
            await asyncio.sleep(0.01)  # all at the door, the first still inside
            sent = clock()
            await asyncio.gather(first, *rest)
            return sent

    sent = asyncio.run(main())
    assert [t for t, _ in entered] == ["p2", "p0", "p0", "p1", "p3", "p3", "p3"]
    assert all(at <= sent for _, at in entered[1:])  # stamped at arrival, not at entry


def _ttft_sum(url: str) -> float:
    total = 0.0
    for fam in text_string_to_metric_families(httpx.get(f"{url}/metrics", timeout=10).text):
        for s in fam.samples:
            if s.name == "llm_ttft_seconds_sum":
                total += s.value
    return total


def test_the_servers_clock_starts_at_the_first_byte():
    """Headers now, the body 0.4 s later: the server's own TTFT counts the wait (the time
    spent at the door is the client's time too)."""
    built = fake_built()
    with running_server(built) as (url, _state):
        before = _ttft_sum(url)
        body = b'{"prompt": "a b c", "max_tokens": 2}'
        host, port = url.removeprefix("http://").split(":")
        head = (
            f"POST /v1/completions HTTP/1.1\r\nhost: {host}\r\ncontent-type: application/json"
            f"\r\ncontent-length: {len(body)}\r\nconnection: close\r\n\r\n"
        ).encode()
        with socket.create_connection((host, int(port)), timeout=30) as s:
            s.sendall(head)
            time.sleep(0.4)
            s.sendall(body)
            reply = b""
            while chunk := s.recv(65536):
                reply += chunk
        assert reply.startswith(b"HTTP/1.1 200"), reply[:200]
        assert _ttft_sum(url) - before >= 0.4


def test_a_burst_of_less_urgent_requests_is_held_while_p0_prompts_wait_but_not_for_ever():
    async def main():
        busy = True
        gate = PriorityGate(seats=2, busy=lambda: busy, hold_s=0.2)
        loop = asyncio.get_running_loop()
        p0 = await asyncio.wait_for(gate.enter(Priority.P0), 0.05)  # P0 is never held
        lone = await asyncio.wait_for(gate.enter(Priority.P1), 0.05)  # nor one request alone
        p1 = [asyncio.create_task(gate.enter(Priority.P1)) for _ in range(2)]
        guess = asyncio.create_task(gate.enter(Priority.P2, known=False))
        await asyncio.sleep(0.01)
        lone.leave()  # a seat is free...
        await asyncio.sleep(0.05)
        assert not any(t.done() for t in p1)  # ...but the door is full while P0 work waits
        (await asyncio.wait_for(guess, 0.05)).leave()  # a class from the body may be P0
        busy = False
        (await asyncio.wait_for(p1[0], 0.1)).leave()  # let in once the P0 prompts are in
        (await asyncio.wait_for(p1[1], 0.1)).leave()
        busy = True
        held = await gate.enter(Priority.P3)  # the door full again: P0 and this one inside
        start = loop.time()
        p3 = [asyncio.create_task(gate.enter(Priority.P3)) for _ in range(2)]
        await asyncio.sleep(0.01)
        held.leave()
        p0.leave()  # two seats free, two waiting: still a burst, still held...
        tickets = await asyncio.wait_for(asyncio.gather(*p3), 1.0)  # ...then let in anyway
        assert loop.time() - start >= 0.19
        for t in tickets:
            t.leave()
        assert gate.inside == 0

    asyncio.run(main())
