"""moecore's command line.

  python -m moecore demo    run every executable (a2a, runner) path on a synthetic MoE layer and
                            check each against moecore.reference
  python -m moecore check   print the ISA level, thread count and the registries
  python -m moecore bench   time moecore's MoE layers against PyTorch CPU peers and this
                            machine's measured bandwidth and peak (bench/README.md)
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np


def _demo(args) -> int:
    import moecore
    from moecore.dtypes import to_f32
    from moecore.reference.moe import fused_moe_ref
    from moecore.reference.routing import select_experts_ref

    rng = np.random.default_rng(args.seed)
    T, E, H, I, k = args.tokens, args.experts, args.hidden, args.intermediate, args.top_k
    dtype = args.dtype
    print(f"moecore {moecore.__version__}: synthetic MoE layer T={T} E={E} H={H} I={I} k={k} "
          f"{dtype}, {moecore.get_num_threads()} threads, ISA {moecore.get_isa_level()}")

    def cast(a):
        return moecore.dtypes.to_bf16(a) if dtype == "bf16" else a.astype(dtype_np)

    dtype_np = {"f32": np.float32, "f16": np.float16, "bf16": np.float32}[dtype]
    x = cast(rng.standard_normal((T, H)).astype(np.float32))
    w13 = cast((rng.standard_normal((E, 2 * I, H)) / np.sqrt(H)).astype(np.float32))
    w2 = cast((rng.standard_normal((E, H, I)) / np.sqrt(I)).astype(np.float32))
    logits = rng.standard_normal((T, E)).astype(np.float32)

    topk = moecore.select_experts(x, logits, moecore.TopKConfig(top_k=k, renormalize=True))
    ref_w, ref_ids = select_experts_ref(logits, top_k=k, renormalize=True)
    routing_ok = np.array_equal(topk.topk_ids, ref_ids) and np.allclose(
        topk.topk_weights, ref_w, atol=1e-6)
    print(f"routing vs moecore.reference: {'ok' if routing_ok else 'MISMATCH'}\n")

    x32, w13_32, w2_32 = to_f32(x), to_f32(w13), to_f32(w2)
    header = f"{'a2a':<6} {'runner':<14} {'path':<8} {'ISA':<12} {'max |err|':>10} {'NMSE':>10} {'ms':>8}"
    print(header)
    print("-" * len(header))
    failures = 0
    cores = {backend for backend, _ in moecore.registered_runner_cores()}
    for a2a, runner_name, _ in moecore.registered_fused_funcs():
        for unfused in ([False, True] if runner_name in cores else [False]):
            for level in moecore.available_isa_levels():
                config = moecore.MoeRunnerConfig(inplace=False, force_unfused=unfused, isa_level=level)
                runner = moecore.MoeRunner(runner_name, config, a2a_backend=a2a)
                info_cls = (moecore.TorchNativeMoeQuantInfo if runner_name == "torch_native"
                            else moecore.TritonMoeQuantInfo)
                info = info_cls(w13_weight=w13, w2_weight=w2)
                dispatch = moecore.StandardDispatchOutput(x, topk_output=topk)
                runner.run(dispatch, info)  # warm-up
                start = time.perf_counter()
                out = runner.run(dispatch, info).hidden_states
                ms = (time.perf_counter() - start) * 1e3
                ref = fused_moe_ref(x32, w13_32, w2_32, topk.topk_weights, topk.topk_ids,
                                    act_dtype=dtype, contract=runner_name)
                got = to_f32(out)
                err = float(np.max(np.abs(got - ref)))
                nmse = float(np.sum((got - ref) ** 2) / max(np.sum(ref ** 2), 1e-30))
                ok = nmse <= (1e-10 if dtype == "f32" else 1e-5)
                failures += not ok
                path = "permute" if unfused else "fused"
                print(f"{a2a:<6} {runner_name:<14} {path:<8} {level:<12} {err:>10.3e} "
                      f"{nmse:>10.3e} {ms:>8.2f}{'' if ok else '  FAIL'}")
    print("\nall paths match the reference" if not failures else f"\n{failures} path(s) FAILED")
    return 1 if failures or not routing_ok else 0


def _check(args) -> int:
    import moecore

    print(f"moecore {moecore.__version__}")
    print(f"ISA level: {moecore.get_isa_level()} (detected {moecore.detected_isa_level()}; "
          f"available {', '.join(moecore.available_isa_levels())})")
    features = moecore.cpu_features()
    print("CPU features: " + " ".join(name for name, on in features.items() if on))
    print(f"threads: {moecore.get_num_threads()}")
    print("\nfused funcs (a2a, runner):")
    for a2a, runner, origin in moecore.registered_fused_funcs():
        print(f"  ({a2a}, {runner})  {origin}")
    print("pre-permutes (dispatch format, runner):")
    for fmt, runner, origin in moecore.registered_pre_permutes():
        print(f"  ({fmt}, {runner})  {origin}")
    print("post-permutes (runner, combine format):")
    for runner, fmt, origin in moecore.registered_post_permutes():
        print(f"  ({runner}, {fmt})  {origin}")
    print("runner cores:")
    for runner, origin in moecore.registered_runner_cores():
        print(f"  {runner}  {origin}")
    errors = moecore._moecore.registration_errors()
    if errors:
        print("registration errors:\n  " + "\n  ".join(errors))
        return 1
    return 0


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    import platform

    return platform.processor() or "unknown CPU"


def _add_bench_parser(sub) -> None:
    from moecore._bench import FORMATS, PEERS, SHAPES, TOKENS

    bench = sub.add_parser(
        "bench", help="time moecore's MoE layers against PyTorch peers and the machine's bounds",
        description="Times moecore's MoE layers (per shape, weight format, token count M and "
        "thread count) against PyTorch CPU peers and this machine's read bandwidth and peak, "
        "all measured in this run. Prints a Markdown table unless --csv or --json.")
    bench.add_argument("--shape", nargs="+", choices=list(SHAPES), help="default: the four models")
    bench.add_argument("--format", nargs="+", choices=list(FORMATS), help="default: all")
    bench.add_argument("--tokens", nargs="+", type=int, help=f"default: {TOKENS}")
    bench.add_argument("--threads", nargs="+", type=int, help="default: 1 2")
    bench.add_argument("--peers", nargs="+", choices=PEERS + ["none"], help="default: all")
    bench.add_argument("--repeats", type=int, default=5, help="timed calls per measurement")
    bench.add_argument("--max-seconds", type=float, default=10.0,
                       help="per measurement: fewer repeats (at least one) for slow calls")
    bench.add_argument("--quick", action="store_true",
                       help="M in 1 16 128, 3 repeats, 3 s per measurement")
    bench.add_argument("--isa", help="ISA level of moecore's runners (default: the detected one)")
    bench.add_argument("--warm", action="store_true",
                       help="keep the caches between timed calls (default: evicted before each)")
    bench.add_argument("--seed", type=int, default=0)
    out = bench.add_mutually_exclusive_group()
    out.add_argument("--csv", action="store_true", help="print CSV rows instead of Markdown")
    out.add_argument("--json", action="store_true", help="print JSON (machine and rows)")
    bench.add_argument("--chart", metavar="FILE.png", help="also draw %% of bound per shape (matplotlib)")
    bench.set_defaults(func=_bench)


def _bench(args) -> int:
    import platform
    import shlex

    import moecore
    from moecore import _bench as bench
    from moecore._bench import report

    if args.chart:
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            print("--chart needs matplotlib (pip install matplotlib)", file=sys.stderr)
            return 2
    config = bench.BenchConfig(repeats=args.repeats, max_seconds=args.max_seconds,
                               isa_level=args.isa or "", seed=args.seed, cold=not args.warm)
    if args.quick:
        config.tokens, config.repeats, config.max_seconds = [1, 16, 128], 3, 3.0
    for name in ("shape", "format", "tokens", "threads", "peers"):
        value = getattr(args, name)
        if value is not None:
            setattr(config, {"shape": "shapes", "format": "formats"}.get(name, name),
                    [] if value == ["none"] else value)
    import torch

    header = {"date": time.strftime("%Y-%m-%d %H:%M %Z"),
              "command": "python -m moecore " + shlex.join(args.argv),
              "machine": f"{_cpu_name()}, {len(os.sched_getaffinity(0))} CPUs",
              "moecore": f"{moecore.__version__}, ISA {config.isa_level or moecore.detected_isa_level()}",
              "torch": torch.__version__, "python": platform.python_version(),
              "caches": (f"evicted before every timed call ({bench.eviction_bytes() >> 20} MiB "
                         "read)" if config.cold else "kept warm between timed calls (--warm)")}
    machine = bench.measure_machine(config)
    peers = config.peers
    if args.csv or args.json:
        emit = None
    else:
        print("\n".join(report.machine_lines(machine, header)) + "\n")
        print(report.markdown_header(peers), flush=True)
        emit = lambda row: print(report.markdown_row(row, peers), flush=True)  # noqa: E731
    rows, failures, skipped = bench.run(config, machine, emit)
    if args.csv:
        print(report.to_csv(rows), end="")
    elif args.json:
        print(report.to_json(rows, machine, header, skipped))
    if emit and skipped:
        print("\nNot run: " + "; ".join(skipped))
    if args.chart:
        report.chart(rows, args.chart)
    for failure in failures:
        print(f"CHECK FAILED: {failure}", file=sys.stderr)
    return 1 if failures else 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m moecore", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser("demo", help="run every executable path on a synthetic MoE layer")
    demo.add_argument("--tokens", type=int, default=64)
    demo.add_argument("--experts", type=int, default=8)
    demo.add_argument("--hidden", type=int, default=256)
    demo.add_argument("--intermediate", type=int, default=512)
    demo.add_argument("--top-k", type=int, default=2)
    demo.add_argument("--dtype", choices=["f32", "f16", "bf16"], default="bf16")
    demo.add_argument("--seed", type=int, default=0)
    demo.set_defaults(func=_demo)
    check = sub.add_parser("check", help="print the ISA level, threads and registries")
    check.set_defaults(func=_check)
    _add_bench_parser(sub)
    args = parser.parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
