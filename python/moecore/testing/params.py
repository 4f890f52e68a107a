"""Test parameters derived from moecore's registries, never hand-listed: runner paths (each
registered runner backend, fused and forced-unfused), ISA levels of this machine, dtypes, with
readable ids such as "triton-fused-bf16-avx512".
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Iterable, Optional

import pytest

import moecore

__all__ = [
    "DTYPES",
    "RunnerPath",
    "runner_paths",
    "runner_backends",
    "isa_levels",
    "quant_info_class",
    "path_params",
    "grid",
]

DTYPES = ("f32", "f16", "bf16")


# Backends whose contract includes plain f32/f16/bf16 experts with biases, and the payload they
# take for it. This is contract knowledge the registry cannot express (deep_gemm has a runner
# core but only bf16 without biases; the flashinfer paths are fused-only with their own scales);
# the executable paths themselves still come from the registry.
_UNQUANTIZED_PAYLOADS = {
    "triton": "TritonMoeQuantInfo",
    "torch_native": "TorchNativeMoeQuantInfo",
}


def quant_info_class(backend: str):
    """The unquantized QuantInfo class of a runner backend, or None when its contract has no
    plain-weights path."""
    name = _UNQUANTIZED_PAYLOADS.get(backend)
    return getattr(moecore, name) if name else None


@dataclass(frozen=True)
class RunnerPath:
    """One executable way to run a backend on the standard (a2a "none") dispatch: the
    registered fused func, or pre-permute → runner core → post-permute (force_unfused)."""

    backend: str
    fused: bool

    @property
    def id(self) -> str:
        return f"{self.backend}-{'fused' if self.fused else 'unfused'}"

    def __str__(self) -> str:
        return self.id

    def quant_info(self, **kwargs):
        return quant_info_class(self.backend)(**kwargs)

    def runner(self, **config_kwargs):
        """A MoeRunner on this path; config keywords go to MoeRunnerConfig (inplace defaults to
        False so inputs are never overwritten)."""
        config_kwargs.setdefault("inplace", False)
        config = moecore.MoeRunnerConfig(force_unfused=not self.fused, **config_kwargs)
        return moecore.MoeRunner(self.backend, config)


def runner_backends() -> list:
    """Backends with a registered runner core and an unquantized QuantInfo class."""
    return [b for b, _ in moecore.registered_runner_cores() if quant_info_class(b) is not None]


def runner_paths(a2a: str = "none") -> list:
    """Every executable path for the standard dispatch: the fused func of each (a2a, backend)
    registration, and the unfused path of each backend whose runner core has both the
    (standard, backend) pre-permute and the (backend, standard) post-permute registered."""
    pre = {(a, b) for a, b, _ in moecore.registered_pre_permutes()}
    post = {(a, b) for a, b, _ in moecore.registered_post_permutes()}
    backends = runner_backends()
    paths = []
    for a, b, _ in moecore.registered_fused_funcs():
        if a == a2a and b in backends:
            paths.append(RunnerPath(b, fused=True))
    for b in backends:
        if ("standard", b) in pre and (b, "standard") in post:
            paths.append(RunnerPath(b, fused=False))
    return sorted(paths, key=lambda p: (p.backend, not p.fused))


def isa_levels() -> list:
    """Every ISA level this machine can run (scalar included)."""
    return list(moecore.available_isa_levels())


def path_params(*axes: Iterable, marks=None) -> list:
    """pytest.param tuples over the product of axes (RunnerPath and plain values) with ids
    joined by "-" (e.g. "triton-fused-bf16-avx512")."""
    out = []
    for combo in itertools.product(*axes):
        ident = "-".join(str(v) for v in combo)
        out.append(pytest.param(*combo, id=ident, marks=marks or ()))
    return out


def grid(name: str, values: Iterable, ids: Optional[Iterable[str]] = None):
    """pytest.mark.parametrize with readable ids (str(value) unless given)."""
    values = list(values)
    ids = list(ids) if ids is not None else [str(v) for v in values]
    return pytest.mark.parametrize(name, values, ids=ids)
