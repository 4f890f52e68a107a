"""Weight tiles (kernels/weight_tiles.h): the weights prepacked at load into one stream per decode
tile. Every runner path gives the same bits with and without them, at every ISA level; the kernel
rows that stream tiles (avx512_bf16, amx; not the opt-in AMX float tiles) really read them in
decode calls and, on AMD cores, in fp4 calls of 5, 6 and 9 to 24 rows, and other calls read the
contract rows;
FusedMoE packs them when it processes its weights unless MoeRunnerConfig.prepack_weight_tiles is
False."""

import ml_dtypes
import numpy as np
import pytest

import moecore
from moecore._bench.workloads import Shape, build_layer, make_tokens

SHAPE = Shape("tiles", experts=4, top_k=2, hidden=256, inter=128)
FORMATS = ["bf16", "fp8", "nvfp4", "mxfp4", "int8"]
TILE_KERNELS = {"avx512_bf16", "amx"}  # runner.config.gemm_kernel of the rows that read tiles


def _runner(layer, level):
    return moecore.MoeRunner(layer.backend, moecore.MoeRunnerConfig(inplace=False, isa_level=level))


def _run(layer, m, level):
    rng = np.random.default_rng(5)
    x, w, ids = make_tokens(rng, SHAPE, m)
    d = moecore.StandardDispatchOutput(x, topk_output=moecore.StandardTopKOutput(w, ids))
    return np.asarray(_runner(layer, level).run(d, layer.quant_info).hidden_states).copy()


@pytest.mark.parametrize("level", moecore.available_isa_levels())
@pytest.mark.parametrize("fmt", FORMATS)
def test_tiles_give_the_contract_layouts_bits_and_are_read(fmt, level):
    tiled = build_layer(SHAPE, fmt, np.random.default_rng(1), peers=False)
    plain = build_layer(SHAPE, fmt, np.random.default_rng(1), peers=False, weight_tiles=False)
    assert plain.quant_info.weight_tiles is None
    tiles = tiled.quant_info.weight_tiles
    assert len(tiles) == 2 and all(t.dtype == np.uint8 and t.shape[-2:] == (4, 64) for t in tiles)
    # Rows per expert: decode tiles of 4 channels, 2-channel tiles (fp4 on AMD cores: 4-channel
    # tiles of 6 rows from the tiles), 4 × 6 tiles (fp4 from the tiles on AMD cores, else columns
    # decoded once), decoded column blocks.
    for m in (1, 3, 16, 40, 80):
        want = _run(plain, m, level)
        np.testing.assert_array_equal(_run(tiled, m, level), want)
    # Zeroed tiles change the result exactly where the row streams them: decode calls (4-channel
    # tiles) and, on AMD cores, fp4 calls of 5, 6 and 9 to 24 rows per expert. Other calls read
    # the contract rows.
    for t in tiles:
        t[...] = 0
    reads = _runner(tiled, level).config.gemm_kernel in TILE_KERNELS
    changed = not np.array_equal(_run(tiled, 1, level), _run(plain, 1, level))
    assert changed == reads

    def rows_per_expert(m):
        _, _, ids = make_tokens(np.random.default_rng(5), SHAPE, m)
        return np.bincount(np.asarray(ids).ravel(), minlength=SHAPE.experts)

    assert rows_per_expert(40).min() >= 9 and rows_per_expert(40).max() <= 24
    changed = not np.array_equal(_run(tiled, 40, level), _run(plain, 40, level))
    amd = moecore.cpu_features()["vendor_amd"]
    assert changed == (reads and fmt in ("nvfp4", "mxfp4") and amd)
    assert rows_per_expert(80).min() > 24
    np.testing.assert_array_equal(_run(tiled, 80, level), _run(plain, 80, level))


def _bf16_layer(**config):
    rng = np.random.default_rng(2)
    E, H, I = 4, 128, 64
    layer = moecore.FusedMoE(num_experts=E, hidden_size=H, intermediate_size=I,
                             topk_config=moecore.TopKConfig(top_k=2), params_dtype="bf16",
                             runner_config=moecore.MoeRunnerConfig(**config))
    for e in range(E):
        for shard, shape in (("w1", (I, H)), ("w3", (I, H)), ("w2", (H, I))):
            prefix = "w2" if shard == "w2" else "w13"
            w = (rng.standard_normal(shape) * 0.1).astype(ml_dtypes.bfloat16)
            layer.weight_loader(f"{prefix}_weight", w, "w", shard, e)
    layer.process_weights_after_loading()
    return layer


def test_fused_moe_packs_tiles_when_processing_unless_told_not_to():
    packed, plain = _bf16_layer(), _bf16_layer(prepack_weight_tiles=False)
    assert plain.quant_method.weight_tiles is None
    reads = moecore.MoeRunner("triton", moecore.MoeRunnerConfig()).config.gemm_kernel in TILE_KERNELS
    if not reads:
        assert packed.quant_method.weight_tiles is None
        return
    w13, w2 = packed.quant_method.weight_tiles
    assert w13.shape == (4, 32, 4, 4, 64) and w2.shape == (4, 32, 2, 4, 64)
    # Tile row 1 of group 0 holds w13 row 1's first 64 bytes.
    row = np.asarray(packed.parameter("w13_weight"))[0, 1].view(np.uint8)
    np.testing.assert_array_equal(w13[0, 0, 0, 1], row[:64])
    x = np.random.default_rng(3).standard_normal((5, 128)).astype(ml_dtypes.bfloat16)
    logits = np.random.default_rng(4).standard_normal((5, 4)).astype(np.float32)
    np.testing.assert_array_equal(np.asarray(packed.forward(x, logits)),
                                  np.asarray(plain.forward(x, logits)))


def test_quant_info_built_by_hand_packs_on_request():
    layer = build_layer(SHAPE, "fp8", np.random.default_rng(1), peers=False, weight_tiles=False)
    q = layer.quant_info
    assert q.weight_tiles is None
    q.pack_weight_tiles()
    w13, w2 = q.weight_tiles
    assert w13.shape == (4, 64, 4, 4, 64) and w2.shape == (4, 64, 2, 4, 64)
