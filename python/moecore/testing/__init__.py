"""Shared test helpers for moecore: the one tolerance table, comparison asserts, seeded data
generators, and test parameters derived from the registries. Test-only: importing it needs
numpy (and pytest for ``params``), never torch or transformers.
"""

from .asserts import (
    CANONICAL_ORDER_LEVELS,
    assert_bitwise_equal,
    assert_close,
    assert_isa_levels_agree,
    error_stats,
    is_close,
)
from .data import MoeProblem, cast, make_moe_problem, random_routing
from .tolerances import TOLERANCES, Tolerance, tolerance, tolerance_for_dtype

__all__ = [
    "TOLERANCES",
    "Tolerance",
    "tolerance",
    "tolerance_for_dtype",
    "assert_close",
    "assert_bitwise_equal",
    "assert_isa_levels_agree",
    "CANONICAL_ORDER_LEVELS",
    "error_stats",
    "is_close",
    "MoeProblem",
    "make_moe_problem",
    "cast",
    "random_routing",
]
