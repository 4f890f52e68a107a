"""The numpy boundary: arrays cross into C++ without copies and come back over the same memory,
flags survive, dtypes are never converted silently (bf16 as ml_dtypes or as a tagged uint16 array
give the same bits; untagged uint16 and foreign byte orders are rejected), strided and misaligned
inputs compute the same bits as contiguous copies, arrays outlive the objects that produced them,
exceptions thrown on worker threads reach the Python caller, and Python threads calling separate
runners concurrently get the same bits as serial calls.
"""

from __future__ import annotations

import gc
import threading
from concurrent.futures import ThreadPoolExecutor

import ml_dtypes
import moecore
import numpy as np
import pytest

T, H, I, E, K = 13, 32, 16, 5, 2
BACKENDS = ["triton", "torch_native"]
DTYPES = {"f32": np.float32, "f16": np.float16, "bf16": ml_dtypes.bfloat16}


@pytest.fixture
def restore_threads():
    before = moecore.get_num_threads()
    yield
    moecore.set_num_threads(before)


def _problem(seed, dtype=np.float32, t=T):
    rng = np.random.default_rng(seed)
    return {
        "x": rng.standard_normal((t, H)).astype(dtype),
        "w13": (rng.standard_normal((E, 2 * I, H)) * 0.2).astype(dtype),
        "w2": (rng.standard_normal((E, H, I)) * 0.2).astype(dtype),
        "ids": np.stack([rng.permutation(E)[:K] for _ in range(t)]).astype(np.int32).reshape(t, K),
        "wts": rng.random((t, K)).astype(np.float32),
    }


def _quant(backend, w13, w2):
    cls = (
        moecore.TorchNativeMoeQuantInfo if backend == "torch_native" else moecore.TritonMoeQuantInfo
    )
    return cls(w13_weight=w13, w2_weight=w2)


def _dispatch(x, ids, wts):
    return moecore.StandardDispatchOutput(x, topk_output=moecore.StandardTopKOutput(wts, ids))


def _run(backend, p, runner=None, x=None, ids=None, wts=None, w13=None, w2=None, **cfg):
    cfg.setdefault("inplace", False)
    runner = runner or moecore.MoeRunner(backend, moecore.MoeRunnerConfig(**cfg))
    q = _quant(backend, p["w13"] if w13 is None else w13, p["w2"] if w2 is None else w2)
    d = _dispatch(
        p["x"] if x is None else x,
        p["ids"] if ids is None else ids,
        p["wts"] if wts is None else wts,
    )
    return runner.run(d, q).hidden_states


def _bits(a):
    a = a.array if isinstance(a, moecore.Tagged) else a
    return np.ascontiguousarray(a).view(np.uint8)


def _assert_bitwise(a, b):
    assert a.shape == b.shape
    assert np.array_equal(_bits(a), _bits(b))


def _misaligned(a):
    raw = np.zeros(a.nbytes + 1, np.uint8)
    v = np.frombuffer(raw.data, dtype=a.dtype, count=a.size, offset=1).reshape(a.shape)
    v[...] = a
    assert not v.flags.aligned
    return v


# ---------------------------------------------------------------------------------------------
# Zero copy and flags


def test_zero_copy_in_and_out():
    p = _problem(0)
    topk = moecore.StandardTopKOutput(p["wts"], p["ids"])
    d = moecore.StandardDispatchOutput(p["x"], topk_output=topk)
    assert np.shares_memory(d.hidden_states, p["x"])
    assert d.hidden_states.ctypes.data == p["x"].ctypes.data
    assert np.shares_memory(d.topk_output.topk_ids, p["ids"])
    assert np.shares_memory(d.topk_output.topk_weights, p["wts"])
    q = moecore.TritonMoeQuantInfo(w13_weight=p["w13"], w2_weight=p["w2"])
    assert np.shares_memory(q.w13_weight, p["w13"]) and np.shares_memory(q.w2_weight, p["w2"])
    c = moecore.StandardCombineInput(p["x"])
    assert np.shares_memory(c.hidden_states, p["x"])
    assert np.shares_memory(moecore.StandardDispatcher(E).combine(c), p["x"])
    out = moecore.StandardDispatcher(E).dispatch(p["x"], topk)
    assert np.shares_memory(out.hidden_states, p["x"])
    # Strided views stay views with the same strides.
    view = p["x"][::2]
    d2 = moecore.StandardDispatchOutput(view, topk_output=topk)
    assert d2.hidden_states.strides == view.strides and np.shares_memory(d2.hidden_states, p["x"])


def test_layer_parameters_are_views():
    layer = moecore.FusedMoE(
        num_experts=E,
        hidden_size=H,
        intermediate_size=I,
        topk_config=moecore.TopKConfig(top_k=K),
        params_dtype="f32",
    )
    w13 = layer.parameter("w13_weight")
    w13[1, 0, 0] = 3.5
    assert layer.parameter("w13_weight")[1, 0, 0] == 3.5
    assert np.shares_memory(layer.named_parameters()["w13_weight"], w13)


@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("backend", ["triton"])
def test_inplace_output_shares_memory_with_input(backend, dtype):
    p = _problem(1, DTYPES[dtype])
    expected = _run(backend, p)
    x = p["x"].copy()
    out = _run(backend, p, x=x, inplace=True)
    assert np.shares_memory(out, x) and out.ctypes.data == x.ctypes.data
    _assert_bitwise(x, expected)


def test_inplace_into_row_strided_view_writes_only_its_rows():
    p = _problem(2)
    big = np.repeat(p["x"], 2, axis=0)  # rows 0,2,4,... hold x
    before = big.copy()
    expected = _run("triton", p)
    out = _run("triton", p, x=big[::2], inplace=True)
    assert np.shares_memory(out, big)
    _assert_bitwise(big[::2], expected)
    _assert_bitwise(big[1::2], before[1::2])


def test_read_only_flag_preserved():
    p = _problem(3)
    ro = p["x"].copy()
    ro.flags.writeable = False
    topk = moecore.StandardTopKOutput(p["wts"], p["ids"])
    assert (
        moecore.StandardDispatchOutput(ro, topk_output=topk).hidden_states.flags.writeable is False
    )
    assert (
        moecore.StandardDispatchOutput(p["x"], topk_output=topk).hidden_states.flags.writeable
        is True
    )
    assert moecore.StandardCombineInput(ro).hidden_states.flags.writeable is False
    # A read-only input is fine when the output is a new array.
    out = _run("triton", p, x=ro)
    assert out.flags.writeable and not np.shares_memory(out, ro)


def test_arrays_outlive_their_producers():
    p = _problem(4)
    x_copy = p["x"].copy()
    d = _dispatch(p["x"], p["ids"], p["wts"])
    del p["x"]
    gc.collect()
    assert np.array_equal(d.hidden_states, x_copy)
    runner = moecore.MoeRunner("triton", moecore.MoeRunnerConfig(inplace=False))
    q = _quant("triton", p["w13"], p["w2"])
    out = runner.run(d, q).hidden_states
    expected = out.copy()
    del runner, q, d
    gc.collect()
    assert np.array_equal(out, expected)


# ---------------------------------------------------------------------------------------------
# dtypes


@pytest.mark.parametrize("backend", BACKENDS)
def test_bf16_ml_dtypes_and_tagged_uint16_identical(backend):
    p = _problem(5, ml_dtypes.bfloat16)
    as_ml = _run(backend, p)
    assert as_ml.dtype == np.dtype(ml_dtypes.bfloat16)

    def tag(a):
        return moecore.tagged(a.view(np.uint16), "bf16")

    as_tagged = _run(backend, p, x=tag(p["x"]), w13=tag(p["w13"]), w2=tag(p["w2"]))
    _assert_bitwise(as_ml, as_tagged)
    # Tagging the ml_dtypes array itself is accepted too.
    _assert_bitwise(as_ml, _run(backend, p, x=moecore.tagged(p["x"], "bf16")))


def test_f16_tagged_uint16_identical_to_float16():
    p = _problem(6, np.float16)
    plain = _run("triton", p)
    tagged = _run("triton", p, x=moecore.tagged(p["x"].view(np.uint16), "f16"))
    assert tagged.dtype == np.float16
    _assert_bitwise(plain, tagged)


def test_uint16_untagged_rejected():
    p = _problem(7, ml_dtypes.bfloat16)
    with pytest.raises(moecore.DTypeError, match="a uint16 array is ambiguous") as info:
        _run("triton", p, x=p["x"].view(np.uint16))
    assert isinstance(info.value, TypeError)
    with pytest.raises(TypeError, match="ambiguous"):
        moecore.TritonMoeQuantInfo(w13_weight=p["w13"].view(np.uint16), w2_weight=p["w2"])


@pytest.mark.parametrize("dtype", list(DTYPES))
def test_dtype_round_trip(dtype):
    p = _problem(8, DTYPES[dtype])
    d = _dispatch(p["x"], p["ids"], p["wts"])
    back = d.hidden_states
    assert back.dtype == p["x"].dtype and back.shape == p["x"].shape
    _assert_bitwise(back, p["x"])
    assert d.topk_output.topk_ids.dtype == np.int32
    assert d.topk_output.topk_weights.dtype == np.float32
    for backend in BACKENDS:
        out = _run(backend, p)
        assert out.dtype == p["x"].dtype and out.shape == (T, H)
        assert np.isfinite(out.astype(np.float32)).all()


def test_int64_ids_equal_int32_ids():
    p = _problem(9)
    for backend in BACKENDS:
        _assert_bitwise(_run(backend, p), _run(backend, p, ids=p["ids"].astype(np.int64)))


@pytest.mark.parametrize("what", ["hidden_states", "topk_ids", "topk_weights"])
def test_non_native_byte_order_rejected(what):
    """A big-endian array has numpy dtype name 'float32'/'int32' but its bytes are swapped; it
    must be rejected, not reinterpreted."""
    p = _problem(10)
    arrays = {"hidden_states": p["x"], "topk_ids": p["ids"], "topk_weights": p["wts"]}
    swapped = arrays[what].astype(arrays[what].dtype.newbyteorder(">"))
    assert not swapped.dtype.isnative
    arrays[what] = swapped
    with pytest.raises(moecore.DTypeError, match="byte order|endian"):
        _dispatch(arrays["hidden_states"], arrays["topk_ids"], arrays["topk_weights"])


# ---------------------------------------------------------------------------------------------
# Layouts


@pytest.mark.parametrize("backend", BACKENDS)
def test_strided_inputs_equal_contiguous(backend):
    p = _problem(11)
    expected = _run(backend, p)
    x_rows = np.repeat(p["x"], 3, axis=0)[::3]  # row stride 3·H
    ids_wide = np.repeat(p["ids"], 2, axis=1)[:, ::2]  # inner stride 2
    wts_t = np.asfortranarray(p["wts"])  # column-major
    assert not x_rows.flags.c_contiguous and not ids_wide.flags.c_contiguous
    _assert_bitwise(_run(backend, p, x=x_rows, ids=ids_wide, wts=wts_t), expected)


@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("backend", BACKENDS)
def test_misaligned_buffers_equal_aligned(backend, dtype):
    p = _problem(12, DTYPES[dtype])
    expected = _run(backend, p)
    got = _run(
        backend,
        p,
        x=_misaligned(p["x"]),
        ids=_misaligned(p["ids"]),
        wts=_misaligned(p["wts"]),
        w13=_misaligned(p["w13"]),
        w2=_misaligned(p["w2"]),
    )
    _assert_bitwise(got, expected)


# ---------------------------------------------------------------------------------------------
# Threads


@pytest.mark.parametrize("threads", [1, 2, 4])
def test_worker_exception_reaches_caller(threads, restore_threads):
    moecore.set_num_threads(threads)
    assert moecore.get_num_threads() == threads
    with pytest.raises(moecore.InvalidArgumentError, match=r"item 777 failed on purpose") as info:
        moecore._moecore.testing.parallel_raise(1000, 777)
    assert isinstance(info.value, ValueError)
    with pytest.raises(moecore.InvalidArgumentError, match=r"item 0 "):
        moecore._moecore.testing.parallel_raise(3, 0)
    moecore._moecore.testing.parallel_raise(1000, -1)  # no failing item: no exception
    # The pool still works after an exception.
    assert moecore._moecore.testing.parallel_sum(1000) == 1000 * 999 // 2


@pytest.mark.parametrize("threads", [1, 2, 3])
def test_parallel_sum(threads, restore_threads):
    moecore.set_num_threads(threads)
    for n in (0, 1, 2, 7, 1000, 100_003):
        assert moecore._moecore.testing.parallel_sum(n) == n * (n - 1) // 2


def test_set_get_num_threads_round_trip(restore_threads):
    for n in (1, 3, 2, 1, 8):
        moecore.set_num_threads(n)
        assert moecore.get_num_threads() == n
    moecore.set_num_threads(8)  # same value: no-op
    assert moecore.get_num_threads() == 8


@pytest.mark.parametrize("threads", [1, 2])
def test_results_do_not_depend_on_thread_count(threads, restore_threads):
    p = _problem(13, t=65)
    moecore.set_num_threads(1)
    expected = {b: _run(b, p) for b in BACKENDS}
    moecore.set_num_threads(threads)
    for b in BACKENDS:
        _assert_bitwise(_run(b, p), expected[b])


@pytest.mark.parametrize("shared_runner", [False, True], ids=["separate-runners", "shared-runner"])
def test_concurrent_python_threads_match_serial(shared_runner, restore_threads):
    moecore.set_num_threads(2)
    problems = [(BACKENDS[i % 2], _problem(100 + i, t=40)) for i in range(6)]
    serial = [_run(b, p) for b, p in problems]
    shared = {b: moecore.MoeRunner(b, moecore.MoeRunnerConfig(inplace=False)) for b in BACKENDS}
    start = threading.Barrier(len(problems))

    def work(i):
        backend, p = problems[i]
        runner = (
            shared[backend]
            if shared_runner
            else moecore.MoeRunner(backend, moecore.MoeRunnerConfig(inplace=False))
        )
        start.wait()
        return [_run(backend, p, runner=runner) for _ in range(4)]

    with ThreadPoolExecutor(max_workers=len(problems)) as pool:
        results = list(pool.map(work, range(len(problems))))
    for i, outs in enumerate(results):
        for out in outs:
            _assert_bitwise(out, serial[i])
