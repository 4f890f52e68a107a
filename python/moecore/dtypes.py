"""dtypes at the boundary, and explicit conversions.

moecore never converts data silently. bf16 and fp8 arrays cross as ml_dtypes arrays when
ml_dtypes is installed; otherwise (or for packed fp4) pass raw bytes with an explicit tag:
``moecore.tagged(uint16_array, "bf16")``. These helpers convert explicitly, with the same
rounding as the C++ core (round to nearest even).
"""

from __future__ import annotations

import numpy as np

try:  # optional
    import ml_dtypes
except ImportError:  # pragma: no cover - exercised in an environment without ml_dtypes
    ml_dtypes = None

from .errors import DTypeError, InvalidArgumentError


class Tagged:
    """A numpy array of raw storage units plus the moecore dtype they hold."""

    __moecore_tagged__ = True

    def __init__(self, array: np.ndarray, dtype: str):
        if not isinstance(array, np.ndarray):
            raise DTypeError(f"tagged: expected a numpy array, got {type(array).__name__}")
        self.array = array
        self.dtype = dtype

    @property
    def shape(self):
        return self.array.shape

    def __repr__(self):
        return f"Tagged({self.dtype}, shape={self.array.shape})"


def tagged(array: np.ndarray, dtype: str) -> Tagged:
    """Marks raw storage (uint16 for bf16/f16, uint8 for fp8/e8m0/packed fp4) with its dtype."""
    return Tagged(array, dtype)


def bf16_bits_from_f32(x: np.ndarray) -> np.ndarray:
    """fp32 → bf16 bit patterns (uint16), round to nearest even; NaN stays NaN."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    u = x.view(np.uint32).astype(np.uint64)
    nan = (u & 0x7FFFFFFF) > 0x7F800000
    rounded = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
    quiet = ((u >> 16) | 0x40).astype(np.uint16)
    return np.where(nan, quiet, rounded)


def f32_from_bf16_bits(bits: np.ndarray) -> np.ndarray:
    """bf16 bit patterns (uint16) → fp32, exact."""
    bits = np.asarray(bits)
    if bits.dtype != np.uint16:
        raise DTypeError(f"expected uint16 bf16 bits, got {bits.dtype}")
    return (bits.astype(np.uint32) << 16).view(np.float32)


def to_bf16(x: np.ndarray):
    """fp32 array → bf16: an ml_dtypes.bfloat16 array if available, else tagged uint16 bits."""
    bits = bf16_bits_from_f32(x)
    if ml_dtypes is not None:
        return bits.view(ml_dtypes.bfloat16)
    return tagged(bits, "bf16")


def to_f32(x) -> np.ndarray:
    """Any array moecore returns (f32, f16, bf16 as ml_dtypes or uint16 bits) → fp32 copy."""
    if isinstance(x, Tagged):
        if x.dtype in ("bf16", "bfloat16"):
            return f32_from_bf16_bits(x.array)
        if x.dtype in ("f16", "float16"):
            return x.array.view(np.float16).astype(np.float32)
        raise InvalidArgumentError(f"to_f32: cannot widen tagged {x.dtype}")
    x = np.asarray(x)
    if x.dtype == np.uint16:
        raise DTypeError("to_f32: a uint16 array is ambiguous; wrap it with tagged(x, 'bf16')")
    return x.astype(np.float32)


def round_to(x: np.ndarray, dtype: str) -> np.ndarray:
    """fp32 values rounded to f32/f16/bf16 precision (values stay fp32)."""
    x = np.asarray(x, dtype=np.float32)
    if dtype in ("f32", "float32"):
        return x.copy()
    if dtype in ("f16", "float16"):
        return x.astype(np.float16).astype(np.float32)
    if dtype in ("bf16", "bfloat16"):
        return f32_from_bf16_bits(bf16_bits_from_f32(x))
    raise InvalidArgumentError(f"round_to: unknown dtype {dtype!r} (f32, f16, bf16)")


def numpy_dtype(name: str):
    """The numpy dtype moecore uses for a moecore dtype name (ml_dtypes when available)."""
    table = {"f32": np.float32, "f16": np.float16, "u8": np.uint8, "i32": np.int32, "i64": np.int64}
    if name in table:
        return np.dtype(table[name])
    if name == "bf16":
        return np.dtype(ml_dtypes.bfloat16) if ml_dtypes is not None else np.dtype(np.uint16)
    raise InvalidArgumentError(f"numpy_dtype: unknown dtype {name!r}")


__all__ = [
    "Tagged",
    "tagged",
    "bf16_bits_from_f32",
    "f32_from_bf16_bits",
    "to_bf16",
    "to_f32",
    "round_to",
    "numpy_dtype",
]
