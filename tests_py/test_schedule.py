"""The static expert schedule (runner/expert_compute): results are bitwise independent of the
batch a token sits in and of the thread count, on every registered ("none", runner) path of the
standard dispatch, including the decode shape where one expert is hit (its column blocks are
split across both threads)."""

from __future__ import annotations

import zlib

import numpy as np
import pytest

import moecore
from moecore.testing import assert_bitwise_equal, make_moe_problem
from moecore.testing.params import DTYPES, path_params, runner_paths

PATHS = runner_paths()


def _seed(*parts) -> int:
    return zlib.crc32("-".join(str(p) for p in parts).encode())


def _run(path, problem, rows):
    q = problem.with_routing(problem.topk_weights[rows], problem.topk_ids[rows])
    q = q.with_x(problem.x[rows])
    runner = path.runner(is_gated=q.gated)
    topk = moecore.StandardTopKOutput(q.topk_weights, q.topk_ids)
    dispatch = moecore.StandardDispatchOutput(q.x, topk_output=topk)
    return runner.run(dispatch, path.quant_info(**q.quant_info_kwargs())).hidden_states


@pytest.fixture
def num_threads():
    previous = moecore.get_num_threads()
    yield moecore.set_num_threads
    moecore.set_num_threads(previous)


@pytest.mark.parametrize("one_expert", [False, True], ids=["spread", "one-expert"])
@pytest.mark.parametrize("path,dtype", path_params(PATHS, DTYPES))
def test_token_alone_equals_batches_and_threads(path, dtype, one_expert, num_threads):
    rng = np.random.default_rng(_seed("schedule", path.id, dtype, one_expert))
    p = make_moe_problem(rng, T=64, E=8, H=40, I=24, k=2, dtype=dtype, bias=True)
    if one_expert:  # every token's first slot on expert 3, the second dropped (decode, one hit)
        ids = np.full_like(p.topk_ids, -1)
        ids[:, 0] = 3
        p = p.with_routing(p.topk_weights, ids)
    num_threads(1)
    full = _run(path, p, np.arange(64))
    for n in (1, 2):
        num_threads(n)
        assert_bitwise_equal(_run(path, p, np.arange(64)), full, what=f"64 tokens, {n} threads")
        for b in (2, 7):
            rows = rng.permutation(64)[:b]
            assert_bitwise_equal(_run(path, p, rows), full[rows], what=f"batch {b}, {n} threads")
        for t in (0, 41):
            assert_bitwise_equal(_run(path, p, np.array([t])), full[t:t + 1],
                                 what=f"token {t} alone, {n} threads")
