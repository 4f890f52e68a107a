"""Times one benchmark layer at several ISA levels (or two builds) in one process.

    PYTHONPATH=python python3 bench/compare_levels.py qwen3-30b-a3b int8 --tokens 1 16 \
        --threads 1 2 --isa avx512 avx512_bf16

`--isa amx amx_float_tiles` compares the two amx rows (the streamed default and the opt-in AMX
float tiles; a plain level follows MOECORE_AMX_FLOAT_TILES, like any runner).

Builds the layer once (the same weights and tokens as `python -m moecore bench`), then for each
M, thread count and level prints the median of up to --repeats calls after one warm-up call.
Levels alternate within one process, so a noisy machine affects them alike; for two builds of
moecore, run the script once per build with PYTHONPATH pointing at each and alternate the runs.
Caches are evicted before each timed call, as in the bench (--warm keeps them). No peers and no
bounds: use `python -m moecore bench` for the recorded tables.
"""
import argparse
import statistics
import time

import numpy as np

import moecore
from moecore._bench import CacheEvictor, eviction_bytes
from moecore._bench.workloads import SHAPES, build_layer, make_tokens


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("shape", choices=sorted(SHAPES))
    parser.add_argument("format", choices=["bf16", "fp8", "nvfp4", "mxfp4", "int8"])
    parser.add_argument("--tokens", type=int, nargs="+", default=[1])
    parser.add_argument("--threads", type=int, nargs="+", default=[moecore.get_num_threads()])
    levels = list(moecore.available_isa_levels())
    parser.add_argument("--isa", nargs="+", default=[moecore.detected_isa_level()],
                        choices=levels + (["amx_float_tiles"] if "amx" in levels else []))
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--max-seconds", type=float, default=1.5,
                        help="fewer repeats when a call would take the timing past this")
    parser.add_argument("--warm", action="store_true", help="keep the caches between calls")
    args = parser.parse_args()
    evict = (lambda: None) if args.warm else CacheEvictor(eviction_bytes())

    rng = np.random.default_rng(0)
    layer = build_layer(SHAPES[args.shape], args.format, rng, peers=False)
    for m in args.tokens:
        x, weights, ids = make_tokens(rng, SHAPES[args.shape], m)
        dispatch = moecore.StandardDispatchOutput(
            x, topk_output=moecore.StandardTopKOutput(weights, ids))
        for threads in args.threads:
            moecore.set_num_threads(threads)
            for isa in args.isa:
                tiles = isa == "amx_float_tiles"
                config = moecore.MoeRunnerConfig(inplace=False, isa_level="amx" if tiles else isa,
                                                 amx_float_tiles=True if tiles else None)
                runner = moecore.MoeRunner(layer.backend, config)
                start = time.perf_counter()
                runner.run(dispatch, layer.quant_info)
                first = time.perf_counter() - start
                repeats = max(1, min(args.repeats, int(args.max_seconds / max(first, 1e-6))))
                seconds = []
                for _ in range(repeats):
                    evict()
                    start = time.perf_counter()
                    runner.run(dispatch, layer.quant_info)
                    seconds.append(time.perf_counter() - start)
                print(f"{args.shape} {args.format} M={m} threads={threads} "
                      f"{runner.config.gemm_kernel}: "
                      f"{statistics.median(seconds) * 1e3:.3f} ms ({repeats} calls)", flush=True)


if __name__ == "__main__":
    main()
