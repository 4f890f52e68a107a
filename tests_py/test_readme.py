"""The README's Python examples run as written and compute what they claim: the runner example
matches its numpy reference, the layer example (loaded from w1/w3/w2 shards) matches the
reference on the weights it loaded, and the FP8 layer stays within FP8 error of it."""

import pathlib
import re

import numpy as np

from moecore.reference.moe import fused_moe_ref
from moecore.testing import assert_close

README = pathlib.Path(__file__).resolve().parents[1] / "README.md"


def _python_blocks():
    return re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)


def test_readme_examples_run_and_match_the_reference():
    runner_example, layer_example, fp8_example = _python_blocks()[:3]
    ns = {}
    exec(compile(runner_example, f"{README}:runner", "exec"), ns)  # noqa: S102 - our README
    assert_close(np.asarray(ns["y"], dtype=np.float32), ns["ref"], "bf16")

    exec(compile(layer_example, f"{README}:layer", "exec"), ns)  # noqa: S102
    w13 = np.concatenate([ns["w1"], ns["w3"]], axis=1).astype(np.float32)
    topk = ns["topk"]  # the layer routes the same logits with the same TopKConfig
    expected = fused_moe_ref(ns["x"].astype(np.float32), w13, ns["w2_ckpt"].astype(np.float32),
                             topk.topk_weights, topk.topk_ids, act_dtype="bf16", contract="triton")
    assert_close(np.asarray(ns["y"], dtype=np.float32), expected, "bf16")

    # The FP8 block layer of the quantized section: same routing, fp8 codes for weights and
    # activations, so close to the bf16 layer but not equal (NMSE of fp8 e4m3 rounding).
    exec(compile(fp8_example, f"{README}:fp8", "exec"), ns)  # noqa: S102
    y, y8 = np.asarray(ns["y"], np.float32), np.asarray(ns["y8"], np.float32)
    nmse = float(np.sum((y8 - y) ** 2) / np.sum(y**2))
    assert 1e-5 < nmse < 2e-2, nmse


def test_readme_capture_example_replays_bitwise():
    capture_example = next(b for b in _python_blocks() if "MoeGraphRunner" in b)
    ns = {}
    exec(compile(capture_example, f"{README}:capture", "exec"), ns)  # noqa: S102
    assert ns["graph"].capacity == 8


def test_readme_expert_parallel_examples_run_and_capture_bitwise():
    blocks = _python_blocks()
    group_example = next(b for b in blocks if "ExpertParallelGroup(" in b)
    group_capture = next(b for b in blocks if "MoeGraphRunner(group" in b)
    ns = {}
    exec(compile(group_example, f"{README}:expert-parallel", "exec"), ns)  # noqa: S102
    exec(compile(group_capture, f"{README}:group-capture", "exec"), ns)  # noqa: S102
    assert ns["graph"].capacity == 4 and ns["graph"].size == 2
