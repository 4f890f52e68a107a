"""The Python Enum classes, built from the C++ list (cpp/moecore/core/backends.def).

Members, values and predicates match sglang's (``MoeRunnerBackend("triton")``,
``MoeRunnerBackend.TRITON.is_triton()``, ``MoeA2ABackend(None) is MoeA2ABackend.NONE``,
``DeepEPMode.AUTO.resolve(is_extend_in_batch)``), so harnesses written for sglang port directly.
"""

from enum import Enum, IntEnum

from . import _moecore


def _predicates(members):
    """is_<name>() for every member, as sglang's enums define them."""
    return {
        f"is_{name.lower()}": (lambda self, _n=name: self.name == _n) for name, _ in members
    }


def _make(name, extra=None):
    members = _moecore._enum_table(name)
    cls = Enum(name, members, module=__name__, qualname=name)
    for attr, fn in {**_predicates(members), **(extra or {})}.items():
        setattr(cls, attr, fn)
    return cls


def _a2a_missing(cls, value):
    if value is None:
        return cls.NONE
    raise ValueError(f"No MoeA2ABackend member for value {value}")


MoeRunnerBackend = _make("MoeRunnerBackend")
MoeRunnerBackend.is_fused_only = lambda self: self.value in _moecore._fused_only_backends()

MoeA2ABackend = _make(
    "MoeA2ABackend",
    {
        "is_deepep_class_backend": lambda self: self.name in ("DEEPEP", "MOONCAKE", "MORI"),
        "supports_aiter": lambda self: self.name in ("NONE", "DEEPEP", "MOONCAKE", "NIXL", "MORI"),
    },
)
MoeA2ABackend._missing_ = classmethod(_a2a_missing)

DeepEPMode = _make(
    "DeepEPMode",
    {
        "enable_normal": lambda self: self.name in ("NORMAL", "AUTO"),
        "enable_low_latency": lambda self: self.name in ("LOW_LATENCY", "AUTO"),
        "resolve": lambda self, is_extend_in_batch: (
            self
            if self.name != "AUTO"
            else (DeepEPMode.NORMAL if is_extend_in_batch else DeepEPMode.LOW_LATENCY)
        ),
    },
)

DispatchOutputFormat = _make(
    "DispatchOutputFormat",
    {"is_deepep": lambda self: self.name in ("DEEPEP_NORMAL", "DEEPEP_LL")},
)
# sglang keeps a separate class with the same values.
CombineInputFormat = Enum(
    "CombineInputFormat", _moecore._enum_table("DispatchOutputFormat"), module=__name__
)
for _attr, _fn in _predicates(_moecore._enum_table("DispatchOutputFormat")).items():
    setattr(CombineInputFormat, _attr, _fn)

TopKOutputFormat = IntEnum("TopKOutputFormat", _moecore._enum_table("TopKOutputFormat"), module=__name__)
for _attr, _fn in _predicates(_moecore._enum_table("TopKOutputFormat")).items():
    setattr(TopKOutputFormat, _attr, _fn)

ScoringFunc = _make("ScoringFunc")
Activation = _make("Activation")

__all__ = [
    "MoeRunnerBackend",
    "MoeA2ABackend",
    "DeepEPMode",
    "DispatchOutputFormat",
    "CombineInputFormat",
    "TopKOutputFormat",
    "ScoringFunc",
    "Activation",
]
