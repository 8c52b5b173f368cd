"""pmoe.AllToAll on NumPy arrays with thread ranks, against the NumPy reference in reference.py."""
import threading

import numpy as np
import pytest

import pmoe
from reference import (NUMPY_DTYPE, expected_combine, expected_dispatch, expert_fn, from_f32,
                       make_inputs, to_f32)


def run_case(world_size, *, in_dtype="f32", out_dtype="f32", max_tokens=6, experts_per_rank=2,
             top_k=3, hidden=24, calls=2, drop=0.0, zero_on_odd=False, split=False,
             in_place=False, index_dtype=np.int32):
    """Runs `calls` dispatch + combine calls on thread ranks; every rank checks its outputs."""
    num_experts = experts_per_rank * world_size
    top_k = min(top_k, num_experts)
    errors = []

    def rank_main(comm):
        a2a = pmoe.AllToAll(comm, max_tokens=max_tokens, num_experts=num_experts,
                            top_k=top_k, hidden_dim=hidden, in_dtype=in_dtype,
                            out_dtype=out_dtype, in_place_buffers=in_place)
        local, rows = a2a.num_local_experts, world_size * max_tokens
        counts = np.zeros(local, dtype=np.int32)
        expert_x = np.zeros((local, rows, hidden), dtype=NUMPY_DTYPE[in_dtype])
        expert_y_dtype = out_dtype if in_place else in_dtype
        expert_y = (a2a.expert_output_buffer() if in_place
                    else np.zeros((local, rows, hidden), dtype=NUMPY_DTYPE[expert_y_dtype]))
        for call in range(calls):
            def tokens(r):
                return 0 if zero_on_odd and r % 2 else max_tokens - (r + call) % 3
            inputs = [make_inputs(r, tokens(r), num_experts, top_k, hidden, in_dtype,
                                  seed=100 + call, drop=drop) for r in range(world_size)]
            x, indices, weights = inputs[comm.rank]
            indices = indices.astype(index_dtype)
            if in_place:
                a2a.input_buffer()[:len(x)] = x
                x = a2a.input_buffer()[:len(x)]
            y = np.zeros((len(x), hidden), dtype=NUMPY_DTYPE[out_dtype])

            phases = ["send", "recv"] if split else ["both"]
            for phase in phases:
                a2a.dispatch(x, indices, counts, expert_x, phase=phase)
            want = expected_dispatch(inputs, comm.rank, world_size, num_experts)
            for e in range(local):
                assert counts[e] == len(want[e]), f"rank {comm.rank} expert {e}"
                if want[e]:
                    np.testing.assert_array_equal(expert_x[e, :counts[e]], np.stack(want[e]))
                    expert = comm.rank * local + e
                    expert_y[e, :counts[e]] = from_f32(
                        expert_fn(to_f32(expert_x[e, :counts[e]], in_dtype), expert),
                        expert_y_dtype)
            for phase in phases:
                a2a.combine(expert_y, indices, weights, y, phase=phase)
            np.testing.assert_array_equal(
                y, expected_combine(inputs[comm.rank][0], indices, weights, in_dtype,
                                    expert_y_dtype, out_dtype))

    def guarded(comm):
        try:
            rank_main(comm)
        except AssertionError as e:  # keep going: peers must not wait for this rank
            errors.append(f"rank {comm.rank}: {e}")
            raise

    pmoe.run_ranks(world_size, guarded)
    assert not errors


@pytest.mark.parametrize("world_size", [1, 2, 4])
@pytest.mark.parametrize("dtypes", [("f32", "f32"), ("f16", "f32"), ("bf16", "bf16")])
def test_matches_numpy_reference(world_size, dtypes):
    run_case(world_size, in_dtype=dtypes[0], out_dtype=dtypes[1])


@pytest.mark.parametrize("world_size", [1, 3])
def test_int64_indices_as_torch_topk_gives_them(world_size):
    run_case(world_size, drop=0.25, index_dtype=np.int64)


def test_ranks_with_different_configs_all_raise():
    """A mismatch crashed the process (num_experts) or waited out the timeout (other fields)."""
    seen = []

    def rank_main(comm):
        with pytest.raises(pmoe.Error, match=r"the ranks' configs differ in num_experts "
                                             r"\(4 on rank 0; 8 on rank 1\)"):
            small_op(comm, num_experts=4 * (comm.rank + 1))
        seen.append(comm.rank)
    pmoe.run_ranks(2, rank_main)
    assert sorted(seen) == [0, 1]


def test_no_tokens_on_odd_ranks_and_dropped_slots():
    run_case(4, zero_on_odd=True, drop=0.3, calls=3)


def test_top_k_equals_experts():
    run_case(2, experts_per_rank=2, top_k=4)


def test_split_phases():
    run_case(2, split=True, calls=3)


def test_in_place_buffers():
    run_case(2, in_dtype="bf16", out_dtype="bf16", in_place=True, calls=3)


def test_ranks_run_in_parallel_with_the_gil_released():
    # Rank 0 waits in dispatch for rank 1, which can only call dispatch if the GIL is free.
    seen = set()
    def rank_main(comm):
        seen.add(threading.get_ident())
        run = pmoe.AllToAll(comm, max_tokens=2, num_experts=2, top_k=1,
                            hidden_dim=8, in_dtype="f32", out_dtype="f32")
        x, indices = np.ones((2, 8), np.float32), np.full((2, 1), 1 - comm.rank, np.int32)
        counts, expert_x = np.zeros(1, np.int32), np.zeros((1, 4, 8), np.float32)
        run.dispatch(x, indices, counts, expert_x)
        assert counts[0] == 2
    pmoe.run_ranks(2, rank_main)
    assert len(seen) == 2


def small_op(comm, **overrides):
    args = dict(max_tokens=4, num_experts=4, top_k=2, hidden_dim=8,
                in_dtype="f32", out_dtype="f32")
    args.update(overrides)
    return pmoe.AllToAll(comm, **args)


def expect_error(fn, message):
    def rank_main(comm):
        with pytest.raises(pmoe.Error, match=message):
            fn(comm)
    pmoe.run_ranks(1, rank_main)


def test_bad_config_raises_with_message():
    expect_error(lambda comm: small_op(comm, top_k=5),
                 r"top_k must be in \[1, num_experts = 4\], got 5")
    expect_error(lambda comm: small_op(comm, in_dtype="f64"), "unknown dtype 'f64'")
    expect_error(lambda comm: small_op(comm, cross_node="ring"),
                 "cross_node must be 'direct' or 'hierarchical', got 'ring'")
    expect_error(lambda comm: small_op(comm, cross_node="hierarchical"), "ranks_per_node")


def test_bad_arrays_raise_with_message():
    def wrong_dtype(comm):
        op = small_op(comm)
        op.dispatch(np.zeros((2, 8), np.float16), np.zeros((2, 2), np.int32),
                    np.zeros(4, np.int32), np.zeros((4, 4, 8), np.float32))
    expect_error(wrong_dtype, r"`x` must be f32 \(float32\), got f16 \(float16\)")

    def bad_index(comm):
        op = small_op(comm)
        op.dispatch(np.zeros((2, 8), np.float32), np.array([[0, 1], [2, 7]], np.int32),
                    np.zeros(4, np.int32), np.zeros((4, 4, 8), np.float32))
    expect_error(bad_index, r"indices\[1, 1\] = 7 is outside \[-1, 4\)")

    def unsupported(comm):
        op = small_op(comm)
        op.dispatch(np.zeros((2, 8), np.float64), np.zeros((2, 2), np.int32),
                    np.zeros(4, np.int32), np.zeros((4, 4, 8), np.float32))
    expect_error(unsupported, "`x`: pmoe takes no float64 arrays; pass float32")

    def float_indices(comm):
        op = small_op(comm)
        op.dispatch(np.zeros((2, 8), np.float32), np.zeros((2, 2), np.float32),
                    np.zeros(4, np.int32), np.zeros((4, 4, 8), np.float32))
    expect_error(float_indices, r"`indices` holds expert indices: it must be i32 or i64 "
                                r"\(int32 or int64; torch.topk's int64 works as it is\), got f32")

    expect_error(lambda comm: small_op(comm).dispatch(
        np.zeros((2, 8), np.float32), np.zeros((2, 2), np.int32), np.zeros(4, np.int32),
        np.zeros((4, 4, 8), np.float32), phase="later"), "phase must be 'both', 'send' or 'recv'")


def test_docstrings_say_int64_indices_work():
    for method in (pmoe.AllToAll.dispatch, pmoe.AllToAll.combine):
        assert "int32 or int64" in method.__doc__, method.__doc__




def test_packed_rows_land_in_exactly_their_number():
    """packed_expert_rows: dispatch(send), arriving_rows(), an [n, H] expert_x, dispatch(recv),
    then combine from an [n, H] expert_y, as pmoe.torch's in-place ops do."""
    W, local, k, H = 2, 2, 3, 16

    def rank_main(comm):
        a2a = pmoe.AllToAll(comm, max_tokens=5, num_experts=W * local, top_k=k,
                            hidden_dim=H, in_dtype="f32", out_dtype="f32",
                            packed_expert_rows=True)
        for call in range(3):
            inputs = [make_inputs(r, 5 - (r + call) % 3, W * local, k, H, "f32", seed=7 + call,
                                  drop=0.25) for r in range(W)]
            x, indices, weights = inputs[comm.rank]
            counts = np.zeros(local, dtype=np.int32)
            a2a.dispatch(x, indices, counts, np.zeros((0, H), np.float32), phase="send")
            n = a2a.arriving_rows()
            want = expected_dispatch(inputs, comm.rank, W, W * local)
            assert n == sum(len(rows) for rows in want)
            expert_x = np.zeros((n, H), np.float32)
            a2a.dispatch(x, indices, counts, expert_x, phase="recv")
            assert counts.tolist() == [len(rows) for rows in want]
            packed = [row for rows in want for row in rows]
            if packed:
                np.testing.assert_array_equal(expert_x, np.stack(packed))
            ids = np.repeat(comm.rank * local + np.arange(local), counts)
            expert_y = np.stack([expert_fn(row, e) for row, e in zip(expert_x, ids)]) if n else \
                np.zeros((0, H), np.float32)
            y = np.zeros((len(x), H), np.float32)
            a2a.combine(expert_y.astype(np.float32), indices, weights, y)
            np.testing.assert_array_equal(y, expected_combine(x, indices, weights, "f32", "f32",
                                                              "f32"))
    pmoe.run_ranks(W, rank_main)


def test_arriving_rows_needs_packed_rows():
    def rank_main(comm):
        with pytest.raises(pmoe.Error, match="set AllToAllConfig::packed_expert_rows"):
            small_op(comm).arriving_rows()
    pmoe.run_ranks(1, rank_main)


def run_checked(world_size, rank_main):
    """Runs rank_main(comm) on world_size thread ranks. A rank's failed assertion is kept, and the
    rank still meets the others at the end, as a rank that stopped calling keeps its op until
    every rank is done; the test then fails with every rank's."""
    errors, done = [], threading.Barrier(world_size)

    def checked(comm):
        try:
            rank_main(comm)
        except AssertionError as e:
            errors.append(f"rank {comm.rank}: {e}")
        finally:
            done.wait(timeout=120)

    pmoe.run_ranks(world_size, checked)
    assert not errors, errors


@pytest.mark.parametrize("masked_experts", ["drop", "renormalize"])
def test_replicas_and_a_masked_rank(masked_experts):
    """4 ranks, 8 logical experts on 16 slots (two replicas each, rank r + 2 holding rank r's):
    outputs equal the no-failure reference before and after rank 3 stops and the others mask it.
    Without the placement the same mask drops rank 3's experts (the rest renormalised, or not)."""
    world_size, max_tokens, hidden, top_k = 4, 5, 16, 3
    for placed in (True, False):
        slots = 16 if placed else 8
        logical = 8
        placement = [s % logical for s in range(slots)] if placed else None

        def rank_main(comm):
            a2a = pmoe.AllToAll(comm, max_tokens=max_tokens, num_experts=slots,
                                top_k=top_k, hidden_dim=hidden, in_dtype="f32",
                                out_dtype="f32", placement=placement, rank_mask=True,
                                masked_experts=masked_experts)
            local, rows = a2a.num_local_experts, world_size * max_tokens
            counts = np.zeros(local, dtype=np.int32)
            expert_x = np.zeros((local, rows, hidden), dtype=np.float32)
            expert_y = np.zeros((local, rows, hidden), dtype=np.float32)
            live = [True] * world_size
            for call in range(4):
                if call == 2:
                    if comm.rank == 3:
                        return  # stops calling; keeps its op until every rank is done
                    a2a.mask_rank(3, "drained")
                    live[3] = False
                    assert a2a.live_ranks == live
                    assert a2a.mask_reasons[3] == "drained"
                    assert a2a.lost_experts() == ([] if placed else [6, 7])
                inputs = [make_inputs(r, max_tokens - (r + call) % 3, logical, top_k, hidden,
                                      "f32", seed=300 + call) for r in range(world_size)]
                x, indices, weights = inputs[comm.rank]
                y = np.zeros((len(x), hidden), dtype=np.float32)
                a2a.dispatch(x, indices, counts, expert_x)
                for e in range(local):
                    slot = comm.rank * local + e
                    expert = placement[slot] if placed else slot
                    expert_y[e, :counts[e]] = expert_fn(expert_x[e, :counts[e]], expert)
                a2a.combine(expert_y, indices, weights, y)
                # The reference with the mask this call used: an expert on no live rank
                # is dropped, and with renormalize the token's other weights rescaled.
                want_indices, want_weights = indices.copy(), weights.copy()
                for t in range(len(x)):
                    lost = False
                    for j in range(top_k):
                        e = want_indices[t, j]
                        served = [s for s in range(slots)
                                  if (placement[s] if placed else s) == e and live[s // local]]
                        if not served:
                            want_indices[t, j], lost = -1, True
                    kept = np.float32(0)
                    for j in range(top_k):
                        if want_indices[t, j] >= 0:
                            kept = np.float32(kept + want_weights[t, j])
                    if masked_experts == "renormalize" and lost and kept > 0:
                        want_weights[t] = (want_weights[t] / kept).astype(np.float32)
                np.testing.assert_array_equal(
                    y, expected_combine(x, want_indices, want_weights, "f32", "f32", "f32"))

        run_checked(world_size, rank_main)


def test_on_peer_loss_mask_goes_on_without_a_rank_that_stops_and_takes_it_back():
    """3 ranks, every expert on two ranks: rank 2 stops calling, the others find it lost after
    peer_timeout_s, get one pmoe.PeerLost for that call, and go on; later they unmask it and it
    rejoins. Every call any rank finishes equals the no-failure reference."""
    world_size, max_tokens, hidden, top_k, slots, logical = 3, 5, 16, 3, 12, 6
    placement = [s % logical for s in range(slots)]
    assert issubclass(pmoe.PeerLost, pmoe.Error)

    def rank_main(comm):
        a2a = pmoe.AllToAll(comm, max_tokens=max_tokens, num_experts=slots,
                            top_k=top_k, hidden_dim=hidden, in_dtype="f32",
                            out_dtype="f32", placement=placement, on_peer_loss="mask",
                            peer_timeout_s=1.0)
        local, rows = a2a.num_local_experts, world_size * max_tokens
        counts = np.zeros(local, dtype=np.int32)
        expert_x = np.zeros((local, rows, hidden), dtype=np.float32)
        expert_y = np.zeros((local, rows, hidden), dtype=np.float32)
        losses, stopped = [], False
        while a2a.calls_started < 8:
            call = a2a.calls_started  # the survivors agree on it after a loss
            if call == 2 and comm.rank == 2 and not stopped:
                stopped = True  # stops calling, then comes back when the others unmask it
                a2a.rejoin()
                assert a2a.calls_started == 5, a2a.calls_started
                continue
            if call == 5 and comm.rank != 2 and not a2a.live_ranks[2]:
                a2a.unmask_rank(2)
            inputs = [make_inputs(r, max_tokens - (r + call) % 3, logical, top_k, hidden,
                                  "f32", seed=500 + call) for r in range(world_size)]
            x, indices, weights = inputs[comm.rank]
            y = np.zeros((len(x), hidden), dtype=np.float32)
            try:
                a2a.dispatch(x, indices, counts, expert_x)
                for e in range(local):
                    expert = placement[comm.rank * local + e]
                    expert_y[e, :counts[e]] = expert_fn(expert_x[e, :counts[e]], expert)
                a2a.combine(expert_y, indices, weights, y)
            except pmoe.PeerLost as lost:
                losses.append((lost.ranks, lost.first_call, lost.last_call,
                               a2a.calls_started))
                assert a2a.mask_reasons[2].startswith("lost: "), a2a.mask_reasons
                continue
            np.testing.assert_array_equal(
                y, expected_combine(x, indices, weights, "f32", "f32", "f32"))
        assert losses == ([] if comm.rank == 2 else [([2], 3, 3, 3)]), losses
        assert a2a.live_ranks == [True, True, True]

    run_checked(world_size, rank_main)


def test_a_placement_that_leaves_an_expert_without_a_slot_raises():
    def rank_main(comm):
        with pytest.raises(pmoe.Error, match="logical expert 2 has no slot"):
            pmoe.AllToAll(comm, max_tokens=2, num_experts=4, top_k=2,
                          hidden_dim=8, placement=[0, 1, 0, 1], num_logical_experts=3)
    pmoe.run_ranks(2, rank_main)
