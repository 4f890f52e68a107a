"""Capture and replay of an expert-parallel group (ExpertParallelGroup.capture, MoeGraphRunner
over a group): every capturable (a2a, runner) path — DeepEP low-latency into deep_gemm (BF16
and FP8 payloads, UE8M0 too) and flashinfer_cutedsl (BF16 and NVFP4 payloads), FlashInfer's
all-to-all into flashinfer_cutlass and flashinfer_cutedsl — replays ExpertParallelGroup.forward
bit for bit with uneven per-rank token counts, new contents, garbage in the padding rows, on any
thread count; DeepEP normal mode is refused at capture; bad input raises typed errors and the
group recovers."""

from __future__ import annotations

import threading

import ml_dtypes
import moecore
import moecore.formats as mf
import numpy as np
import pytest
from moecore.testing import assert_bitwise_equal
from moecore.testing import nvfp4 as N

BF16 = ml_dtypes.bfloat16
E, H, I, K = 8, 128, 128, 2  # E divides over 1, 2 and 4 ranks
CAP = 8


def _fp8_shards(rng):
    shards = {}
    for e in range(E):
        for name, shape in (("w1", (I, H)), ("w3", (I, H)), ("w2", (H, I))):
            w = (rng.standard_normal(shape) / np.sqrt(shape[1])).astype(np.float32)
            shards[name, e] = mf.quantize_fp8_block(w)
    return shards


def _load_fp8(group, shards):
    for (name, e), (q, s) in shards.items():
        prefix = "w2" if name == "w2" else "w13"
        group.weight_loader(f"{prefix}_weight", q, name, e)
        group.weight_loader(f"{prefix}_weight_scale_inv", s, name, e)


def _load_bf16(group, rng):
    for e in range(E):
        for name, shard, shape in (("w13_weight", "w1", (I, H)), ("w13_weight", "w3", (I, H)),
                                   ("w2_weight", "w2", (H, I))):
            w = (rng.standard_normal(shape) / np.sqrt(shape[1])).astype(BF16)
            group.weight_loader(name, w, shard, e)


def _load_nvfp4(group, ckpt):
    for e, shards in ckpt.items():
        for shard, tensors in shards.items():
            prefix = "w2" if shard == "w2" else "w13"
            for key, pattern in N.PARAM_OF.items():
                group.weight_loader(pattern.format(p=prefix), tensors[key], shard, e)


# name → (group kwargs, weight loader); every path ExpertParallelGroup can capture.
PATHS = {
    "deepep_deep_gemm_bf16": (dict(runner_backend="deep_gemm", a2a_backend="deepep"), "bf16"),
    "deepep_deep_gemm_fp8": (dict(runner_backend="deep_gemm", a2a_backend="deepep",
                                  quant_method=lambda: moecore.Fp8MoEMethod(
                                      weight_scheme="block", weight_block_size=[128, 128])),
                             "fp8"),
    "deepep_deep_gemm_fp8_ue8m0": (dict(runner_backend="deep_gemm", a2a_backend="deepep",
                                        quant_method=lambda: moecore.Fp8MoEMethod(
                                            weight_scheme="block", weight_block_size=[128, 128],
                                            scale_ue8m0=True)),
                                   "fp8"),
    "deepep_cutedsl_nvfp4_bf16_payload": (dict(
        runner_backend="flashinfer_cutedsl", a2a_backend="deepep", deepep_mode="low_latency",
        quant_method=lambda: moecore.ModelOptNvFp4FusedMoEMethod()), "nvfp4"),
    "deepep_cutedsl_nvfp4_nvfp4_payload": (dict(
        runner_backend="flashinfer_cutedsl", a2a_backend="deepep", deepep_mode="low_latency",
        quant_method=lambda: moecore.ModelOptNvFp4FusedMoEMethod(nvfp4_dispatch=True)), "nvfp4"),
    "flashinfer_cutlass_nvfp4": (dict(
        runner_backend="flashinfer_cutlass", a2a_backend="flashinfer",
        quant_method=lambda: moecore.ModelOptNvFp4FusedMoEMethod()), "nvfp4"),
    "flashinfer_cutlass_nvfp4_nvfp4_payload": (dict(
        runner_backend="flashinfer_cutlass", a2a_backend="flashinfer",
        quant_method=lambda: moecore.ModelOptNvFp4FusedMoEMethod()), "nvfp4_payload"),
    "flashinfer_cutedsl_nvfp4": (dict(
        runner_backend="flashinfer_cutedsl", a2a_backend="flashinfer",
        quant_method=lambda: moecore.ModelOptNvFp4FusedMoEMethod()), "nvfp4"),
}


def make_group(name, ranks, seed=0):
    kwargs, weights = PATHS[name]
    rng = np.random.default_rng(seed)
    group = moecore.ExpertParallelGroup(
        ranks, num_experts=E, hidden_size=H, intermediate_size=I,
        topk_config=moecore.TopKConfig(top_k=K),
        runner_config=moecore.MoeRunnerConfig(inplace=False), num_max_dispatch_tokens_per_rank=CAP,
        **kwargs)
    if weights == "bf16":
        _load_bf16(group, rng)
    elif weights == "fp8":
        _load_fp8(group, _fp8_shards(rng))
    else:
        _load_nvfp4(group, N.make_modelopt_checkpoint(rng, E, H, I))
    group.process_weights_after_loading()
    if weights == "nvfp4_payload":  # FlashInfer's all-to-all then sends NVFP4 rows
        for layer in group.layers:
            layer.dispatcher.set_quant_config({"input_global_scale": 0.75})
            assert layer.dispatcher.resolve_payload() == "nvfp4"
    return group


def _fill(graph, rng, input):
    """New random contents in every rank's static buffers, padding rows included."""
    for rank in graph.ranks:
        rank.hidden_states[:] = rng.standard_normal(rank.hidden_states.shape).astype(BF16)
        if input == "router_logits":
            rank.router_logits[:] = rng.standard_normal(rank.router_logits.shape)
        else:
            rank.topk_ids[:] = rng.integers(-1, E, rank.topk_ids.shape)
            rank.topk_weights[:] = rng.random(rank.topk_weights.shape)


def _eager(group, graph, counts, input):
    hidden = [r.hidden_states[:t].copy() for r, t in zip(graph.ranks, counts)]
    if input == "router_logits":
        logits = [r.router_logits[:t].copy() for r, t in zip(graph.ranks, counts)]
        return group.forward(hidden, logits, is_extend_in_batch=False)
    topk = [moecore.StandardTopKOutput(r.topk_weights[:t].copy(), r.topk_ids[:t].copy())
            for r, t in zip(graph.ranks, counts)]
    return group.forward_topk(hidden, topk, is_extend_in_batch=False)


def _counts(ranks, step):
    return [(3 * step + 5 * r + 1) % (CAP + 1) for r in range(ranks)]


@pytest.mark.parametrize("ranks", [1, 2, 4])
@pytest.mark.parametrize("name", list(PATHS))
def test_replay_equals_group_forward_bitwise(name, ranks):
    group = make_group(name, ranks)
    graph = group.capture(CAP)
    assert graph.size == ranks and graph.capacity == CAP
    rng = np.random.default_rng(1)
    for step in range(3):
        _fill(graph, rng, "router_logits")
        counts = _counts(ranks, step)
        want = _eager(group, graph, counts, "router_logits")
        graph.replay(counts)
        for r, t in enumerate(counts):
            assert_bitwise_equal(graph.ranks[r].output[:t], want[r],
                                 what=f"{name}, rank {r}, {t} tokens")
            assert not graph.ranks[r].output[t:].view(np.uint16).any()  # padding rows: zeros


@pytest.mark.parametrize("name", list(PATHS))
def test_topk_input_replay_equals_forward_topk(name):
    group = make_group(name, 2, seed=1)
    graph = group.capture(CAP, input="topk")
    rng = np.random.default_rng(2)
    for counts in ([CAP, 3], [0, 5], [1, 0]):
        _fill(graph, rng, "topk")
        want = _eager(group, graph, counts, "topk")
        graph.replay(counts)
        for r, t in enumerate(counts):
            assert_bitwise_equal(graph.ranks[r].output[:t], want[r], what=f"{name}, rank {r}")
            assert (graph.ranks[r].topk_ids[t:] == -1).all()


@pytest.mark.parametrize("name", list(PATHS))
def test_a_token_gives_the_same_bits_alone_or_in_any_batch_and_bucket(name):
    """Batch invariance through dispatch and combine: rank 0's first token alone (the other
    rank idle), then in batches of 2 and 7 beside other tokens on both ranks, in buckets of 1
    and 8, always gives the same bits."""
    group = make_group(name, 2)
    graphs = moecore.MoeGraphRunner(group, [1, CAP]).capture()
    rng = np.random.default_rng(9)
    x = [rng.standard_normal((7, H)).astype(BF16) for _ in range(2)]
    logits = [rng.standard_normal((7, E)).astype(np.float32) for _ in range(2)]
    alone = graphs.forward([x[0][:1], x[1][:0]], [logits[0][:1], logits[1][:0]])[0]
    for n0, n1 in ((2, 0), (7, 7), (1, 7), (2, 3)):
        got = graphs.forward([x[0][:n0], x[1][:n1]], [logits[0][:n0], logits[1][:n1]])[0]
        assert_bitwise_equal(got[:1], alone, what=f"{name}: batch ({n0}, {n1})")


@pytest.mark.parametrize("name", ["deepep_deep_gemm_fp8", "flashinfer_cutlass_nvfp4"])
def test_replay_is_bitwise_across_thread_counts(name):
    previous = moecore.get_num_threads()
    outputs = []
    try:
        for threads in (1, 2, 16):  # 16 oversubscribes this machine; the schedule still fixes bits
            moecore.set_num_threads(threads)
            group = make_group(name, 2)
            graph = group.capture(CAP)
            _fill(graph, np.random.default_rng(4), "router_logits")
            graph.replay([CAP, 5])
            outputs.append([r.output.copy() for r in graph.ranks])
    finally:
        moecore.set_num_threads(previous)
    for got in outputs[1:]:
        for r in range(2):
            assert_bitwise_equal(got[r], outputs[0][r], what=f"{name}: thread counts, rank {r}")


def test_graph_runner_over_a_group_pads_every_rank_to_one_bucket():
    group = make_group("deepep_deep_gemm_bf16", 2)
    graphs = moecore.MoeGraphRunner(group, [1, 4, CAP]).capture()
    rng = np.random.default_rng(5)
    for counts in ([3, 0], [1, 1], [2, CAP]):
        x = [rng.standard_normal((t, H)).astype(BF16) for t in counts]
        logits = [rng.standard_normal((t, E)).astype(np.float32) for t in counts]
        got = graphs.forward(x, logits)
        want = group.forward(x, logits, is_extend_in_batch=False)
        for r in range(2):
            assert_bitwise_equal(got[r], want[r], what=f"{counts}, rank {r}")
    assert graphs.bucket_for(3) == 4
    with pytest.raises(IndexError, match="do not fit the largest bucket"):
        graphs.forward([np.zeros((CAP + 1, H), BF16)] * 2, [np.zeros((CAP + 1, E), np.float32)] * 2)
    with pytest.raises(ValueError, match="list of 2 arrays"):
        graphs.forward(np.zeros((1, H), BF16), np.zeros((1, E), np.float32))
    before = graphs.graph_for(1).ranks[0].hidden_states.copy()
    with pytest.raises(ValueError, match="router_logits of dtype float32"):
        graphs.forward([np.ones((1, H), BF16)] * 2,
                       [np.zeros((1, E), np.float32), np.zeros((1, E), np.float64)])
    assert_bitwise_equal(graphs.graph_for(1).ranks[0].hidden_states, before,
                         what="a rejected batch writes no static buffer")
    with pytest.raises(ValueError, match="expert-parallel group dispatches bf16"):
        moecore.MoeGraphRunner(group, [1], dtype=np.float32)


def test_graph_runner_over_a_group_is_safe_from_several_threads():
    group = make_group("flashinfer_cutlass_nvfp4", 2)
    graphs = moecore.MoeGraphRunner(group, [4]).capture()
    rng = np.random.default_rng(6)
    batches = []
    for _ in range(4):
        counts = [int(rng.integers(0, 5)), int(rng.integers(0, 5))]
        x = [rng.standard_normal((t, H)).astype(BF16) for t in counts]
        logits = [rng.standard_normal((t, E)).astype(np.float32) for t in counts]
        batches.append((x, logits, group.forward(x, logits, is_extend_in_batch=False)))
    errors = []

    def worker(i):
        try:
            x, logits, want = batches[i]
            for _ in range(3):
                got = graphs.forward(x, logits)
                for r in range(2):
                    assert_bitwise_equal(got[r], want[r])
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(len(batches))]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert not errors, errors


def test_deepep_normal_mode_cannot_be_captured():
    kwargs = dict(PATHS["deepep_deep_gemm_fp8"][0], deepep_mode="normal")
    group = moecore.ExpertParallelGroup(2, num_experts=E, hidden_size=H, intermediate_size=I,
                                        topk_config=moecore.TopKConfig(top_k=K), **kwargs)
    _load_fp8(group, _fp8_shards(np.random.default_rng(0)))
    group.process_weights_after_loading()
    with pytest.raises(NotImplementedError, match="DeepEP normal mode cannot be captured"):
        group.capture(4)


def test_a_path_without_a_prepared_run_is_refused_at_capture():
    """FP8 block weights under a2a flashinfer run the triton runner (the method's choice), which
    has no flashinfer-format path: eager raises sglang's assertion, capture says it cannot."""
    kwargs = dict(PATHS["deepep_deep_gemm_fp8"][0], a2a_backend="flashinfer",
                  runner_backend="flashinfer_cutlass")
    group = moecore.ExpertParallelGroup(2, num_experts=E, hidden_size=H, intermediate_size=I,
                                        topk_config=moecore.TopKConfig(top_k=K), **kwargs)
    _load_fp8(group, _fp8_shards(np.random.default_rng(0)))
    group.process_weights_after_loading()
    with pytest.raises(NotImplementedError,
                       match="no prepared run is registered for dispatch format flashinfer on "
                             "runner triton, so this path cannot be captured"):
        group.capture(4)


def test_capacity_above_the_low_latency_buffer_is_refused():
    group = make_group("deepep_deep_gemm_bf16", 2)
    with pytest.raises(ValueError, match="exceeds num_max_dispatch_tokens_per_rank = 8"):
        group.capture(CAP + 1)


def test_bad_inputs_raise_typed_errors_and_the_group_recovers():
    group = make_group("deepep_deep_gemm_fp8", 2)
    graph = group.capture(4, input="topk")
    rng = np.random.default_rng(7)
    _fill(graph, rng, "topk")
    with pytest.raises(ValueError, match="one token count per rank"):
        graph.replay([1, 2, 3])
    with pytest.raises(IndexError, match=r"num_tokens in \[0, capacity = 4\]"):
        graph.replay([1, 5])
    with pytest.raises(ValueError, match="input must be 'router_logits' or 'topk'"):
        group.capture(4, input="logits")
    graph.ranks[1].topk_ids[0, 0] = E  # out of range on rank 1
    with pytest.raises(IndexError, match=r"topk_ids must be in \[-1, 8\)"):
        graph.replay([2, 2])
    graph.ranks[1].topk_ids[0, 0] = 1
    graph.ranks[0].topk_ids[1] = [0, 3]
    graph.ranks[0].hidden_states[1, 7] = np.nan  # an FP8 payload cannot carry it
    with pytest.raises(ValueError, match="row 1 holds a non-finite value"):
        graph.replay([2, 2])
    graph.ranks[0].hidden_states[1, 7] = 0.5
    graph.replay([2, 2])  # the group recovers
    want = _eager(group, graph, [2, 2], "topk")
    for r in range(2):
        assert_bitwise_equal(graph.ranks[r].output[:2], want[r])
    # A token routed nowhere is still refused, as eager dispatch refuses it.
    graph.ranks[0].topk_ids[1] = -1
    graph.ranks[0].hidden_states[1, 3] = np.inf
    with pytest.raises(ValueError, match="row 1 holds a non-finite value"):
        graph.replay([2, 2])
    with pytest.raises(ValueError, match="row 1 holds a non-finite value"):
        _eager(group, graph, [2, 2], "topk")


def test_separate_groups_replay_in_parallel_threads():
    graphs = [make_group(name, 2).capture(CAP) for name in
              ("deepep_deep_gemm_bf16", "flashinfer_cutedsl_nvfp4")]
    rng = np.random.default_rng(8)
    for graph in graphs:
        _fill(graph, rng, "router_logits")
    want = []
    for graph in graphs:
        graph.replay([CAP, 2])
        want.append([r.output.copy() for r in graph.ranks])
    errors = []

    def worker(i):
        try:
            for _ in range(5):
                graphs[i].replay([CAP, 2])
                for r in range(2):
                    assert_bitwise_equal(graphs[i].ranks[r].output, want[i][r])
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(len(graphs))]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert not errors, errors
