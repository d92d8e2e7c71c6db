"""The load loop's scheduler on its own, no engine: rows, admission, decode plans, release and compaction."""

from __future__ import annotations

import numpy as np

from llm_inference import memory
from llm_inference.arrivals import Request
from llm_inference.continuous_engine import rows_for
from llm_inference.scheduler import ADMIT_DIVISOR, DecodePlan, Scheduler, backlog_step_requests
from llm_inference.static_engine import attended_length


def request(i: int, arrival_s: float = 0.0, input_tokens: int = 8, output_tokens: int = 3,
            warmup: bool = False) -> Request:
    return Request(i, arrival_s, input_tokens, output_tokens, warmup=warmup)


def test_arrived_requests_take_the_lowest_free_rows_and_late_ones_wait():
    scheduler = Scheduler(4)
    scheduler.queue.extend([request(0), request(1), request(2, arrival_s=5.0)])
    plan = scheduler.admit(now_s=1.0)
    assert plan is not None and [r.id for r in plan.requests] == [0, 1] and plan.rows == [0, 1]
    assert scheduler.free_rows == 2 and [r.id for r in scheduler.queue] == [2]
    assert scheduler.admit(now_s=1.0) is None  # request 2 has not arrived yet
    assert sorted(scheduler.running) == [0, 1] and scheduler.running[1].length == 8
    assert scheduler.running[1].produced == 1  # the prefill gives the first token


def test_one_prefill_holds_at_most_the_token_budget_but_always_one_request():
    scheduler = Scheduler(8)
    big = memory.PREFILL_CHUNK_TOKENS
    scheduler.queue.extend([request(0, input_tokens=big + 1), request(1, input_tokens=4)])
    first = scheduler.admit(0.0)
    assert first is not None and [r.id for r in first.requests] == [0]  # over the budget alone: still admitted
    second = scheduler.admit(0.0)
    assert second is not None and [r.id for r in second.requests] == [1]


def test_under_a_backlog_admission_waits_for_a_share_of_free_rows():
    rows = 2 * ADMIT_DIVISOR
    scheduler = Scheduler(rows)
    scheduler.queue.extend(request(i, output_tokens=1 + i) for i in range(rows))
    assert scheduler.admit(0.0) is not None and scheduler.free_rows == 0
    scheduler.queue.extend(request(rows + i) for i in range(rows))  # the backlog
    assert scheduler.release() == [0] and scheduler.free_rows == 1  # request 0's one token: the prefill's
    assert scheduler.admit(0.0) is None  # one free row < rows / ADMIT_DIVISOR under a backlog
    eager = Scheduler(rows, admit_divisor=rows)  # the knob at its top: admit as soon as one row is free
    eager.queue.extend(request(i, output_tokens=1 + i) for i in range(2 * rows))
    eager.admit(0.0)
    assert eager.release() == [0] and eager.admit(0.0) is not None
    admit_all = Scheduler(rows, admit_all=True)
    admit_all.queue.extend(request(i, output_tokens=5) for i in range(rows + 1))
    admit_all.admit(0.0)
    admit_all.running.pop(0)
    admit_all.free.append(0)
    assert admit_all.admit(0.0) is not None  # a server's client sends whatever finds a row


def test_the_controlled_window_prefills_backlog_sized_steps_before_any_decode_and_moves_no_row():
    rows = 2 * ADMIT_DIVISOR
    step = backlog_step_requests(rows)
    scheduler = Scheduler(rows, controlled=True)
    prefill_only = [request(i, output_tokens=1) for i in range(step + 1)]  # the second step mixes both kinds
    scheduler.queue.extend([*prefill_only, *(request(step + 1 + i, output_tokens=4) for i in range(rows))])
    sizes = []
    while scheduler.queue:
        assert scheduler.decode() is None  # a queued request could take a free row: no decode yet
        plan = scheduler.admit(0.0)
        assert plan is not None
        sizes.append(len(plan.requests))
        scheduler.release()
    assert sizes == [step] * (len(sizes) - 1) + [sizes[-1]] and sum(sizes) == len(prefill_only) + rows
    assert scheduler.moved == 0 and sorted(scheduler.running) == list(range(rows))  # the freed rows refilled
    plan = scheduler.decode()
    assert plan is not None and plan.row_count == rows  # then every row decodes together
    budget = Scheduler(rows, controlled=True)  # a step stays within the token budget
    budget.queue.extend(request(i, input_tokens=memory.PREFILL_CHUNK_TOKENS // 2 + 1) for i in range(step))
    plan = budget.admit(0.0)
    assert plan is not None and len(plan.requests) == 1


def test_a_decode_plan_covers_the_running_rows_and_advances_their_mirrors():
    scheduler = Scheduler(6)
    scheduler.queue.extend([request(0, input_tokens=10), request(1, input_tokens=70), request(2, input_tokens=3)])
    scheduler.admit(0.0)
    plan = scheduler.decode()
    assert plan is not None and plan.members == [0, 1, 2] and plan.rows == [0, 1, 2]
    assert plan.amounts == [11, 71, 4]  # each attends to its filled positions + the new token's
    assert plan.row_count == rows_for(2, 6) and plan.attended == attended_length(71)
    assert [r.length for r in scheduler.running.values()] == [11, 71, 4]
    assert [r.produced for r in scheduler.running.values()] == [2, 2, 2]
    assert Scheduler(3).decode() is None


def test_running_requests_move_down_before_a_decode_step_where_that_lowers_its_row_bucket():
    scheduler = Scheduler(4)
    scheduler.queue.extend([request(0, output_tokens=2, warmup=True), request(1, output_tokens=9),
                            request(2, output_tokens=2), request(3, output_tokens=9)])
    scheduler.warmups_left = 1
    scheduler.admit(0.0)
    scheduler.decode()
    assert scheduler.release() == [0, 2] and scheduler.moved == 0  # releasing moves nothing
    assert scheduler.done == 2 and not scheduler.warming_up and scheduler.release() == []
    # two running requests in rows 1 and 3 would run bucket 4; packed they run bucket 2: request 3 (row 3) moves into
    # row 0 with its 8 + 1 filled positions, request 1 stays in row 1
    plan = scheduler.decode()
    assert plan is not None and plan.moves == [(3, 0, 9)] and plan.row_count == 2
    assert dict(zip(plan.members, plan.rows, strict=True)) == {3: 0, 1: 1} and plan.amounts == [10, 10]
    assert scheduler.running[0].row == 0 and sorted(scheduler.free) == [2, 3] and scheduler.moved == 1


def _serve(scheduler: Scheduler, steps: int) -> list[DecodePlan]:
    """Up to `steps` iterations of the load loop on the host: admit, decode, release."""
    plans = []
    for _ in range(steps):
        scheduler.admit(0.0)
        plan = scheduler.decode()
        if plan is None:
            break
        plans.append(plan)
        scheduler.release()
    return plans


def test_under_a_backlog_nothing_moves_and_a_drain_computes_at_most_an_eighth_more_rows_than_it_occupies():
    """A backlog refills the freed rows at its next admission: no cache row is copied (a move per finished request
    was the rule before). Once the queue closes, the running requests move down as they thin out, so every step of
    the drain runs the smallest bucket of its occupied rows: at most 12.5 % more rows from 8 rows up."""
    rows, rng = 64, np.random.default_rng(7)
    scheduler = Scheduler(rows)
    scheduler.queue.extend(request(i, output_tokens=int(rng.integers(20, 60))) for i in range(2000))
    backlog = _serve(scheduler, 400)
    assert len(backlog) == 400 and scheduler.queue and scheduler.done > 300
    assert scheduler.moved == 0 and all(not p.moves for p in backlog)
    occupied = np.array([len(p.members) for p in backlog[100:]])  # after the first requests' common start
    assert occupied.min() > rows - backlog_step_requests(rows)  # admitted before each step: under 1/16 empty
    scheduler.close_queue()
    drain = _serve(scheduler, 1000)
    assert scheduler.idle and scheduler.moved > 0
    for plan in drain:
        assert max(plan.rows) < plan.row_count == rows_for(len(plan.members) - 1, rows)
        assert len(plan.members) < 8 or plan.row_count <= len(plan.members) * 9 / 8


def test_closing_the_queue_leaves_the_running_requests():
    scheduler = Scheduler(1)
    scheduler.queue.extend([request(0), request(1)])
    scheduler.admit(0.0)
    scheduler.close_queue()
    assert not scheduler.queue and list(scheduler.running) == [0] and not scheduler.idle
