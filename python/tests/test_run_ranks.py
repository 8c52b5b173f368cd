"""pmoe.run_ranks on 1 to 3 thread ranks: the first rank to raise has its own exception reach the
caller (its type, its traceback through fn, a note naming the rank), and pmoe's own errors are
pmoe.Error by that name."""
import traceback

import pytest

import pmoe


def give_up(rank):
    raise ValueError(f"rank {rank} gives up")


def test_a_ranks_value_error_arrives_as_itself():
    def rank_main(comm):
        if comm.rank == 1:
            give_up(comm.rank)
        comm.barrier()  # the others wait here until rank 1's failure releases them
    with pytest.raises(ValueError, match="rank 1 gives up") as caught:
        pmoe.run_ranks(3, rank_main)
    assert type(caught.value) is ValueError
    frames = [frame.name for frame in traceback.extract_tb(caught.value.__traceback__)]
    assert "rank_main" in frames and "give_up" in frames, frames
    assert "raised on rank 1 of 3 (pmoe.run_ranks)" in getattr(caught.value, "__notes__", [])
    # No traceback pasted into the message: the message is the rank's own.
    assert str(caught.value) == "rank 1 gives up"


def test_a_ranks_torch_runtime_error_arrives_as_itself():
    torch = pytest.importorskip("torch")

    def rank_main(comm):
        torch.zeros(2, 3) @ torch.zeros(2, 3)  # a shape error inside torch: RuntimeError
    with pytest.raises(RuntimeError, match="cannot be multiplied") as caught:
        pmoe.run_ranks(1, rank_main)
    assert type(caught.value) is RuntimeError  # not pmoe.Error, which is a RuntimeError too


def test_a_ranks_assertion_arrives_as_itself():
    def rank_main(comm):
        assert comm.size == 5, "two ranks, not five"
    with pytest.raises(AssertionError, match="two ranks, not five"):
        pmoe.run_ranks(2, rank_main)


def test_pmoe_errors_inside_a_rank_stay_pmoe_error():
    def rank_main(comm):
        pmoe.AllToAll(comm, max_tokens=4, num_experts=4, top_k=5, hidden_dim=8)
    with pytest.raises(pmoe.Error, match="top_k must be in") as caught:
        pmoe.run_ranks(1, rank_main)
    assert type(caught.value) is pmoe.Error


def test_error_type_is_named_pmoe_error():
    assert pmoe.Error.__module__ == "pmoe" and pmoe.Error.__qualname__ == "Error"
    assert repr(pmoe.Error) == "<class 'pmoe.Error'>"
    assert issubclass(pmoe.Error, RuntimeError)
    with pytest.raises(pmoe.Error) as caught:
        pmoe.zeros([2], "f32", "cuda:x")
    shown = traceback.format_exception_only(caught.type, caught.value)[-1]
    assert shown.startswith("pmoe.Error: device must be 'cpu' or 'cuda:N'"), shown


def test_caller_can_run_ranks_again_after_a_failure():
    with pytest.raises(ValueError):
        pmoe.run_ranks(2, lambda comm: give_up(comm.rank))
    ranks = []
    pmoe.run_ranks(2, lambda comm: ranks.append(comm.rank))
    assert sorted(ranks) == [0, 1]
