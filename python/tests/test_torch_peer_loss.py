"""Serving on when a process dies: 4 processes run pmoe.torch.EpMoE forwards (on_peer_loss="mask");
rank 3 is SIGKILLed between two forwards. Each survivor's next forward raises pmoe.PeerLost naming
rank 3, and every later forward equals a single-process model whose experts are the survivors'
(rank 3's experts add nothing; the other weights stay as the router gave them). With a placement
that puts every expert on two ranks, the survivors' later forwards equal the whole model: every
token of rank 3's experts goes to their other replica.

torchrun's agent stops every worker when one fails, so the processes are started the way a
server that must outlive one of them would start them: plain multiprocessing, one
torch.distributed group over a file store for set-up only (pmoe's ops never call it)."""
import multiprocessing
import os
import signal
import tempfile
import traceback

import pytest

torch = pytest.importorskip("torch")

WORLD, HIDDEN, FFN, EXPERTS, TOP_K, TOKENS = 4, 16, 24, 8, 2, 6
VICTIM, KILLED_AT, FORWARDS = 3, 2, 6  # rank 3 dies before forward 2 (0-based) of 6
# Every expert on two ranks: slots 0-7 (ranks 0 and 1) serve experts 0-7, slots 8-15 (ranks 2
# and 3) serve experts 4-7 and 0-3.
REPLICAS = list(range(EXPERTS)) + [(e + EXPERTS // 2) % EXPERTS for e in range(EXPERTS)]


def _dense_weights():
    g = torch.Generator().manual_seed(7)
    router = torch.randn(EXPERTS, HIDDEN, generator=g)
    w1 = torch.randn(EXPERTS, HIDDEN, FFN, generator=g) / HIDDEN ** 0.5
    w2 = torch.randn(EXPERTS, FFN, HIDDEN, generator=g) / FFN ** 0.5
    return router, w1, w2


def _tokens(call, rank):
    return torch.randn(TOKENS, HIDDEN, generator=torch.Generator().manual_seed(100 * call + rank))


def _survivors_model(x, router, w1, w2, live_experts):
    """The single-process model whose experts are the survivors': a lost expert adds nothing."""
    import pmoe.torch as pt
    indices, weights = pt.route(x, router, TOP_K)
    y = torch.zeros_like(x)
    for t in range(x.shape[0]):
        for j in range(TOP_K):
            e = int(indices[t, j])
            if e in live_experts:
                y[t] += weights[t, j] * pt.expert_forward(x[t:t + 1], w1[e], w2[e])[0]
    return y


def _worker(rank, store, results, placement):
    try:
        import torch.distributed as dist

        import pmoe
        import pmoe.torch as pt
        torch.set_num_threads(1)
        dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank,
                                world_size=WORLD)
        comm = pt.communicator()
        layer = pt.EpMoE(comm, hidden_dim=HIDDEN, ffn_dim=FFN, num_experts=EXPERTS, top_k=TOP_K,
                         max_tokens=TOKENS, on_peer_loss="mask", peer_timeout_s=20,
                         placement=placement)
        router, w1, w2 = _dense_weights()
        layer.load_dense(router, w1, w2)
        slot_expert = placement or list(range(EXPERTS))
        local = len(slot_expert) // WORLD
        lost, checked = [], 0
        with torch.no_grad():
            for call in range(FORWARDS):
                if call == KILLED_AT and rank == VICTIM:
                    os.kill(os.getpid(), signal.SIGKILL)
                x = _tokens(call, rank)
                try:
                    y = layer(x)
                    layer.check_errors()  # on CUDA: a loss the kernels met (a no-op here)
                except pmoe.PeerLost as e:
                    lost.append((e.ranks, e.first_call, e.last_call))
                    continue
                live = {e for s, e in enumerate(slot_expert) if layer.a2a.live_ranks[s // local]}
                if placement:
                    assert live == set(range(EXPERTS)), live  # a live replica of each expert
                want = _survivors_model(x, router, w1, w2, live)
                torch.testing.assert_close(y, want, rtol=1e-5, atol=1e-5)
                checked += 1
        assert lost == [([VICTIM], KILLED_AT + 1, KILLED_AT + 1)], lost
        assert layer.a2a.live_ranks == [r != VICTIM for r in range(WORLD)]
        assert checked == FORWARDS - 1, checked
        results.put((rank, "ok"))
    except BaseException:  # noqa: BLE001 - everything goes back to the test
        results.put((rank, traceback.format_exc()))
    finally:
        results.close()
        results.join_thread()  # the message is out before the process goes
        os._exit(0)  # gloo cannot shut down with a dead peer; pmoe's memory is already unlinked


@pytest.mark.parametrize("placement", [None, REPLICAS], ids=["no replicas", "replicas"])
def test_a_killed_process_leaves_the_others_serving(placement):
    context = multiprocessing.get_context("spawn")
    results = context.Queue()
    with tempfile.TemporaryDirectory() as work:
        store = os.path.join(work, "store")
        workers = [context.Process(target=_worker, args=(r, store, results, placement))
                   for r in range(WORLD)]
        for w in workers:
            w.start()
        outcome = {}
        for _ in range(WORLD - 1):
            rank, text = results.get(timeout=90)
            outcome[rank] = text
        for w in workers:
            w.join(timeout=30)
    assert workers[VICTIM].exitcode == -signal.SIGKILL
    assert outcome == {r: "ok" for r in range(WORLD) if r != VICTIM}, outcome
