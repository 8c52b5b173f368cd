"""A new process in a SIGKILLed rank's place, through the Python module: 4 processes (forked, one
node, a SocketCommunicator over 127.0.0.1), an AllToAll with on_peer_loss="mask". Rank 2 kills
itself between two calls; each survivor's next call raises pmoe.PeerLost naming it, and two more
go on without it (their dispatch checked against the reference in which rank 2 sends nothing).
The survivors refuse to admit a rank whose process lives, then admit a new process
(SocketCommunicator.replacing, AllToAll(..., replacing=True)); every later call of every rank,
the newcomer's included, equals the reference at full size, with one call number everywhere."""
import multiprocessing
import os
import signal
import traceback

import numpy as np

import pmoe
from reference import expected_combine, expected_dispatch, expert_fn, make_inputs

WORLD, VICTIM, KILLED_BEFORE = 4, 2, 3  # rank 2 dies before its call 3
MAX_TOKENS, HIDDEN, TOP_K, EXPERTS = 5, 16, 2, 8
CONFIG = dict(max_tokens=MAX_TOKENS, num_experts=EXPERTS, top_k=TOP_K,
              hidden_dim=HIDDEN, in_dtype="f32", out_dtype="f32", on_peer_loss="mask",
              peer_timeout_s=10.0)


def _call(a2a, rank, silent=()):
    """One call, numbered as every rank numbers it, checked against the reference in which the
    `silent` ranks send nothing (y only when nobody is silent). Returns the call's number."""
    call = a2a.calls_started + 1
    inputs = [make_inputs(r, 0 if r in silent else MAX_TOKENS - (r + call) % 3, EXPERTS, TOP_K,
                          HIDDEN, "f32", seed=900 + call) for r in range(WORLD)]
    x, indices, weights = inputs[rank]
    local, rows = a2a.num_local_experts, WORLD * MAX_TOKENS
    counts = np.zeros(local, dtype=np.int32)
    expert_x = np.zeros((local, rows, HIDDEN), dtype=np.float32)
    expert_y = np.zeros((local, rows, HIDDEN), dtype=np.float32)
    y = np.zeros((len(x), HIDDEN), dtype=np.float32)
    a2a.dispatch(x, indices, counts, expert_x)
    want = expected_dispatch(inputs, rank, WORLD, EXPERTS)
    for e in range(local):
        assert counts[e] == len(want[e]), (call, e, counts, [len(w) for w in want])
        if want[e]:
            np.testing.assert_array_equal(expert_x[e, :counts[e]], np.stack(want[e]))
        expert_y[e, :counts[e]] = expert_fn(expert_x[e, :counts[e]], rank * local + e)
    a2a.combine(expert_y, indices, weights, y)
    if not silent:
        np.testing.assert_array_equal(y, expected_combine(x, indices, weights, "f32", "f32", "f32"))
    return call


def _rank(rank, listener, addresses, nodes, job, results):
    try:
        comm = pmoe.SocketCommunicator(listener, rank, addresses, nodes, job)
        a2a = pmoe.AllToAll(comm, **CONFIG)
        losses, masked = [], 0
        while masked < 2:
            if rank == VICTIM and a2a.calls_started + 1 == KILLED_BEFORE:
                os.kill(os.getpid(), signal.SIGKILL)
            silent = () if a2a.live_ranks[VICTIM] else (VICTIM,)
            try:
                _call(a2a, rank, silent)
                masked += bool(silent)
            except pmoe.PeerLost as lost:
                losses.append((lost.ranks, lost.first_call, lost.last_call))
        assert losses == [([VICTIM], KILLED_BEFORE, KILLED_BEFORE)], losses
        live_peer = 1 if rank == 0 else 0
        try:
            comm.admit(live_peer)
            raise AssertionError("admitting a rank whose process lives was not refused")
        except pmoe.Error as e:
            assert "still open" in str(e), e
        comm.admit(VICTIM)
        a2a.admit(VICTIM)
        calls = [_call(a2a, rank) for _ in range(3)]
        comm.barrier()  # nobody leaves while a peer's last call may still wait for it
        results.put((rank, "ok", calls))
    except BaseException:
        results.put((rank, traceback.format_exc(), None))


def _newcomer(listener, addresses, nodes, job, results):
    try:
        comm = pmoe.SocketCommunicator.replacing(listener, VICTIM, addresses, nodes, job)
        a2a = pmoe.AllToAll(comm, **CONFIG, replacing=True)
        assert a2a.live_ranks == [True] * WORLD, a2a.live_ranks
        calls = [_call(a2a, VICTIM) for _ in range(3)]
        comm.barrier()
        results.put(("newcomer", "ok", calls))
    except BaseException:
        results.put(("newcomer", traceback.format_exc(), None))


def test_a_new_process_takes_a_killed_ranks_place_and_the_group_is_whole_again():
    fork = multiprocessing.get_context("fork")
    results = fork.Queue()
    listeners = [pmoe.SocketListener("127.0.0.1") for _ in range(WORLD)]
    addresses = [f"127.0.0.1:{listener.port}" for listener in listeners]
    nodes, job = ["n0"] * WORLD, f"replace.{os.getpid()}"
    ranks = [fork.Process(target=_rank, args=(r, listeners[r], addresses, nodes, job, results))
             for r in range(WORLD)]
    for p in ranks:
        p.start()
    try:
        ranks[VICTIM].join(60)
        assert ranks[VICTIM].exitcode == -signal.SIGKILL, ranks[VICTIM].exitcode
        listener = pmoe.SocketListener("127.0.0.1")
        mine = list(addresses)
        mine[VICTIM] = f"127.0.0.1:{listener.port}"
        newcomer = fork.Process(target=_newcomer, args=(listener, mine, nodes, job, results))
        newcomer.start()
        got = {}
        for _ in range(WORLD):
            who, verdict, calls = results.get(timeout=60)
            assert verdict == "ok", f"{who}: {verdict}"
            got[who] = calls
        assert len({tuple(c) for c in got.values()}) == 1, got  # one numbering on every rank
        newcomer.join(30)
        assert newcomer.exitcode == 0
    finally:
        for p in ranks + ([newcomer] if "newcomer" in locals() else []):
            if p.is_alive():
                p.kill()
            p.join()
