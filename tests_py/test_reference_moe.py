"""The numpy MoE reference (moecore.reference.fused_moe_ref) vs an independent torch
implementation: a naive per-expert loop written with torch ops (F.linear, F.silu, F.gelu,
torch's own bf16/f16 rounding), for every activation and option and each contract.

Oracle: torch CPU. In float64 torch is compared with the "exact" contract (tolerance row
"f64"); in f32/f16/bf16 the loop stores values in the activation dtype at the contract's
rounding points, so it checks the reference's rounding placement and its RNE rounding; both
use the tolerance table of moecore.testing. The reference never calls the extension, so these
tests do not depend on the C++ core.
"""

from __future__ import annotations

import zlib

import numpy as np
import pytest

torch = pytest.importorskip("torch")
F = torch.nn.functional

from moecore.reference import activation_ref, fused_moe_ref  # noqa: E402
from moecore.testing import assert_close, is_close, make_moe_problem  # noqa: E402

TORCH_DTYPES = {"f64": torch.float64, "f32": torch.float32, "f16": torch.float16,
                "bf16": torch.bfloat16}


def _seed(*parts) -> int:
    return zlib.crc32("-".join(str(p) for p in parts).encode())


def _t(a) -> torch.Tensor:
    """numpy (incl. ml_dtypes bf16) → float64 torch tensor, exactly."""
    return torch.from_numpy(np.asarray(a).astype(np.float32).astype(np.float64))


def _torch_act(name, g):
    if name == "silu":
        return F.silu(g)
    if name == "gelu":
        return F.gelu(g, approximate="none")
    if name == "gelu_tanh":
        return F.gelu(g, approximate="tanh")
    if name == "relu2":
        return torch.relu(g) ** 2
    raise ValueError(name)


def torch_moe(p, *, dtype, contract, activation="silu", gemm1_alpha=None, gemm1_clamp_limit=None,
              gemm1_beta=None, swiglu_limit=None, apply_router_weight_on_input=False,
              routed_scaling_factor=None, no_combine=False):
    """Naive loop over tokens' slots, grouped per expert. `dtype` is the torch storage dtype
    of intermediates; GEMMs run in float32 (float64 for f64) and are cast once, as the
    contracts say. contract "triton" or "torch_native" (for f64: any, no rounding)."""
    sd = TORCH_DTYPES[dtype]
    gemm1_alpha, gemm1_clamp_limit = _f32(gemm1_alpha), _f32(gemm1_clamp_limit)
    gemm1_beta, swiglu_limit = _f32(gemm1_beta), _f32(swiglu_limit)
    cd = torch.float64 if dtype == "f64" else torch.float32  # compute dtype
    x, w13, w2 = _t(p.x).to(cd), _t(p.w13).to(cd), _t(p.w2).to(cd)
    b13 = None if p.b13 is None else _t(p.b13).to(cd)
    b2 = None if p.b2 is None else _t(p.b2).to(cd)
    ids = torch.from_numpy(p.topk_ids.astype(np.int64))
    wts = torch.from_numpy(p.topk_weights).to(cd)
    T, k = ids.shape
    H, inter = w2.shape[1], w2.shape[2]
    slots = torch.zeros(T, k, H, dtype=sd)
    for e in range(w13.shape[0]):
        tok, slot = torch.nonzero(ids == e, as_tuple=True)
        if tok.numel() == 0:
            continue
        w = wts[tok, slot].unsqueeze(1)
        h1 = F.linear(x[tok], w13[e], None if b13 is None else b13[e])
        if apply_router_weight_on_input:
            h1 = h1 * w
        h1 = h1.to(sd)
        if gemm1_alpha is not None:
            g = h1[:, 0::2].to(cd).clamp(max=gemm1_clamp_limit)
            u = h1[:, 1::2].to(cd).clamp(-gemm1_clamp_limit, gemm1_clamp_limit)
            beta = 1.0 if gemm1_beta is None else gemm1_beta
            h2 = (g * torch.sigmoid(gemm1_alpha * g) * (u + beta)).to(sd)
        elif not p.gated:
            h2 = _torch_act(activation, h1.to(cd)).to(sd)
        else:
            g, u = h1[:, :inter], h1[:, inter:]
            if swiglu_limit is not None:
                g = g.clamp(max=swiglu_limit)
                u = u.clamp(-swiglu_limit, swiglu_limit)
            if contract == "torch_native":  # SiluAndMul.forward_native: act in sd, product in sd
                h2 = _torch_act(activation, g) * u
            else:
                h2 = (_torch_act(activation, g.to(cd)) * u.to(cd)).to(sd)
        y = F.linear(h2.to(cd), w2[e], None if b2 is None else b2[e])
        if contract == "triton" and not apply_router_weight_on_input:
            y = y * w
        slots[tok, slot] = y.to(sd)
    valid = (ids >= 0).to(cd).unsqueeze(-1)
    rsf = 1.0 if routed_scaling_factor is None else float(np.float32(routed_scaling_factor))
    if contract == "torch_native":
        weighted = slots.to(cd) * (wts * (ids >= 0)).unsqueeze(-1)
        if no_combine:
            return weighted.to(sd)
        return (weighted.sum(dim=1) * rsf).to(sd)
    if no_combine:
        return slots
    return ((slots.to(cd) * valid).sum(dim=1) * rsf).to(sd)


def _np(t: torch.Tensor) -> np.ndarray:
    return t.to(torch.float64).numpy()


ACTIVATIONS = [
    pytest.param("silu", True, id="silu-gated"),
    pytest.param("gelu", True, id="gelu-gated"),
    pytest.param("gelu_tanh", True, id="gelu_tanh-gated"),
    pytest.param("silu", False, id="silu-plain"),
    pytest.param("gelu", False, id="gelu-plain"),
    pytest.param("gelu_tanh", False, id="gelu_tanh-plain"),
    pytest.param("relu2", False, id="relu2-plain"),
]

OPTIONS = [
    pytest.param({}, 2, False, id="plain"),
    pytest.param({}, 2, True, id="bias"),
    pytest.param(dict(gemm1_alpha=1.702, gemm1_clamp_limit=7.0), 2, True, id="gptoss"),
    pytest.param(dict(gemm1_alpha=1.702, gemm1_clamp_limit=7.0, gemm1_beta=0.25), 2, False,
                 id="gptoss-beta"),
    pytest.param(dict(swiglu_limit=2.0), 2, True, id="swiglu_limit"),
    pytest.param(dict(routed_scaling_factor=2.5), 4, False, id="rsf"),
    pytest.param(dict(routed_scaling_factor=2.5), 1, False, id="rsf-k1"),
    pytest.param(dict(no_combine=True), 2, True, id="no_combine"),
    pytest.param(dict(no_combine=True, routed_scaling_factor=3.0), 2, False, id="no_combine-rsf"),
    pytest.param(dict(apply_router_weight_on_input=True), 1, False, id="weight_on_input"),
    pytest.param(dict(apply_router_weight_on_input=True), 1, True, id="weight_on_input-bias"),
]

CONTRACTS = ["triton", "torch_native"]


def _scales(opts) -> dict:
    """Clamp options need GEMM1 values past the limit (|h1| up to ~15); a small W2 keeps
    GEMM2's terms from cancelling at that size."""
    clamps = "gemm1_alpha" in opts or "swiglu_limit" in opts
    return dict(scale=4.0, w2_scale=0.25) if clamps else dict(scale=1.0)


def _f32(v):
    """MoeRunnerConfig holds its scalars as float32; the oracle uses the same values."""
    return None if v is None else float(np.float32(v))


@pytest.mark.parametrize("activation,gated", ACTIVATIONS)
@pytest.mark.parametrize("contract", CONTRACTS)
@pytest.mark.parametrize("dtype", ["f32", "f16", "bf16"])
def test_activation_vs_torch(dtype, contract, activation, gated):
    rng = np.random.default_rng(_seed("act", dtype, contract, activation, gated))
    p = make_moe_problem(rng, T=33, E=4, H=40, I=24, k=2, dtype=dtype, gated=gated, bias=True)
    p.topk_ids[4, 1] = -1
    ref = fused_moe_ref(**p.ref_kwargs(), activation=activation, contract=contract)
    want = torch_moe(p, dtype=dtype, contract=contract, activation=activation)
    assert ref.dtype == np.float32
    assert_close(ref, _np(want), dtype, what=f"reference vs torch ({contract})")


@pytest.mark.parametrize("opts,k,bias", OPTIONS)
@pytest.mark.parametrize("contract", CONTRACTS + ["exact"])
@pytest.mark.parametrize("dtype", ["f32", "bf16"])
def test_option_vs_torch(dtype, contract, opts, k, bias):
    rng = np.random.default_rng(_seed("opt", dtype, contract, sorted(opts.items()), k, bias))
    p = make_moe_problem(rng, T=33, E=4, H=40, I=24, k=k, dtype=dtype, bias=bias,
                         **_scales(opts))
    if k > 1:
        p.topk_ids[0, 0] = -1
    if contract == "torch_native" and opts.get("apply_router_weight_on_input"):
        with pytest.raises(NotImplementedError, match="apply_router_weight_on_input"):
            fused_moe_ref(**p.ref_kwargs(), contract=contract, **opts)
        return
    ref = fused_moe_ref(**p.ref_kwargs(), contract=contract, **opts)
    if contract == "exact":  # float64 torch, no rounding, triton's weight placement
        want = torch_moe(p, dtype="f64", contract="triton", **opts)
        assert ref.dtype == np.float64
        assert_close(ref, _np(want), "f64", what="exact reference vs float64 torch")
    else:
        want = torch_moe(p, dtype=dtype, contract=contract, **opts)
        assert_close(ref, _np(want), dtype, what=f"reference vs torch ({contract})")


@pytest.mark.parametrize("opts,k,bias", [o for o in OPTIONS if o.values[0]])
def test_options_change_the_result(opts, k, bias):
    """Each option is live in the reference: the exact result differs from the plain one
    (no_combine: per-slot rows whose sum, times rsf, is the combined output — rsf itself is
    not applied to the rows)."""
    rng = np.random.default_rng(_seed("live", sorted(opts.items()), k, bias))
    p = make_moe_problem(rng, T=33, E=4, H=40, I=24, k=k, dtype="f32", bias=True,
                         **_scales(opts))
    if k == 1:
        p.topk_weights[:] = 0.5
    with_opt = fused_moe_ref(**p.ref_kwargs(), contract="exact", **opts)
    if opts.get("no_combine"):
        rsf = opts.get("routed_scaling_factor")
        assert with_opt.shape == (33, k, 40)
        unscaled_rows = fused_moe_ref(**p.ref_kwargs(), contract="exact", no_combine=True)
        np.testing.assert_array_equal(with_opt, unscaled_rows)
        combined = fused_moe_ref(**p.ref_kwargs(), contract="exact", routed_scaling_factor=rsf)
        assert_close(with_opt.sum(axis=1) * (1.0 if rsf is None else _f32(rsf)), combined, "f64")
        return
    without = fused_moe_ref(**p.ref_kwargs(), contract="exact")
    assert not is_close(with_opt, without, "f32")


@pytest.mark.parametrize("dtype", ["f32", "f16", "bf16"])
def test_contracts_agree_with_exact(dtype):
    """The rounded contracts stay within the dtype's tolerance of the float64 math."""
    rng = np.random.default_rng(_seed("exact", dtype))
    p = make_moe_problem(rng, T=64, E=8, H=64, I=48, k=2, dtype=dtype, bias=True)
    exact = fused_moe_ref(**p.ref_kwargs(), contract="exact")
    for contract in CONTRACTS:
        ref = fused_moe_ref(**p.ref_kwargs(), contract=contract)
        assert_close(ref, exact, f"{dtype}_vs_exact", what=f"{contract} vs exact")


def test_bf16_contracts_round_differently():
    """torch_native rounds act(gate) before the product, triton does not: in bf16 the two
    contracts give different bits on the same inputs (both stay close to the exact math)."""
    rng = np.random.default_rng(_seed("differ"))
    p = make_moe_problem(rng, T=64, E=4, H=40, I=24, k=2, dtype="bf16")
    a = fused_moe_ref(**p.ref_kwargs(), contract="triton")
    b = fused_moe_ref(**p.ref_kwargs(), contract="torch_native")
    assert not np.array_equal(a, b)
    exact = fused_moe_ref(**p.ref_kwargs(), contract="exact")
    assert_close(a, exact, "bf16_vs_exact")
    assert_close(b, exact, "bf16_vs_exact")


def test_rounding_points_are_rne():
    """The bf16 values the reference produces are bf16 numbers (torch's bf16 cast leaves them
    unchanged), and f32 results are what float64 math rounds to at each point."""
    rng = np.random.default_rng(_seed("rne"))
    p = make_moe_problem(rng, T=16, E=4, H=32, I=16, k=2, dtype="bf16")
    ref = fused_moe_ref(**p.ref_kwargs(), contract="triton")
    as_bf16 = torch.from_numpy(ref).to(torch.bfloat16).to(torch.float32).numpy()
    np.testing.assert_array_equal(ref, as_bf16)


@pytest.mark.parametrize("name", ["silu", "gelu", "gelu_tanh", "relu2"])
def test_activation_formulas_vs_torch(name):
    x = np.linspace(-12.0, 12.0, 2001)
    got = activation_ref(name, x)
    want = _np(_torch_act(name, torch.from_numpy(x)))
    assert_close(got, want, "f64", what=name)


def test_reference_rejects_bad_arguments():
    rng = np.random.default_rng(0)
    p = make_moe_problem(rng, T=3, E=4, H=16, I=8, k=2)
    with pytest.raises(ValueError, match="contract"):
        fused_moe_ref(**p.ref_kwargs(), contract="cuda")
    with pytest.raises(ValueError, match="Unsupported activation"):
        fused_moe_ref(**p.ref_kwargs(), activation="tanh")
    with pytest.raises(ValueError, match="topk_ids"):
        fused_moe_ref(**{**p.ref_kwargs(), "topk_ids": p.topk_ids + 4})
    with pytest.raises(ValueError, match="topk=1"):
        fused_moe_ref(**p.ref_kwargs(), apply_router_weight_on_input=True)


def test_reference_imports_neither_extension_nor_torch():
    """moecore/reference/moe.py and the dtypes helpers it uses import only numpy and pure
    Python modules (the compiled core must not be its own oracle)."""
    import ast
    import pathlib

    import moecore.reference.moe as moe_mod

    for path in (pathlib.Path(moe_mod.__file__),
                 pathlib.Path(moe_mod.__file__).parent.parent / "dtypes.py"):
        imported = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                imported |= {a.name for a in node.names}
            elif isinstance(node, ast.ImportFrom):
                imported.add("." * node.level + (node.module or ""))
        assert not {m for m in imported if "_moecore" in m or m.split(".")[0] == "torch"}, (
            f"{path.name} imports {sorted(imported)}")
        assert imported <= {"__future__", "math", "numpy", "ml_dtypes", "..dtypes", ".routing",
                            ".errors"}, f"{path.name} imports {sorted(imported)}"
