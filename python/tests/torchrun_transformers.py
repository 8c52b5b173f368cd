"""pmoe as transformers' expert-parallel implementation, under torchrun: W processes (the tests
run 2 and 3), gloo, CPU. One launch runs every check (torchrun's and transformers' start-up is
the slow part):

- for each family (--families) and dtype (--dtypes), a small random model (hf_models.py) saved
  by rank 0 and loaded on every rank with DistributedConfig(fsdp_size=W / tp, tp_size=tp,
  ep_size=W, ep_implementation=NAME) for each NAME in --implementations ("pmoe", and transformers'
  own "all_to_all" as a cross-check);
- each rank (each TP group, with --tp) runs its own batch, of its own length, so that token counts
  differ between ranks; its logits and, after backward, every parameter's gradient (gathered
  whole) are compared with the single-process model run on the same batches;
- with --edges: a batch of one token under --tp 2 (one rank of each TP group has no rows), and
  pmoe's exchange growing when a batch outgrows it;
- with --errors: bad set-ups raise a clear error on every rank.

- with --wrong-rows: pmoe's dispatch hands the experts two of its rows swapped, and every
  model's check must then fail (the tolerances below still see a wrong exchange).

Tolerances: f32 within 1e-4 of a scale, bf16 within 4e-2 of it (the reference runs in bf16 too,
with its own roundings in other places). The scale of logits is their largest magnitude. The
scale of a gradient is its largest magnitude, but at least 1e-3 of the largest gradient of the
whole model: a gradient is a sum over tokens and ranks run in another order, whose rounding
follows the size of its terms, not of the sum, and a sum that cancels to near zero (q_proj's
with one token a rank) is off by what the terms' size gives, 1e-8 where the result is 1e-6,
for transformers' own implementation as for pmoe's. Exits non-zero if any check fails.
"""
import argparse
import os
import shutil
import sys
import tempfile
import traceback

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from hf_models import CORE_FAMILIES, save_tiny  # noqa: E402

torch.set_num_threads(1)  # W processes on a 2-core machine
DTYPES = {"f32": torch.float32, "bf16": torch.bfloat16}


def gathered(tensor):
    from torch.distributed.tensor import DTensor
    return tensor.full_tensor() if isinstance(tensor, DTensor) else tensor


GRADIENT_FLOOR = 1e-3  # of the model's largest gradient: the smallest scale a gradient is held to


def close(name, got, want, dtype, floor=0.0):
    """got within the dtype's tolerance of want, relative to the larger of want's largest
    magnitude and `floor`; returns the error relative to that scale."""
    got, want = got.detach().float(), want.detach().float()
    if got.shape != want.shape:
        raise AssertionError(f"{name}: shape {tuple(got.shape)} != {tuple(want.shape)}")
    if want.numel() == 0:
        return 0.0
    scale = max(want.abs().max().item(), floor, torch.finfo(torch.float32).tiny)
    err = (got - want).abs().max().item()
    bound = (1e-4 if dtype == torch.float32 else 4e-2) * scale
    if not err <= bound:
        raise AssertionError(f"{name}: max error {err:.3g} > {bound:.3g} (scale {scale:.3g})")
    return err / scale


def gradient_floor(grads):
    """The smallest scale any gradient of this model is held to (module docstring)."""
    return GRADIENT_FLOOR * max((g.detach().float().abs().max().item() for g in grads.values()
                                 if g.numel()), default=0.0)


def batches(world, tp, vocab, length):
    """One batch per data-parallel group (the ranks of a TP group share one), each of its own
    length: [1, length + 3 * group] token ids and labels."""
    gen = torch.Generator().manual_seed(1234)
    groups = world // tp
    return [torch.randint(0, vocab, (1, length + 3 * g), generator=gen) for g in range(groups)]


def loss_of(logits, ids, total):
    """Cross-entropy against the next token (the first, for the last) summed over the batch,
    over the tokens of every batch: every position has a target, one-token batches too."""
    return torch.nn.functional.cross_entropy(
        logits[0].float(), torch.roll(ids[0], -1), reduction="sum") / total


def reference(path, dtype, all_ids):
    """Logits and gradients of the single-process model on every batch."""
    from transformers import AutoModelForCausalLM
    model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype)
    total = sum(ids.shape[1] for ids in all_ids)
    logits = []
    for ids in all_ids:
        out = model(ids, use_cache=False).logits
        loss_of(out, ids, total).backward()
        logits.append(out.detach())
    grads = {name: p.grad.detach().clone() for name, p in model.named_parameters()
             if p.grad is not None}
    return logits, grads


def distributed(path, dtype, all_ids, impl, tp, ep=None):
    """The same on W ranks with ep_implementation=impl: this rank's logits and every gradient."""
    from transformers import AutoModelForCausalLM
    from transformers.distributed.configuration_utils import DistributedConfig
    world, rank = dist.get_world_size(), dist.get_rank()
    config = DistributedConfig(fsdp_size=world // tp, tp_size=tp, ep_size=ep or world,
                               ep_implementation=impl)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype, distributed_config=config)
    ids = all_ids[rank // tp]
    total = sum(i.shape[1] for i in all_ids)
    logits = model(ids, use_cache=False).logits
    # FSDP averages gradients over its ranks: scale so that the average is the total's gradient.
    (loss_of(logits, ids, total) * (world // tp)).backward()
    grads = {name: gathered(p.grad) for name, p in model.named_parameters() if p.grad is not None}
    return gathered(logits).detach(), grads


def check_model(family, dtype_name, impls, tp, length, ep=None):
    dtype = DTYPES[dtype_name]
    world, rank = dist.get_world_size(), dist.get_rank()
    tmp = tempfile.mkdtemp(prefix="pmoe-hf-") if rank == 0 else None
    shared = [None, None]
    if rank == 0:  # one model on disk, read by every rank
        shared = [os.path.join(tmp, family),
                  save_tiny(os.path.join(tmp, family), family, num_experts=2 * world).vocab_size]
    dist.broadcast_object_list(shared, src=0)
    path, vocab = shared
    try:
        all_ids = batches(world, tp, vocab, length)
        want_logits, want_grads = reference(path, dtype, all_ids)
        problems = []
        for impl in impls:
            got_logits, got_grads = distributed(path, dtype, all_ids, impl, tp, ep)  # collective
            # Local checks only from here, so that every rank stays in step; every tensor is
            # checked, and every failure reported.
            found = []

            def check(name, got, want, floor=0.0):
                try:
                    return close(f"{family} {dtype_name} {impl} {name}", got, want, dtype, floor)
                except AssertionError as failed:
                    found.append(str(failed))
                    return 0.0

            worst = check("logits", got_logits, want_logits[rank // tp])
            missing = set(want_grads) - set(got_grads)
            if missing:
                found.append(f"{family} {impl}: no gradient for {sorted(missing)}")
            floor = gradient_floor(want_grads)
            for name, want in want_grads.items():
                if name in got_grads:
                    worst = max(worst, check(f"grad {name}", got_grads[name], want, floor))
            if found:
                problems += found
                continue
            if rank == 0:
                print(f"ok {family} {dtype_name} {impl} tp={tp} ep={ep or world}: logits and "
                      f"{len(want_grads)} "
                      f"gradients within {worst:.2g} of the largest magnitude", flush=True)
        if problems:
            raise AssertionError("; ".join(problems))
    finally:
        dist.barrier()  # rank 0 removes the folder only when every rank is done with it
        if rank == 0:
            shutil.rmtree(tmp, ignore_errors=True)


class ToyExperts(torch.nn.Module):
    """Experts as transformers' experts modules present them to an EP implementation: local
    expert ids (num_experts, the local count, marks an off-rank slot), per-slot weights."""

    def __init__(self, weight):
        super().__init__()
        self.weight = torch.nn.Parameter(weight)  # [E_local, H, H]
        self.num_experts = weight.shape[0]

    def forward(self, hidden_states, top_k_index, top_k_weights):
        out = hidden_states.new_zeros(hidden_states.shape)
        for j in range(top_k_index.shape[1]):
            ids = top_k_index[:, j]
            on_rank = ids < self.num_experts
            rows = torch.einsum("nh,nhg->ng", hidden_states[on_rank],
                                self.weight[ids[on_rank]])
            out = out.index_add(0, on_rank.nonzero()[:, 0], rows * top_k_weights[on_rank, j:j + 1])
        return out


def check_direct(tokens_per_rank, hidden=8, local_experts=2, top_k=2, repeats=False):
    """PmoeEP called directly on ToyExperts, with this rank's tokens_per_rank[rank] tokens (0
    for some): output and the gradients of the tokens, the routing weights and the experts
    against a dense single-process computation over every rank's tokens."""
    from torch.distributed.device_mesh import init_device_mesh
    from pmoe.transformers import PmoeEP
    world, rank = dist.get_world_size(), dist.get_rank()
    mesh = init_device_mesh("cpu", (world, 1), mesh_dim_names=("ep", "tp"))
    experts_total = local_experts * world
    gen = torch.Generator().manual_seed(7)
    weight = torch.randn(experts_total, hidden, hidden, generator=gen) / hidden ** 0.5
    xs = [torch.randn(m, hidden, generator=gen) for m in tokens_per_rank]
    routes = [torch.rand(m, experts_total, generator=gen).topk(top_k, dim=-1) for m in
              tokens_per_rank]
    if repeats:  # every other token names its first expert twice, as hash routers can
        for route in routes:
            route.indices[::2, 1] = route.indices[::2, 0]
    first = rank * local_experts
    experts = ToyExperts(weight[first:first + local_experts].clone())
    layer = PmoeEP(experts, mesh["ep"], mesh["tp"])
    x = xs[rank].clone().requires_grad_()
    w = routes[rank].values.clone().requires_grad_()
    y = layer(x, routes[rank].indices, w)
    (y * torch.arange(1.0, hidden + 1)).sum().backward()
    # The reference: every rank's tokens through every expert, in one process.
    dense = weight.clone().requires_grad_()
    want_x = xs[rank].clone().requires_grad_()
    want_w = routes[rank].values.clone().requires_grad_()
    total = 0
    for r in range(world):
        xr = want_x if r == rank else xs[r]
        wr = want_w if r == rank else routes[r].values
        yr = torch.einsum("nh,nkhg,nk->ng", xr, dense[routes[r].indices], wr)
        total = total + (yr * torch.arange(1.0, hidden + 1)).sum()
        if r == rank:
            want_y = yr
    total.backward()
    close("direct y", y, want_y, torch.float32)
    close("direct grad x", x.grad, want_x.grad, torch.float32)
    close("direct grad weights", w.grad, want_w.grad, torch.float32)
    close("direct grad experts", experts.weight.grad,
          dense.grad[first:first + local_experts], torch.float32)
    if rank == 0:
        print(f"ok PmoeEP directly, tokens per rank {tokens_per_rank}"
              f"{', repeated experts' if repeats else ''}: output and gradients", flush=True)


def edges():
    """The direct checks; returns how many failed."""
    from pmoe.transformers import INITIAL_CAPACITY, _state
    world = dist.get_world_size()
    cases = [[5 + 4 * r if r != 1 else 0 for r in range(world)],  # rank 1 has no tokens
             [0] * world,                                          # nobody has any
             [3] * (world - 1) + [INITIAL_CAPACITY + 36]]          # the exchange must grow
    failures = 0
    for tokens, repeats in [(c, False) for c in cases] + [(cases[0], True)]:
        try:
            check_direct(tokens, repeats=repeats)
        except AssertionError:
            failures += 1
            print(f"FAIL on rank {dist.get_rank()}: PmoeEP directly, {tokens}", flush=True)
            traceback.print_exc()
    grown = [exchange.grown for exchange in _state.exchanges.values()]
    if grown != [2]:
        failures += 1
        print(f"FAIL: expected one exchange, built twice (grown once), got {grown}", flush=True)
    return failures


def expect_error(what, run, *needles):
    """run() must raise on this rank, with every needle in the message."""
    try:
        run()
    except Exception as error:  # the type is the library's to choose; the message is checked
        text = str(error)
        if all(needle in text for needle in needles):
            return
        raise AssertionError(f"{what}: the message does not name {needles}: {text}") from error
    raise AssertionError(f"{what}: no error")


def bad_setups():
    """Set-ups pmoe.transformers must refuse on every rank, clearly; returns the failures."""
    import pmoe
    import pmoe.torch
    import pmoe.transformers
    from transformers import AutoModelForCausalLM
    from transformers.distributed.configuration_utils import DistributedConfig
    world, rank = dist.get_world_size(), dist.get_rank()
    tmp = tempfile.mkdtemp(prefix="pmoe-hf-") if rank == 0 else None
    shared = [None, None]
    if rank == 0:  # world + 1 experts, which no EP size above 1 divides; and 2 * world
        shared = [os.path.join(tmp, "indivisible"), os.path.join(tmp, "even")]
        save_tiny(shared[0], "mixtral", num_experts=world + 1)
        save_tiny(shared[1], "mixtral", num_experts=2 * world)
    dist.broadcast_object_list(shared, src=0)

    def load(path):
        config = DistributedConfig(fsdp_size=world, ep_size=world, ep_implementation="pmoe")
        return AutoModelForCausalLM.from_pretrained(path, distributed_config=config)

    failures = 0
    # A pmoe communicator of one rank for a group of `world`.
    alone = [dist.new_group([r]) for r in range(world)][rank]
    cases = [("ep_size not dividing the experts", lambda: load(shared[0]),
              f"{world + 1} experts", f"{world}"),
             ("a communicator of another size",
              lambda: (pmoe.transformers.use_communicator(pmoe.torch.communicator(alone)),
                       load(shared[1])), "has 1 ranks", f"group has {world}")]

    for what, run, *needles in cases:
        try:
            expect_error(what, run, *needles)
            if rank == 0:
                print(f"ok error: {what}", flush=True)
        except AssertionError:
            failures += 1
            print(f"FAIL on rank {rank}: {what}", flush=True)
            traceback.print_exc()
        finally:
            pmoe.transformers.use_communicator(None)
    dist.barrier()
    if rank == 0:
        shutil.rmtree(tmp, ignore_errors=True)
    return failures


def swap_two_rows():
    """From here on, pmoe.transformers' dispatch hands its experts the first and last of the
    rows that arrived swapped (where two differ): an exchange that delivers wrong rows."""
    import pmoe.transformers as hf

    right = hf.dispatch_packed

    def wrong(a2a, x, indices, *args):
        out = right(a2a, x, indices, *args)
        rows = out[0]
        if rows.shape[0] >= 2 and not torch.equal(rows[0], rows[-1]):
            order = torch.arange(rows.shape[0], device=rows.device)
            order[0], order[-1] = rows.shape[0] - 1, 0
            rows = rows[order]
        return (rows,) + tuple(out[1:])

    hf.dispatch_packed = wrong


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--families", default=",".join(CORE_FAMILIES))
    parser.add_argument("--dtypes", default="f32")
    parser.add_argument("--implementations", default="pmoe,all_to_all")
    parser.add_argument("--tp", type=int, default=1)
    parser.add_argument("--ep", type=int, help="ep_size (default: every rank); below the world, "
                        "each expert lives on world / ep ranks, FSDP-sharded")
    parser.add_argument("--length", type=int, default=7, help="tokens of the first batch")
    parser.add_argument("--errors", action="store_true", help="only the bad set-ups")
    parser.add_argument("--wrong-rows", action="store_true",
                        help="pmoe's dispatch swaps two rows; every model check must fail")
    parser.add_argument("--edges", action="store_true",
                        help="also PmoeEP directly: a rank with no tokens, none at all, a batch "
                             "that outgrows the exchange")
    args = parser.parse_args()
    dist.init_process_group("gloo")
    import transformers
    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    if "pmoe" in args.implementations.split(","):
        import pmoe.transformers  # noqa: F401  registers "pmoe"
    failures = 0
    if args.errors:
        failures = bad_setups()
        dist.destroy_process_group()
        sys.exit(1 if failures else 0)
    if args.edges:
        failures += edges()
    if args.wrong_rows:
        swap_two_rows()
    for family in args.families.split(","):
        for dtype_name in args.dtypes.split(","):
            try:
                check_model(family, dtype_name, args.implementations.split(","), args.tp,
                            args.length, args.ep)
            except AssertionError as failed:
                # As it must, gradients included (each held to at least the model-wide floor).
                if args.wrong_rows and " pmoe grad " in str(failed):
                    print(f"ok on rank {dist.get_rank()}: {family} {dtype_name} with two rows "
                          f"swapped fails: {str(failed)[:160]}", flush=True)
                    continue
                failures += 1
                print(f"FAIL on rank {dist.get_rank()}: {family} {dtype_name}", flush=True)
                traceback.print_exc()
            except Exception:  # report every failing family, then fail
                failures += 1
                print(f"FAIL on rank {dist.get_rank()}: {family} {dtype_name}", flush=True)
                traceback.print_exc()
            else:
                if args.wrong_rows:
                    failures += 1
                    print(f"FAIL on rank {dist.get_rank()}: {family} {dtype_name} passed with "
                          f"two of pmoe's rows swapped", flush=True)
    dist.destroy_process_group()
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
