"""Peak memory of a forward: the weights plus a workspace proportional to M·k·(H + I), for every
weight format of the benchmark (each through the backend that serves it), at every ISA level this
machine has. The layer's weights are made much larger than that bound, so a decoded copy of the
weights (or of the experts a batch touches) cannot hide under it. Measured as the growth of the
process's peak resident set (VmHWM, reset through /proc/self/clear_refs) over the first call,
which builds the runner's workspace, and over a later call, which must not grow it again."""

from __future__ import annotations

import numpy as np
import pytest

import moecore
from moecore._bench.workloads import FORMATS, Shape, build_layer, make_tokens

# 64 experts of H = 1024, I = 512 (bf16 weights 192 MiB, 4-bit ones 48 MiB), 8 tokens routed to
# 2 experts each: M·k·(H + I) = 24576, and 16 touched experts hold 48 MiB decoded to bf16.
SHAPE = Shape("memory-probe", 64, 2, 1024, 512)
TOKENS = 8
# Bytes of workspace per element of M·k·(H + I): the f32 rows the runner keeps (gathered input,
# GEMM1 and GEMM2 outputs, the activation's output) come to 16; the rest is slack.
BYTES_PER_ELEMENT = 64
# Per-thread kernel working memory (independent of M: room for converted activation rows, 64 MiB
# a thread but resident only as far as calls convert rows into it, and one block of decoded weight
# columns), the routing/dispatch tensors and the allocator's granularity. With 16 threads the kept
# rows' room (then 4 MiB) once grew the peak by 64 MiB, when a growing scratch copied its old bytes.
FIXED_SLACK = 24 << 20


def _status_kib(field: str) -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise AssertionError(f"/proc/self/status has no {field}")


def _peak_growth_bytes(fn) -> int:
    """How far the peak resident set rises above its level before fn runs."""
    with open("/proc/self/clear_refs", "w") as clear:
        clear.write("5")  # the peak (VmHWM) restarts from the current resident set
    before = _status_kib("VmRSS")
    fn()
    return (_status_kib("VmHWM") - before) * 1024


def _can_reset_peak() -> bool:
    try:
        _peak_growth_bytes(lambda: None)
        return True
    except OSError:
        return False


pytestmark = pytest.mark.skipif(not _can_reset_peak(),
                                reason="needs Linux's /proc/self/clear_refs to reset the peak RSS")


@pytest.mark.parametrize("isa", moecore.available_isa_levels())
@pytest.mark.parametrize("fmt", sorted(FORMATS))
def test_forward_peak_memory_is_weights_plus_workspace_proportional_to_tokens(fmt, isa):
    rng = np.random.default_rng(0)
    layer = build_layer(SHAPE, fmt, rng, peers=False)
    x, weights, ids = make_tokens(rng, SHAPE, TOKENS)
    dispatch = moecore.StandardDispatchOutput(
        x, topk_output=moecore.StandardTopKOutput(weights, ids))
    runner = moecore.MoeRunner(layer.backend, moecore.MoeRunnerConfig(inplace=False, isa_level=isa))
    bound = BYTES_PER_ELEMENT * TOKENS * SHAPE.top_k * (SHAPE.hidden + SHAPE.inter) + FIXED_SLACK
    # The touched experts' weights decoded to bf16 (the least a decoded copy would take).
    touched = min(SHAPE.experts, TOKENS * SHAPE.top_k)
    assert touched * 3 * SHAPE.hidden * SHAPE.inter * 2 > bound

    first = _peak_growth_bytes(lambda: runner.run(dispatch, layer.quant_info))
    assert first <= bound, f"{fmt} at {isa}: first call grew the peak by {first >> 20} MiB"
    later = _peak_growth_bytes(lambda: runner.run(dispatch, layer.quant_info))
    assert later <= bound, f"{fmt} at {isa}: a later call grew the peak by {later >> 20} MiB"
