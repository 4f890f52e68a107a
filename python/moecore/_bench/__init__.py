"""python -m moecore bench: moecore's MoE layers against PyTorch CPU peers and this machine's
measured bounds, all measured in one run.

For every (shape, format): weights are generated and quantized once; then for every thread
count and token count M, moecore's runner is called once (warm-up), each peer is called once and
checked against moecore's output within the format's tolerance, and only then are moecore and
the peers timed (median of repeats). Weight generation, routing and checks are never timed.
Before each timed call the caches are evicted (a read of twice their size, at most 4 GiB, not
timed), so the weights come from memory, as in a model whose other layers have run since: a
layer small enough to stay cached would otherwise report more than the machine's bandwidth
(--warm keeps them).

Bounds come from probes run in the same process with the same thread counts: a STREAM-like read
bandwidth (the best of 1, 2, 4 and 8 sequential streams per thread: the weight tiles make a decode
tile one stream, the contract layout several) and the peak of the best multiply-add the machine has
(AMX TDPBF16PS, else AVX512-BF16 VDPBF16PS, else fp32 FMA on zmm or ymm, else portable fp32
multiply-add). A row's "% of bound" is max(weight bytes / bandwidth, FLOPs / peak) over its time:
100 % is the roofline.
"""

from __future__ import annotations

import glob
import statistics
import time
from dataclasses import dataclass, field

import numpy as np

import moecore
from moecore.dtypes import to_f32
from moecore.testing import assert_close, error_stats

from . import peers as _peers
from .workloads import FORMATS, MODEL_SHAPES, SHAPES, TOKENS, build_layer, make_tokens, unsupported

__all__ = ["BenchConfig", "measure_machine", "run", "FORMATS", "SHAPES", "TOKENS", "PEERS"]

PEERS = ["torch_eager_bf16", "torch_eager_f32", "torch_grouped_mm_bf16"]
READ_STREAMS = (1, 2, 4, 8)  # streams per thread the read-bandwidth probe tries; the best counts


@dataclass
class BenchConfig:
    shapes: list = field(default_factory=lambda: list(MODEL_SHAPES))
    formats: list = field(default_factory=lambda: list(FORMATS))
    tokens: list = field(default_factory=lambda: list(TOKENS))
    threads: list = field(default_factory=lambda: [1, 2])
    repeats: int = 5
    max_seconds: float = 10.0  # timing budget per measurement: fewer repeats for slow calls
    peers: list = field(default_factory=lambda: list(PEERS))
    isa_level: str = ""  # "" = the detected (best) level
    bandwidth_bytes: int = 1 << 30
    probe_seconds: float = 0.3
    seed: int = 0
    cold: bool = True  # evict the caches before every timed call
    # Before moecore is timed, the peers' thread pools get this long to go idle: PyTorch's
    # OpenMP threads keep spinning after a call (for about 150 ms on the 2-core machine), and
    # moecore's threads timed then shared the cores with them (Qwen3-30B-A3B mxfp4, M = 16,
    # 2 threads: 12.5-16 ms for the calls within ~150 ms of a peer call, 7.2 ms after).
    peer_settle_seconds: float = 0.3


def cache_bytes() -> int:
    """The bytes of this machine's level 2 and higher caches (sysfs; each shared cache counted
    once), or 64 MiB where sysfs does not say."""
    seen, total = set(), 0
    for index in glob.glob("/sys/devices/system/cpu/cpu*/cache/index*"):
        try:
            with open(f"{index}/level") as f:
                level = int(f.read())
            with open(f"{index}/size") as f:
                size = f.read().strip()
            with open(f"{index}/shared_cpu_list") as f:
                shared = f.read().strip()
        except (OSError, ValueError):
            continue
        if level < 2 or (level, shared) in seen:
            continue
        seen.add((level, shared))
        units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
        total += int(size[:-1]) * units[size[-1]] if size[-1] in units else int(size)
    return total or 64 << 20


def eviction_bytes() -> int:
    """Bytes the evictor reads: twice the caches (cache_bytes), at most 4 GiB."""
    return min(2 * cache_bytes(), 4 << 30)


class CacheEvictor:
    """Reads a buffer of eviction_bytes(), written once so that its pages exist."""

    def __init__(self, nbytes: int):
        self._words = np.ones(nbytes // 8, np.uint64)

    def __call__(self) -> None:
        self._words.sum()


def _median_seconds(fn, repeats: int, max_seconds: float, first_seconds: float, before=None):
    """Median wall time of up to `repeats` calls (at least one) within max_seconds; `before`, when
    given, runs untimed before each call."""
    n = max(1, min(repeats, int(max_seconds / max(first_seconds, 1e-9))))
    times = []
    for _ in range(n):
        if before is not None:
            before()
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times), n


def measure_machine(config: BenchConfig) -> dict:
    """Read bandwidth (the best over READ_STREAMS, and its stream count) and peak per thread
    count: {"peak_kind", "threads": {t: {"gb_per_s", "streams", "gflop_per_s"}}}."""
    probes = moecore._moecore.bench
    kind = probes.peak_kinds()[-1]
    out = {"peak_kind": kind, "threads": {}}
    previous = moecore.get_num_threads()
    try:
        for t in config.threads:
            moecore.set_num_threads(t)
            reads = {s: probes.read_bandwidth(config.bandwidth_bytes, streams=s, repeats=3)
                     for s in READ_STREAMS}
            streams = max(reads, key=lambda s: reads[s]["gb_per_s"])
            calibration = probes.peak(kind, 10_000, repeats=1)  # iterations for ~probe_seconds
            iterations = max(1, int(10_000 * config.probe_seconds / max(calibration["seconds"], 1e-9)))
            peak = probes.peak(kind, iterations, repeats=3)
            out["threads"][t] = {"gb_per_s": reads[streams]["gb_per_s"], "streams": streams,
                                 "gflop_per_s": peak["gflop_per_s"]}
    finally:
        moecore.set_num_threads(previous)
    return out


class _PeerInputs:
    """The torch tensors the peers of one layer use, built once (bf16 copies on first use)."""

    def __init__(self, torch, layer):
        self.torch, self.layer = torch, layer
        self._bf16 = None

    def weights(self, dtype):
        torch = self.torch
        if dtype == torch.float32:
            return self.layer.peer_w13, self.layer.peer_w2
        if self._bf16 is None:
            self._bf16 = (self.layer.peer_w13.to(torch.bfloat16), self.layer.peer_w2.to(torch.bfloat16))
        return self._bf16


def _peer_calls(torch, inputs, names, x, weights, ids, grouped_ok):
    """{peer name: zero-argument callable returning fp32 numpy [M, H]} or a note string."""
    tx = torch.from_numpy(np.ascontiguousarray(x).view(np.int16)).view(torch.bfloat16)
    tw = torch.from_numpy(weights)
    tids = torch.from_numpy(ids.astype(np.int64))
    calls = {}
    for name in names:
        if inputs.layer.peer_w13 is None:
            calls[name] = inputs.layer.peer_note
        elif name == "torch_grouped_mm_bf16" and not grouped_ok:
            calls[name] = "n/a (no CPU torch._grouped_mm)"
        elif name == "torch_grouped_mm_bf16":
            w13, w2 = inputs.weights(torch.bfloat16)
            w13t, w2t = w13.transpose(1, 2), w2.transpose(1, 2)
            calls[name] = lambda: _peers.grouped(torch, tx, w13t, w2t, tw, tids).numpy()
        else:
            dtype = torch.bfloat16 if name.endswith("bf16") else torch.float32
            w13, w2 = inputs.weights(dtype)
            xd = tx.to(dtype)
            calls[name] = (lambda w13=w13, w2=w2, xd=xd:
                           _peers.eager(torch, xd, w13, w2, tw, tids).numpy())
    return calls


def run(config: BenchConfig, machine: dict, emit=None) -> tuple:
    """Runs the grid; calls emit(row) per row as it completes. Returns (rows, failures, skipped):
    a failure is a peer whose result disagreed with moecore (its row has no time for that peer);
    skipped lists the (shape, format) pairs the format's backend cannot run, with the reason."""
    import torch

    grouped_ok = _peers.has_grouped_mm(torch)
    isa = config.isa_level or moecore.detected_isa_level()
    rows, failures, skipped = [], [], []
    previous = (moecore.get_num_threads(), torch.get_num_threads())
    rng = np.random.default_rng(config.seed)
    evict = CacheEvictor(eviction_bytes()) if config.cold else None
    try:
        for shape_name in config.shapes:
            shape = SHAPES[shape_name]
            for fmt in config.formats:
                reason = unsupported(shape, fmt)
                if reason:
                    skipped.append(f"{shape.name} {fmt}: {reason}")
                    continue
                layer = build_layer(shape, fmt, rng, peers=bool(config.peers))
                inputs = _PeerInputs(torch, layer)
                problems = {m: make_tokens(rng, shape, m) for m in config.tokens}
                for threads in config.threads:
                    moecore.set_num_threads(threads)
                    torch.set_num_threads(threads)
                    runner = moecore.MoeRunner(
                        layer.backend, moecore.MoeRunnerConfig(inplace=False, isa_level=isa))
                    for m, (x, weights, ids) in problems.items():
                        row = _row(config, machine, torch, layer, runner, inputs, threads, x,
                                   weights, ids, grouped_ok, failures, evict)
                        rows.append(row)
                        if emit:
                            emit(row)
                del layer, inputs, problems
    finally:
        moecore.set_num_threads(previous[0])
        torch.set_num_threads(previous[1])
    return rows, failures, skipped


def _row(config, machine, torch, layer, runner, inputs, threads, x, weights, ids, grouped_ok,
         failures, evict) -> dict:
    shape = layer.shape
    dispatch = moecore.StandardDispatchOutput(x, topk_output=moecore.StandardTopKOutput(weights, ids))
    call = lambda: runner.run(dispatch, layer.quant_info).hidden_states  # noqa: E731
    start = time.perf_counter()
    out = to_f32(call())  # warm-up, and the result the peers are checked against
    first = time.perf_counter() - start
    row = {"shape": shape.name, "format": layer.fmt, "backend": layer.backend,
           "tokens": int(x.shape[0]), "threads": threads, "isa": runner.config.isa_level,
           "kernel": runner.config.gemm_kernel}
    # Check every peer before anything is timed.
    peer_calls = _peer_calls(torch, inputs, config.peers, x, weights, ids, grouped_ok)
    checked = {}
    for name, fn in peer_calls.items():
        if isinstance(fn, str):
            continue
        start = time.perf_counter()
        expected = fn()
        peer_first = time.perf_counter() - start
        try:
            assert_close(out, expected, layer.tolerance, what=f"moecore vs {name}")
        except AssertionError as e:
            failures.append(f"{shape.name} {layer.fmt} M={x.shape[0]} threads={threads}: {e}")
            peer_calls[name] = f"MISMATCH (NMSE {error_stats(out, expected)['nmse']:.1e})"
            continue
        checked[name] = peer_first
    if config.peers:
        time.sleep(config.peer_settle_seconds)
    seconds, repeats = _median_seconds(call, config.repeats, config.max_seconds, first, evict)
    valid = int(np.count_nonzero(ids >= 0))
    touched = int(np.unique(ids[ids >= 0]).size)
    weight_bytes = touched * layer.bytes_per_expert
    flops = 2.0 * valid * 3 * shape.hidden * shape.inter
    probe = machine["threads"][threads]
    bound = max(weight_bytes / (probe["gb_per_s"] * 1e9), flops / (probe["gflop_per_s"] * 1e9))
    row.update({
        "ms": seconds * 1e3, "repeats": repeats, "experts_touched": touched,
        "weight_mb": weight_bytes / 1e6,
        "gb_per_s": weight_bytes / seconds / 1e9,
        "pct_bandwidth": 100.0 * weight_bytes / seconds / 1e9 / probe["gb_per_s"],
        "gflop_per_s": flops / seconds / 1e9,
        "pct_peak": 100.0 * flops / seconds / 1e9 / probe["gflop_per_s"],
        "pct_bound": 100.0 * bound / seconds,
    })
    for name in config.peers:
        fn = peer_calls[name]
        if isinstance(fn, str):
            row[f"{name}_ms"], row[f"{name}_speedup"], row[f"{name}_note"] = None, None, fn
            continue
        peer_seconds, _ = _median_seconds(fn, config.repeats, config.max_seconds, checked[name],
                                          evict)
        row[f"{name}_ms"] = peer_seconds * 1e3
        row[f"{name}_speedup"] = peer_seconds / seconds
        row[f"{name}_note"] = ""
    return row
