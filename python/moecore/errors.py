"""moecore's exception classes.

Each also derives from the built-in a Python caller would expect, so ``except ValueError``
catches a bad shape and ``except moecore.MoecoreError`` catches everything moecore raises.
The C++ core raises the matching class (see cpp/bindings/bind_errors.cpp). This module never
imports the extension.
"""


class MoecoreError(Exception):
    """Base of every moecore error."""


class InvalidArgumentError(MoecoreError, ValueError):
    """A bad value: shape, stride, size, config value, unknown name."""


class DTypeError(MoecoreError, TypeError):
    """A wrong or untagged dtype, or an object of the wrong type."""


class UnsupportedError(MoecoreError, NotImplementedError):
    """A combination that is not built, not registered or not available on this machine."""


class OutOfRangeError(MoecoreError, IndexError):
    """An index out of range: expert ids, ranks."""


class ContractAssertionError(MoecoreError, AssertionError):
    """A contract check sglang expresses as an assertion (e.g. an unregistered permute)."""


class InternalError(MoecoreError, RuntimeError):
    """A broken internal invariant: a moecore bug. Please report it."""


__all__ = [
    "MoecoreError",
    "InvalidArgumentError",
    "DTypeError",
    "UnsupportedError",
    "OutOfRangeError",
    "ContractAssertionError",
    "InternalError",
]
