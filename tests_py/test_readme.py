"""The README's Python examples run as written and compute what they claim: the runner example
matches its numpy reference, and the layer example (loaded from w1/w3/w2 shards) matches the
reference on the weights it loaded."""

import pathlib
import re

import numpy as np

from moecore.reference.moe import fused_moe_ref
from moecore.testing import assert_close

README = pathlib.Path(__file__).resolve().parents[1] / "README.md"


def _python_blocks():
    return re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)


def test_readme_examples_run_and_match_the_reference():
    runner_example, layer_example = _python_blocks()[:2]
    ns = {}
    exec(compile(runner_example, f"{README}:runner", "exec"), ns)  # noqa: S102 - our README
    assert_close(np.asarray(ns["y"], dtype=np.float32), ns["ref"], "bf16")

    exec(compile(layer_example, f"{README}:layer", "exec"), ns)  # noqa: S102
    w13 = np.concatenate([ns["w1"], ns["w3"]], axis=1).astype(np.float32)
    topk = ns["topk"]  # the layer routes the same logits with the same TopKConfig
    expected = fused_moe_ref(ns["x"].astype(np.float32), w13, ns["w2_ckpt"].astype(np.float32),
                             topk.topk_weights, topk.topk_ids, act_dtype="bf16", contract="triton")
    assert_close(np.asarray(ns["y"], dtype=np.float32), expected, "bf16")
