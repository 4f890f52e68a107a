"""python -m moecore bench on a tiny layer: the probes, the row schema, that moecore runs at the
machine's best ISA level, that every peer is checked against moecore before it is timed (a
wrong peer is reported, never timed), and the CLI's JSON output. Speed is never asserted."""

from __future__ import annotations

import json

import moecore
import pytest
from moecore import _bench as bench
from moecore._bench import report
from moecore import _moecore
from moecore.__main__ import main

BEST_PEAK = {"amx": "amx_bf16", "avx512_bf16": "avx512_bf16", "avx512": "avx512_fma_f32",
             "avx2": "avx2_fma_f32", "scalar": "scalar_f32"}


def _config(**changes):
    kw = dict(shapes=["tiny"], formats=list(bench.FORMATS), tokens=[1, 5], threads=[1, 2],
              repeats=2, max_seconds=0.2, bandwidth_bytes=8 << 20, probe_seconds=0.01,
              peer_settle_seconds=0.0)
    return bench.BenchConfig(**{**kw, **changes})


@pytest.fixture(scope="module")
def machine():
    threads_before = moecore.get_num_threads()
    probed = bench.measure_machine(_config())
    assert moecore.get_num_threads() == threads_before  # restored after probing 1 and 2
    return probed


def test_probes_measure_both_thread_counts_with_the_best_peak(machine):
    assert machine["peak_kind"] == BEST_PEAK[moecore.detected_isa_level()]
    assert set(machine["threads"]) == {1, 2}
    for probe in machine["threads"].values():
        assert probe["gb_per_s"] > 0 and probe["gflop_per_s"] > 0
        assert probe["streams"] in bench.READ_STREAMS


def test_the_read_bound_is_the_best_stream_count(monkeypatch):
    # A machine whose reads are fastest with 2 streams per thread: the bound is that rate, named.
    rates = {1: 20.0, 2: 31.0, 4: 27.0, 8: 12.0}
    asked = []

    def read_bandwidth(nbytes, streams, repeats):
        asked.append(streams)
        return {"gb_per_s": rates[streams], "seconds": 1.0, "threads": 1}

    monkeypatch.setattr(_moecore.bench, "read_bandwidth", read_bandwidth)
    probed = bench.measure_machine(_config(threads=[1]))
    assert sorted(asked) == sorted(bench.READ_STREAMS)
    assert probed["threads"][1]["gb_per_s"] == 31.0 and probed["threads"][1]["streams"] == 2
    line = report.machine_lines(probed, {})[0]
    assert "read bandwidth 31.0 GB/s (best with 2 streams/thread)" in line


def test_probe_arguments_are_checked():
    with pytest.raises(moecore.InvalidArgumentError, match="streams must be 1, 2, 4 or 8"):
        _moecore.bench.read_bandwidth(1 << 20, streams=3)
    with pytest.raises(moecore.InvalidArgumentError, match="bytes must be >="):
        _moecore.bench.read_bandwidth(64)
    with pytest.raises(moecore.InvalidArgumentError, match="unknown peak probe"):
        _moecore.bench.peak("avx9000", 10)


def test_rows_every_format_at_the_best_isa_level_with_checked_peers(machine):
    threads_before = moecore.get_num_threads()
    rows, failures, _ = bench.run(_config(), machine)
    assert failures == []
    assert moecore.get_num_threads() == threads_before
    assert len(rows) == len(bench.FORMATS) * 2 * 2
    assert {r["format"] for r in rows} == set(bench.FORMATS)
    for r in rows:
        assert r["isa"] == moecore.detected_isa_level()
        assert r["kernel"] == r["isa"] or (r["isa"], r["kernel"]) == ("amx", "amx_float_tiles")
        assert r["backend"] == bench.FORMATS[r["format"]][0]
        assert r["ms"] > 0 and 1 <= r["repeats"] <= 2
        assert 1 <= r["experts_touched"] <= min(8, 2 * r["tokens"])
        assert r["pct_bound"] > 0 and r["gb_per_s"] > 0 and r["gflop_per_s"] > 0
        for peer in bench.PEERS:
            assert r[f"{peer}_ms"] > 0 or r[f"{peer}_note"].startswith("n/a"), (r, peer)


def test_a_peer_that_disagrees_is_reported_and_not_timed(machine, monkeypatch):
    real = bench._peers.eager

    def off_by_one(torch, *args):
        return real(torch, *args) + 1.0

    monkeypatch.setattr(bench._peers, "eager", off_by_one)
    rows, failures, _ = bench.run(_config(formats=["bf16"], threads=[1]), machine)
    assert len(failures) == 2 * 2  # both eager peers at both M
    assert "moecore vs torch_eager_bf16" in failures[0]
    for r in rows:
        for peer in ("torch_eager_bf16", "torch_eager_f32"):
            assert r[f"{peer}_ms"] is None and r[f"{peer}_note"].startswith("MISMATCH")


def test_cli_json(capsys):
    code = main(["bench", "--shape", "tiny", "--format", "int8", "--tokens", "3", "--threads", "1",
                 "--peers", "torch_eager_f32", "--repeats", "1", "--quick", "--json"])
    assert code == 0
    out = json.loads(capsys.readouterr().out)
    assert set(out) == {"header", "machine", "rows", "skipped"} and out["skipped"] == []
    assert set(out["machine"]["threads"]) == {"1"}
    assert out["header"]["command"].startswith("python -m moecore bench --shape tiny")
    (row,) = out["rows"]
    assert (row["shape"], row["format"], row["tokens"], row["threads"]) == ("tiny", "int8", 3, 1)
    assert row["torch_eager_f32_ms"] > 0 and "torch_eager_bf16_ms" not in row


def test_shapes_a_format_cannot_run_are_listed_not_built(machine):
    rows, failures, skipped = bench.run(
        bench.BenchConfig(shapes=["gpt-oss-20b"], formats=["fp8"], tokens=[1], threads=[1]), machine)
    assert rows == [] and failures == []
    assert skipped == ["gpt-oss-20b fp8: fp8 128×128 blocks need H and I divisible by 128 "
                       "(H=2880, I=2880)"]


def test_expert_parallel_tokens_keep_local_experts_only_and_at_least_one():
    import numpy as np

    shape = bench.workloads.Shape("ep", 4, 3, 64, 64, global_experts=64)
    x, weights, ids = bench.workloads.make_tokens(np.random.default_rng(0), shape, 200)
    assert x.shape == (200, 64) and weights.shape == ids.shape == (200, 3)
    assert np.all((ids >= -1) & (ids < 4))
    assert np.all((ids >= 0).any(axis=1))  # DeepEP sends a rank only tokens it serves
    assert (ids == -1).any()  # most slots belong to other ranks
    for row in ids:
        local = row[row >= 0]
        assert len(set(local.tolist())) == local.size  # distinct experts per token


def test_cli_markdown_and_chart(capsys, tmp_path):
    pytest.importorskip("matplotlib")
    chart = tmp_path / "bound.png"
    code = main(["bench", "--shape", "tiny", "--format", "bf16", "--tokens", "2", "--threads", "1",
                 "--peers", "none", "--repeats", "1", "--quick", "--chart", str(chart)])
    assert code == 0
    lines = capsys.readouterr().out.splitlines()
    assert any(line.startswith("- 1 thread: read bandwidth ") for line in lines)
    table = [line for line in lines if line.startswith("| ")]
    assert table[0].startswith("| shape | format (backend) | M | thr | kernel | ms |")
    kernel = moecore.MoeRunnerConfig(isa_level=moecore.detected_isa_level()).gemm_kernel
    assert table[2].startswith(f"| tiny | bf16 (triton) | 2 | 1 | {kernel} |")
    assert chart.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_caches_are_evicted_before_every_timed_call_unless_warm(machine, monkeypatch):
    made = []

    class CountingEvictor:
        def __init__(self, nbytes):
            self.nbytes, self.calls = nbytes, 0
            made.append(self)

        def __call__(self):
            self.calls += 1

    monkeypatch.setattr(bench, "CacheEvictor", CountingEvictor)
    config = _config(formats=["bf16"], threads=[1], tokens=[3], peers=["torch_eager_f32"])
    (row,), failures, _ = bench.run(config, machine)
    assert failures == [] and len(made) == 1
    assert made[0].nbytes == bench.eviction_bytes() == min(2 * bench.cache_bytes(), 4 << 30)
    assert made[0].nbytes >= 2 << 20
    # moecore's timed calls, then at least one of the peer's
    assert made[0].calls >= row["repeats"] + 1
    bench.run(_config(formats=["bf16"], threads=[1], tokens=[3], peers=[], cold=False), machine)
    assert len(made) == 1


def test_moecore_is_timed_only_after_the_peers_threads_settle(machine, monkeypatch):
    """The peers' OpenMP threads spin for a while after a call: each row pauses for
    peer_settle_seconds after its last peer call and before moecore's first timed call, and a
    run without peers does not pause."""
    events = []
    monkeypatch.setattr(bench.time, "sleep", lambda s: events.append(("sleep", s)))
    real = bench._median_seconds

    def recording(fn, *args, **kwargs):
        events.append(("timed", fn))
        return real(fn, *args, **kwargs)

    monkeypatch.setattr(bench, "_median_seconds", recording)
    config = _config(formats=["bf16"], threads=[1], tokens=[3, 4], peers=["torch_eager_f32"],
                     peer_settle_seconds=0.25)
    rows, failures, _ = bench.run(config, machine)
    assert failures == [] and len(rows) == 2
    # per row: the pause, moecore's timing, then the peer's
    assert [e[0] if e[0] == "timed" else e for e in events] == [
        ("sleep", 0.25), "timed", "timed"] * 2
    events.clear()
    bench.run(_config(formats=["bf16"], threads=[1], tokens=[3], peers=[]), machine)
    assert [e[0] for e in events] == ["timed"]
