"""Capture and replay (the CUDA-graph analogue) and bitwise determinism, over every quant method
and runner backend a layer can use with a2a "none".

Oracle: the eager layer itself. A replay must equal ``layer.forward`` on the real rows bit for
bit — after new buffer contents, with fewer real tokens than the bucket holds, across thread
counts and batch compositions. sglang's ``test_v2_cuda_graph_parity`` bars (static vs
allocating within 1e-2, repeated static calls within 1e-5) are ported as well, but moecore's
own bar is bitwise. Allocation-free replay is proven with a counting allocator in
tests_cpp/test_capture.cpp and the per-backend tests_cpp/test_prepared_*.cpp.
"""

from __future__ import annotations

import threading

import ml_dtypes
import moecore
import numpy as np
import pytest
from moecore import _moecore as M
from moecore.testing import assert_bitwise_equal
from moecore.testing import mxfp4 as X
from moecore.testing import nvfp4 as N

from test_quant_fp8 import Fp8Checkpoint, _modelopt_layer
from test_quant_int8 import _checkpoint as _int8_checkpoint
from test_quant_int8 import _int8_layer

F32 = np.float32
BF16 = ml_dtypes.bfloat16


# ---------------------------------------------------------------------------------------------
# One processed layer per (quant method, runner backend).


def _unquantized(backend, *, with_bias=False, **cfg):
    e, h, inter = 6, 64, 32
    rng = np.random.default_rng(7)
    cfg.setdefault("inplace", False)
    layer = moecore.FusedMoE(num_experts=e, hidden_size=h, intermediate_size=inter,
                             topk_config=moecore.TopKConfig(top_k=2), params_dtype="bf16",
                             with_bias=with_bias, runner_backend=backend,
                             runner_config=moecore.MoeRunnerConfig(**cfg))
    for name, a in layer.named_parameters().items():
        a[...] = (rng.standard_normal(a.shape) / np.sqrt(a.shape[-1])).astype(a.dtype)
    layer.process_weights_after_loading()
    return layer


def _fp8(scheme, static=False, backend=None):
    if backend == "deep_gemm":  # DeepGEMM's recipe: 128×128 blocks
        ck = Fp8Checkpoint(scheme, 4, 256, 128, seed=3, block=(128, 128))
    else:
        ck = Fp8Checkpoint(scheme, 4, 128, 64, seed=3, static=static)
    layer = ck.layer(backend=backend)
    layer.process_weights_after_loading()
    return layer


def _int8(quant):
    e, h, inter = 4, 48, 32
    layer = _int8_layer(quant, _int8_checkpoint(e, h, inter, seed=5), e, h, inter)
    layer.process_weights_after_loading()
    return layer


def _modelopt_fp8():
    layer, _, _ = _modelopt_layer(4, 64, 32, "flashinfer_cutlass", seed=9)
    layer.process_weights_after_loading()
    return layer


def _nvfp4(backend):
    rng = np.random.default_rng(11)
    layer = moecore.FusedMoE(
        num_experts=4, hidden_size=64, intermediate_size=64,
        topk_config=moecore.TopKConfig(top_k=2), runner_backend=backend,
        runner_config=moecore.MoeRunnerConfig(inplace=False),
        quant_method=M.ModelOptNvFp4FusedMoEMethod())
    N.load_checkpoint(layer, N.make_modelopt_checkpoint(rng, 4, 64, 64))
    layer.process_weights_after_loading()
    return layer


def _gpt_oss():
    ckpt = X.random_gpt_oss_checkpoint(np.random.default_rng(13), 4, 64, 64)
    return X.gpt_oss_layer(ckpt)[0]


def _dsv4():
    w = X.random_dsv4_weights(np.random.default_rng(17), 4, 128, 128)
    return X.dsv4_layer(w, swiglu_limit=7.0)[0]


LAYERS = {
    "unquant-triton": lambda: _unquantized("triton"),
    "unquant-triton-bias": lambda: _unquantized("triton", with_bias=True),
    "unquant-triton-no_combine": lambda: _unquantized("triton", no_combine=True),
    "unquant-torch_native": lambda: _unquantized("torch_native"),
    "unquant-deep_gemm": lambda: _unquantized("deep_gemm"),
    "fp8-per_tensor-dynamic": lambda: _fp8("per_tensor"),
    "fp8-per_tensor-static": lambda: _fp8("per_tensor", static=True),
    "fp8-per_channel": lambda: _fp8("per_channel"),
    "fp8-block-triton": lambda: _fp8("block"),
    "fp8-block-deep_gemm": lambda: _fp8("block", backend="deep_gemm"),
    "int8-w8a8": lambda: _int8("int8_w8a8"),
    "int8-w8a16": lambda: _int8("int8_w8a16"),
    "modelopt_fp8-flashinfer_cutlass": _modelopt_fp8,
    "nvfp4-flashinfer_cutlass": lambda: _nvfp4("flashinfer_cutlass"),
    "nvfp4-flashinfer_cutedsl": lambda: _nvfp4("flashinfer_cutedsl"),
    "mxfp4-gpt_oss": _gpt_oss,
    "mxfp4-dsv4": _dsv4,
}
# fp8 per-tensor dynamic quantizes with one scale over the whole batch (sglang's contract), so
# a token's output depends on its batch: padding rows are zeros there and cannot change the
# amax, but batch composition can.
BATCH_DEPENDENT = {"fp8-per_tensor-dynamic"}

_cache: dict = {}


def layer_of(name):
    if name not in _cache:
        _cache[name] = LAYERS[name]()
    return _cache[name]


def _inputs(layer, t, seed, dtype=BF16):
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal((t, layer.hidden_size)) * 0.5).astype(dtype)
    logits = rng.standard_normal((t, layer.num_experts)).astype(F32)
    return x, logits


@pytest.fixture
def num_threads():
    previous = moecore.get_num_threads()
    yield moecore.set_num_threads
    moecore.set_num_threads(previous)


# ---------------------------------------------------------------------------------------------
# Replay equals eager, bit for bit.


@pytest.mark.parametrize("name", list(LAYERS))
def test_replay_equals_eager_with_padding_and_new_contents(name):
    layer = layer_of(name)
    graphs = moecore.MoeGraphRunner(layer, [1, 4, 16]).capture()
    for t, seed in ((16, 1), (3, 2), (1, 3), (11, 4), (16, 5)):
        x, logits = _inputs(layer, t, seed)
        graph = graphs.graph_for(t)
        graph.hidden_states[:t] = x
        graph.router_logits[:t] = logits
        # Garbage in the padding rows must not reach the real rows.
        graph.hidden_states[t:] = 1e4
        graph.router_logits[t:] = np.nan
        graph.replay(t)
        assert_bitwise_equal(graph.output[:t], layer.forward(x, logits),
                             what=f"{name}: replay of {t} tokens in bucket {graph.capacity}")
        first = graph.output[:t].copy()
        graph.replay(t)
        assert_bitwise_equal(graph.output[:t], first, what=f"{name}: repeated replay")


@pytest.mark.parametrize("name", list(LAYERS))
def test_topk_input_replay_equals_forward_topk(name):
    layer = layer_of(name)
    graph = moecore.CapturedForward(layer, 8, input="topk")
    rng = np.random.default_rng(21)
    e, k = layer.num_experts, layer.top_k
    for t in (8, 5):
        x, _ = _inputs(layer, t, 30 + t)
        ids = np.stack([rng.permutation(e)[:k] for _ in range(t)]).astype(np.int32)
        ids[0, -1] = -1  # a dropped slot
        weights = rng.random((t, k)).astype(F32)
        graph.hidden_states[:t] = x
        graph.topk_ids[:t] = ids
        graph.topk_weights[:t] = weights
        graph.topk_ids[t:] = 0  # replay pads these with −1
        graph.replay(t)
        want = layer.forward_topk(x, moecore.StandardTopKOutput(weights, ids, None))
        assert_bitwise_equal(graph.output[:t], want, what=f"{name}: top-k replay of {t}")
        assert np.all(graph.topk_ids[t:] == -1) and np.all(graph.topk_weights[t:] == 0)


# ---------------------------------------------------------------------------------------------
# Determinism: thread counts, repeats, batch composition.


@pytest.mark.parametrize("name", list(LAYERS))
def test_replay_is_bitwise_across_thread_counts(name, num_threads):
    layer = layer_of(name)
    x, logits = _inputs(layer, 16, 41)
    outputs = []
    counts = (1, 2, 16)  # 16 oversubscribes a 2-core machine; the schedule still fixes the bits
    for i, threads in enumerate(counts):
        num_threads(threads)
        graphs = moecore.MoeGraphRunner(layer, [16]).capture()  # schedule sized per thread count
        outputs.append(graphs.forward(x, logits))
        num_threads(counts[(i + 1) % len(counts)])  # replay on another count too
        outputs.append(graphs.forward(x, logits))
    for got in outputs[1:]:
        assert_bitwise_equal(got, outputs[0], what=f"{name}: thread counts")


@pytest.mark.parametrize("name", sorted(set(LAYERS) - BATCH_DEPENDENT))
def test_a_token_gives_the_same_bits_in_any_batch_and_bucket(name):
    layer = layer_of(name)
    graphs = moecore.MoeGraphRunner(layer, [1, 2, 8, 64]).capture()
    x, logits = _inputs(layer, 64, 51)
    alone = graphs.forward(x[:1], logits[:1])
    for t in (2, 7, 64):
        batch = graphs.forward(x[:t], logits[:t])
        assert_bitwise_equal(batch[:1], alone, what=f"{name}: token 0 in a batch of {t}")
        assert_bitwise_equal(batch, layer.forward(x[:t], logits[:t]), what=f"{name}: batch {t}")
    # The same token in another row of another bucket.
    shuffled = np.concatenate([x[5:7], x[:1]]), np.concatenate([logits[5:7], logits[:1]])
    assert_bitwise_equal(graphs.forward(*shuffled)[2:3], alone, what=f"{name}: token 0 at row 2")


# ---------------------------------------------------------------------------------------------
# sglang test_v2_cuda_graph_parity, ported: static buffers (capture) vs allocating (eager).


@pytest.mark.parametrize("name", list(LAYERS))
def test_v2_cuda_graph_parity(name):
    layer = layer_of(name)
    t = 8
    x, logits = _inputs(layer, t, 61)
    no_graph = layer.forward(x, logits).astype(F32)
    graphs = moecore.MoeGraphRunner(layer, [t]).capture()
    first = graphs.forward(x, logits).astype(F32)
    second = graphs.forward(x, logits).astype(F32)
    np.testing.assert_allclose(first, no_graph, atol=1e-2, rtol=1e-2)
    np.testing.assert_allclose(second, first, atol=1e-5, rtol=1e-5)
    assert_bitwise_equal(first, no_graph, what=f"{name}: graph vs no graph")
    assert_bitwise_equal(second, first, what=f"{name}: second graph call")


# ---------------------------------------------------------------------------------------------
# The prepared runner path on its own (MoeRunner.prepare).


def test_runner_prepare_reads_the_dispatch_arrays_in_place():
    layer = layer_of("unquant-triton")
    runner = layer.quant_method.runner
    q = layer.quant_method.quant_info(layer)
    x, logits = _inputs(layer, 6, 71)
    topk = moecore.select_experts(x, logits, moecore.TopKConfig(top_k=2))
    ids, weights = np.array(topk.topk_ids), np.array(topk.topk_weights)
    dispatch = moecore.StandardDispatchOutput(x, moecore.StandardTopKOutput(weights, ids, None))
    prepared = runner.prepare(dispatch, q)
    out = prepared.combine_input.hidden_states
    for seed in (72, 73):
        rng = np.random.default_rng(seed)
        x[...] = rng.standard_normal(x.shape).astype(BF16)
        ids[...] = np.stack([rng.permutation(6)[:2] for _ in range(6)])
        ids[2, 1] = -1
        prepared.run()
        assert_bitwise_equal(out, runner.run(dispatch, q).hidden_states, what="prepared run")


# ---------------------------------------------------------------------------------------------
# Concurrency.


def test_separate_graphs_replay_in_parallel_threads():
    layers = [layer_of("unquant-triton"), layer_of("int8-w8a8"), layer_of("nvfp4-flashinfer_cutlass")]
    runners = [moecore.MoeGraphRunner(layer, [4, 16]).capture() for layer in layers]
    inputs = [[_inputs(layer, t, 80 + t) for t in (3, 16, 1, 9)] for layer in layers]
    expected = [[layer.forward(*xy) for xy in batch] for layer, batch in zip(layers, inputs)]
    errors = []

    def worker(i):
        try:
            for _ in range(5):
                for xy, want in zip(inputs[i], expected[i]):
                    got = runners[i].forward(*xy)
                    if got.tobytes() != want.tobytes():
                        errors.append(f"runner {i} differs")
        except Exception as e:  # noqa: BLE001 — reported below, never swallowed
            errors.append(repr(e))

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(len(layers))]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert errors == []


def test_a_shared_graph_runner_serializes_concurrent_forwards():
    layer = layer_of("unquant-torch_native")
    graphs = moecore.MoeGraphRunner(layer, [8]).capture()
    batches = [_inputs(layer, t, 90 + t) for t in (1, 5, 8, 3)]
    expected = [layer.forward(*xy) for xy in batches]
    errors = []

    def worker(offset):
        try:
            for r in range(6):
                i = (offset + r) % len(batches)
                if graphs.forward(*batches[i]).tobytes() != expected[i].tobytes():
                    errors.append(f"batch {i} corrupted")
        except Exception as e:  # noqa: BLE001
            errors.append(repr(e))

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert errors == []


# ---------------------------------------------------------------------------------------------
# Bad input.


def _custom_routing_layer():
    layer = moecore.FusedMoE(
        num_experts=4, hidden_size=16, intermediate_size=8,
        topk_config=moecore.TopKConfig(
            top_k=1, custom_routing_function=lambda h, r, k, n: (
                np.ones((r.shape[0], 1), F32), np.zeros((r.shape[0], 1), np.int32))),
        runner_config=moecore.MoeRunnerConfig(inplace=False))
    layer.process_weights_after_loading()
    return layer


def _unprocessed_layer():
    return moecore.FusedMoE(num_experts=4, hidden_size=16, intermediate_size=8,
                            topk_config=moecore.TopKConfig(top_k=1))


def _forward_wrong_shape():
    graphs = moecore.MoeGraphRunner(layer_of("unquant-triton"), [4]).capture()
    x, logits = _inputs(layer_of("unquant-triton"), 3, 1)
    graphs.forward(x[:, :-1], logits)


def _forward_wrong_dtype():
    graphs = moecore.MoeGraphRunner(layer_of("unquant-triton"), [4]).capture()
    x, logits = _inputs(layer_of("unquant-triton"), 3, 1)
    graphs.forward(x.astype(F32), logits)


def _forward_topk_to_logits_graph():
    graphs = moecore.MoeGraphRunner(layer_of("unquant-triton"), [4]).capture()
    x, _ = _inputs(layer_of("unquant-triton"), 3, 1)
    graphs.forward(x, topk_ids=np.zeros((3, 2), np.int32), topk_weights=np.ones((3, 2), F32))


def _replay_bad_ids():
    graph = moecore.CapturedForward(layer_of("unquant-triton"), 4, input="topk")
    graph.topk_ids[:2] = 99
    graph.replay(2)


BAD = [
    ("replay before capture",
     lambda: moecore.MoeGraphRunner(layer_of("unquant-triton"), [4]).forward(
         *_inputs(layer_of("unquant-triton"), 2, 1)),
     moecore.InvalidArgumentError, "capture"),
    ("T above the largest bucket",
     lambda: moecore.MoeGraphRunner(layer_of("unquant-triton"), [2, 4]).capture().forward(
         *_inputs(layer_of("unquant-triton"), 5, 1)),
     moecore.OutOfRangeError, "largest bucket"),
    ("replay num_tokens above capacity",
     lambda: moecore.CapturedForward(layer_of("unquant-triton"), 4).replay(5),
     moecore.OutOfRangeError, "capacity"),
    ("replay negative num_tokens",
     lambda: moecore.CapturedForward(layer_of("unquant-triton"), 4).replay(-1),
     moecore.OutOfRangeError, "num_tokens"),
    ("wrong buffer shape", _forward_wrong_shape, moecore.InvalidArgumentError, "shape"),
    ("wrong buffer dtype", _forward_wrong_dtype, moecore.InvalidArgumentError, "dtype"),
    ("top-k given to a logits graph", _forward_topk_to_logits_graph,
     moecore.InvalidArgumentError, "router_logits"),
    ("ids out of range at replay", _replay_bad_ids, moecore.OutOfRangeError, "topk_ids"),
    ("capacity 0", lambda: moecore.CapturedForward(layer_of("unquant-triton"), 0),
     moecore.InvalidArgumentError, "capacity"),
    ("no buckets", lambda: moecore.MoeGraphRunner(layer_of("unquant-triton"), []),
     moecore.InvalidArgumentError, "bucket"),
    ("bucket size 0", lambda: moecore.MoeGraphRunner(layer_of("unquant-triton"), [0, 4]),
     moecore.InvalidArgumentError, "bucket"),
    ("unknown input kind",
     lambda: moecore.CapturedForward(layer_of("unquant-triton"), 4, input="logits"),
     moecore.InvalidArgumentError, "router_logits"),
    ("layer not processed", lambda: moecore.CapturedForward(_unprocessed_layer(), 4),
     moecore.InvalidArgumentError, "process_weights_after_loading"),
    ("custom routing function", lambda: moecore.CapturedForward(_custom_routing_layer(), 4),
     moecore.UnsupportedError, "custom routing"),
    ("integer activation dtype",
     lambda: moecore.CapturedForward(layer_of("unquant-triton"), 4, dtype="int8"),
     moecore.DTypeError, "activation dtype"),
]


@pytest.mark.parametrize("what, call, exc, pattern", BAD, ids=[b[0] for b in BAD])
def test_capture_bad_input(what, call, exc, pattern):
    with pytest.raises(exc, match=pattern):
        call()


def test_capture_of_a_python_registered_path_says_so():
    def fused(dispatch_output, quant_info, config):  # pragma: no cover — never run
        raise AssertionError("not called")

    moecore.register_fused_func("customized", "torch_native", fused)
    try:
        layer = layer_of("unquant-torch_native")
        runner = moecore.MoeRunner("torch_native", layer.moe_runner_config,
                                   a2a_backend="customized")
        x, logits = _inputs(layer, 2, 1)
        topk = moecore.select_experts(x, logits, moecore.TopKConfig(top_k=2))
        dispatch = moecore.StandardDispatchOutput(x, topk)
        with pytest.raises(moecore.UnsupportedError, match="cannot capture"):
            runner.prepare(dispatch, layer.quant_method.quant_info(layer))
    finally:
        assert moecore.unregister_fused_func("customized", "torch_native")
