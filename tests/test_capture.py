"""Properties of the capture-size rule, checked against vLLM's grid and a brute-force search."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rocm_dspark.recipe.capture import capture_size, vllm_capture_grid
from rocm_dspark.errors import UsageError


def brute_force_smallest(tokens: int, cap: int):
    """Independent reference: scan upwards for the first power of two >= max(8, tokens)."""
    for size in range(8, cap + 1):
        if size >= tokens and (size & (size - 1)) == 0:
            return size
    return None


@settings(max_examples=400, deadline=None)
@given(mns=st.integers(1, 2048), k=st.integers(1, 5), cap=st.sampled_from([512, 1024, 2048, 4096, 8192]))
def test_capture_size_properties(mns, k, cap):
    tokens = mns * (1 + k)
    expected = brute_force_smallest(tokens, cap)
    if expected is None:
        with pytest.raises(UsageError, match="exceeds the cap"):
            capture_size(mns, k, cap)
        return
    size = capture_size(mns, k, cap)
    assert size >= tokens                                   # covers a full verify batch
    assert size & (size - 1) == 0 and size >= 8             # a power of two from 8 up
    assert size == expected                                 # and the smallest such
    assert size <= cap                                      # respects the cap
    assert size in vllm_capture_grid(size)                  # vLLM keeps it (no truncation)
    assert size in vllm_capture_grid(size, max_num_batched_tokens=size * 2)


def test_official_example():
    assert capture_size(128, 5, 2048) == 1024  # 128 x 6 = 768 -> 1024, as the recipe's benchmark does


def test_grid_matches_vllm_rule():
    grid = vllm_capture_grid(1000)
    assert grid[:4] == [1, 2, 4, 8] and 248 in grid and 256 in grid and 992 in grid and 1000 not in grid
    assert vllm_capture_grid(300, max_num_batched_tokens=260) == [1, 2, 4, *range(8, 256, 8), 256, 260]


@pytest.mark.parametrize("mns,k", [(0, 5), (-1, 5)])
def test_bad_inputs(mns, k):
    with pytest.raises(UsageError):
        capture_size(mns, k, 2048)
