"""Times moecore's runner paths against a PyTorch CPU peer measured in the same run.

    python bench/bench_runner.py [--shape qwen3-30b-a3b] [--tokens 1 16 128] [--dtype bf16]

Each row checks that moecore and the peer agree (bf16 tolerance) before timing, then reports
the median of repeated runs after warm-up and the speed ratio. The peer is the transformers-style
eager loop (per expert: gather tokens, two linears, activation, index_add) in torch. Speed is
never asserted; these machines are shared, so read ratios, not absolute times.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

import moecore
from moecore.dtypes import to_bf16, to_f32
from moecore.testing import assert_close

SHAPES = {  # (E, k, H, I) per MoE layer
    "mixtral-8x7b": (8, 2, 4096, 14336),
    "qwen3-30b-a3b": (128, 8, 2048, 768),
    "gpt-oss-20b": (32, 4, 2880, 2880),
    "small": (8, 2, 512, 1024),
}


def median_ms(fn, repeats: int) -> float:
    fn()  # warm-up
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def torch_eager(torch, x, w13, w2, weights, ids, inter):
    out = torch.zeros_like(x, dtype=torch.float32)
    for e in torch.unique(ids).tolist():
        token, slot = torch.nonzero(ids == e, as_tuple=True)
        h = x[token] @ w13[e].T
        a = torch.nn.functional.silu(h[:, :inter]) * h[:, inter:]
        y = (a @ w2[e].T).float() * weights[token, slot, None]
        out.index_add_(0, token, y)
    return out.to(x.dtype)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", choices=sorted(SHAPES), default="small")
    parser.add_argument("--tokens", type=int, nargs="+", default=[1, 16, 128])
    parser.add_argument("--dtype", choices=["bf16", "f32"], default="bf16")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    import torch

    E, k, H, I = SHAPES[args.shape]
    rng = np.random.default_rng(0)
    make = (lambda a: to_bf16(a)) if args.dtype == "bf16" else (lambda a: a.astype(np.float32))
    w13 = make((rng.standard_normal((E, 2 * I, H)) / np.sqrt(H)).astype(np.float32))
    w2 = make((rng.standard_normal((E, H, I)) / np.sqrt(I)).astype(np.float32))
    tdtype = torch.bfloat16 if args.dtype == "bf16" else torch.float32
    tw13 = torch.from_numpy(to_f32(w13)).to(tdtype)
    tw2 = torch.from_numpy(to_f32(w2)).to(tdtype)
    print(f"shape {args.shape} (E={E}, k={k}, H={H}, I={I}) {args.dtype}, "
          f"{moecore.get_num_threads()} threads, ISA {moecore.get_isa_level()}, "
          f"torch {torch.__version__} with {torch.get_num_threads()} threads\n")
    print("| runner | tokens | moecore ms | torch eager ms | speed-up |")
    print("| --- | ---: | ---: | ---: | ---: |")
    for T in args.tokens:
        x = make(rng.standard_normal((T, H)).astype(np.float32))
        logits = rng.standard_normal((T, E)).astype(np.float32)
        topk = moecore.select_experts(x, logits, moecore.TopKConfig(top_k=k))
        dispatch = moecore.StandardDispatchOutput(x, topk_output=topk)
        tx = torch.from_numpy(to_f32(x)).to(tdtype)
        tweights = torch.from_numpy(topk.topk_weights)
        tids = torch.from_numpy(topk.topk_ids.astype(np.int64))
        peer = lambda: torch_eager(torch, tx, tw13, tw2, tweights, tids, I)  # noqa: E731
        expected = peer().float().numpy()
        peer_ms = median_ms(peer, args.repeats)
        for backend, info_cls in (("triton", moecore.TritonMoeQuantInfo),
                                  ("torch_native", moecore.TorchNativeMoeQuantInfo)):
            runner = moecore.MoeRunner(backend, moecore.MoeRunnerConfig(inplace=False))
            info = info_cls(w13_weight=w13, w2_weight=w2)
            run = lambda: runner.run(dispatch, info)  # noqa: E731
            got = to_f32(run().hidden_states)
            assert_close(got, expected, "bf16_vs_exact" if args.dtype == "bf16" else "f32")
            ms = median_ms(run, args.repeats)
            print(f"| {backend} | {T} | {ms:.2f} | {peer_ms:.2f} | {peer_ms / ms:.2f}× |")


if __name__ == "__main__":
    main()
