"""A NumPy reference for AllToAll, written for clarity (plain loops), independent of the C++ one.

bf16 travels as uint16 bit patterns (NumPy has no bf16); helpers convert with round to nearest
even, as pmoe does.
"""
import numpy as np


def bf16_bits_to_f32(bits):
    return (bits.astype(np.uint32) << 16).view(np.float32)


def f32_to_bf16_bits(values):
    u = np.ascontiguousarray(values, dtype=np.float32).view(np.uint32)
    rounded = (u + np.uint32(0x7FFF) + ((u >> 16) & 1)) >> 16
    return rounded.astype(np.uint16)


def to_f32(array, dtype):
    return bf16_bits_to_f32(array) if dtype == "bf16" else array.astype(np.float32)


def from_f32(values, dtype):
    if dtype == "bf16":
        return f32_to_bf16_bits(values)
    return values.astype({"f32": np.float32, "f16": np.float16}[dtype])


NUMPY_DTYPE = {"f32": np.float32, "f16": np.float16, "bf16": np.uint16}


def make_inputs(rank, m, num_experts, top_k, hidden, dtype, seed, drop=0.0):
    """One rank's tokens, routing and weights; the same on every rank that builds them."""
    rng = np.random.default_rng([seed, rank])
    x = from_f32(rng.uniform(-2, 2, size=(m, hidden)).astype(np.float32), dtype)
    indices = np.array([rng.permutation(num_experts)[:top_k] for _ in range(m)], dtype=np.int32)
    indices = indices.reshape(m, top_k)
    if drop:
        indices[rng.uniform(size=indices.shape) < drop] = -1
    weights = rng.uniform(0.05, 1.05, size=(m, top_k)).astype(np.float32)
    return x, indices, weights


def expected_dispatch(all_inputs, rank, world_size, num_experts):
    """Per local expert of `rank`: the rows it receives, ordered by (source rank, token)."""
    local = num_experts // world_size
    rows = []
    for e in range(local):
        expert = rank * local + e
        chosen = []
        for x, indices, _ in all_inputs:
            for t in range(x.shape[0]):
                if expert in indices[t]:
                    chosen.append(x[t])
        rows.append(chosen)
    return rows


def expert_fn(x_f32, expert):
    """The stand-in expert of the tests: v -> v * (1 + expert / 8), in float32."""
    return x_f32 * np.float32(1.0 + 0.125 * expert)


def expected_combine(x, indices, weights, in_dtype, expert_y_dtype, out_dtype):
    """y[t] = sum_j weights[t, j] * expert_y row of (t, j), in float32, in j order."""
    m, hidden = x.shape
    y = np.zeros((m, hidden), dtype=np.float32)
    for t in range(m):
        acc = np.zeros(hidden, dtype=np.float32)
        for j in range(indices.shape[1]):
            expert = indices[t, j]
            if expert < 0:
                continue
            out = from_f32(expert_fn(to_f32(x[t], in_dtype), expert), expert_y_dtype)
            acc = acc + np.float32(weights[t, j]) * to_f32(out, expert_y_dtype)
        y[t] = acc
    return from_f32(y, out_dtype)


def check_f32_round_trip(outcome, inputs, world_size, num_experts, y_rtol=0.0):
    """Checks each rank's (counts, expert_x, y) from an f32 dispatch, the stand-in experts of
    expert_fn and a combine, against the reference; `outcome` maps rank to that triple. y must
    match bit for bit unless y_rtol > 0 (a combine that sums in another order)."""
    for r in range(world_size):
        counts, expert_x, y = outcome[r]
        want = expected_dispatch(inputs, r, world_size, num_experts)
        for e in range(len(counts)):
            assert counts[e] == len(want[e])
            if want[e]:
                np.testing.assert_array_equal(expert_x[e, :counts[e]], np.stack(want[e]))
        x, indices, weights = inputs[r]
        want_y = expected_combine(x, indices, weights, "f32", "f32", "f32")
        if y_rtol > 0:
            np.testing.assert_allclose(y, want_y, rtol=y_rtol, atol=y_rtol * np.abs(want_y).max())
        else:
            np.testing.assert_array_equal(y, want_y)
