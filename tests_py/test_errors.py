"""moecore's exception classes (moecore.errors), each raised by a real API call and caught both as
the moecore class and as the built-in it derives from; MoecoreError catches every one of them,
the classes are exact (not a sibling or the base), picklable, and the errors module stands alone
without the extension.
"""

from __future__ import annotations

import importlib.util
import pickle
import re

import moecore
import numpy as np
import pytest
from moecore import errors

BUILTIN = {
    errors.InvalidArgumentError: ValueError,
    errors.DTypeError: TypeError,
    errors.UnsupportedError: NotImplementedError,
    errors.OutOfRangeError: IndexError,
    errors.ContractAssertionError: AssertionError,
    errors.InternalError: RuntimeError,
}


def _missing_permute():
    class DeepEPLLOutput:
        format = moecore.DispatchOutputFormat.DEEPEP_LL

    rng = np.random.default_rng(0)
    q = moecore.TritonMoeQuantInfo(
        w13_weight=rng.standard_normal((2, 8, 4)).astype(np.float32),
        w2_weight=rng.standard_normal((2, 4, 4)).astype(np.float32),
    )
    runner = moecore.MoeRunner("triton", moecore.MoeRunnerConfig(inplace=False, force_unfused=True))
    runner.run(DeepEPLLOutput(), q)


def _ids_out_of_range():
    rng = np.random.default_rng(1)
    q = moecore.TritonMoeQuantInfo(
        w13_weight=rng.standard_normal((2, 8, 4)).astype(np.float32),
        w2_weight=rng.standard_normal((2, 4, 4)).astype(np.float32),
    )
    d = moecore.StandardDispatchOutput(
        rng.standard_normal((3, 4)).astype(np.float32),
        topk_output=moecore.StandardTopKOutput(
            np.ones((3, 1), np.float32), np.full((3, 1), 2, np.int32)
        ),
    )
    moecore.MoeRunner("triton", moecore.MoeRunnerConfig(inplace=False)).run(d, q)


def _worker_thread_error():
    before = moecore.get_num_threads()
    moecore.set_num_threads(2)
    try:
        moecore._moecore.testing.parallel_raise(100, 99)
    finally:
        moecore.set_num_threads(before)


# (class, call, message pattern, id): real API calls only.
TRIGGERS = [
    pytest.param(
        errors.InvalidArgumentError,
        lambda: moecore.set_num_threads(0),
        re.escape("set_num_threads: expected 1..1024, got 0"),
        id="InvalidArgumentError-set_num_threads",
    ),
    pytest.param(
        errors.InvalidArgumentError,
        lambda: moecore.MoeRunner("bogus", moecore.MoeRunnerConfig()),
        re.escape("'bogus' is not a valid MoeRunnerBackend"),
        id="InvalidArgumentError-backend-name",
    ),
    pytest.param(
        errors.InvalidArgumentError,
        _worker_thread_error,
        "item 99 failed on purpose",
        id="InvalidArgumentError-from-worker-thread",
    ),
    pytest.param(
        errors.DTypeError,
        lambda: moecore.StandardCombineInput(np.zeros(3, np.uint16)),
        "a uint16 array is ambiguous",
        id="DTypeError-untagged-uint16",
    ),
    pytest.param(
        errors.DTypeError,
        lambda: moecore.StandardCombineInput([1.0]),
        "expected a numpy array",
        id="DTypeError-not-an-array",
    ),
    pytest.param(
        errors.UnsupportedError,
        lambda: moecore.MoeRunner("auto", moecore.MoeRunnerConfig()),
        re.escape("'auto' must be resolved"),
        id="UnsupportedError-auto",
    ),
    pytest.param(
        errors.UnsupportedError,
        lambda: moecore.MoeRunner("marlin", moecore.MoeRunnerConfig(), a2a_backend="deepep"),
        re.escape("requires a fused func for a2a backend deepep"),
        id="UnsupportedError-fused-only",
    ),
    pytest.param(
        errors.OutOfRangeError,
        lambda: moecore.StandardDispatcher(8, ep_size=2, ep_rank=2),
        re.escape("expected ep_rank in [0, 2), got 2"),
        id="OutOfRangeError-ep-rank",
    ),
    pytest.param(
        errors.OutOfRangeError,
        _ids_out_of_range,
        re.escape("topk_ids must be in [-1, 2), got 2"),
        id="OutOfRangeError-expert-id",
    ),
    pytest.param(
        errors.ContractAssertionError,
        _missing_permute,
        re.escape("Pre-permute function for deepep_ll to triton is not registered"),
        id="ContractAssertionError-missing-permute",
    ),
]


@pytest.mark.parametrize("cls, call, pattern", TRIGGERS)
def test_error_class_from_real_call(cls, call, pattern):
    with pytest.raises(cls, match=pattern) as as_moecore:
        call()
    assert type(as_moecore.value) is cls  # exactly this class, not a sibling or the base
    with pytest.raises(BUILTIN[cls], match=pattern):
        call()
    with pytest.raises(moecore.MoecoreError, match=pattern):
        call()
    try:
        call()
    except BUILTIN[cls] as e:  # the plain `except ValueError:` a caller would write
        assert isinstance(e, moecore.MoecoreError)
    else:
        pytest.fail("no exception")


def test_every_error_class_is_reached():
    """Every concrete class of moecore.errors has a real-call trigger above, except InternalError
    (a moecore bug by definition), which is covered by the translator hook test below."""
    reached = {p.values[0] for p in TRIGGERS}
    concrete = {getattr(errors, n) for n in errors.__all__} - {errors.MoecoreError}
    assert concrete - reached == {errors.InternalError}


def test_translator_hook():
    """Each C++ exception type maps to its Python class. Needs a raise hook in
    moecore._moecore.testing; InternalError has no other way to be raised from Python."""
    hook = getattr(moecore._moecore.testing, "raise_error", None)
    if hook is None:
        pytest.skip("moecore._moecore.testing.raise_error(kind) is not built")
    for name in errors.__all__:
        if name == "MoecoreError":
            continue
        cls = getattr(errors, name)
        with pytest.raises(cls) as info:
            hook(name)
        assert type(info.value) is cls and isinstance(info.value, BUILTIN[cls])


def test_hierarchy():
    for cls, builtin in BUILTIN.items():
        assert issubclass(cls, errors.MoecoreError) and issubclass(cls, builtin)
        assert cls.__module__ == "moecore.errors"
        assert getattr(moecore, cls.__name__) is cls
        for other in BUILTIN:
            if other is not cls:
                assert not issubclass(cls, other)
    assert not issubclass(
        errors.MoecoreError,
        (ValueError, TypeError, NotImplementedError, IndexError, AssertionError, RuntimeError),
    )
    assert issubclass(errors.MoecoreError, Exception)
    # sglang's callers catch ValueError for bad values; a DTypeError must not look like one.
    with pytest.raises(TypeError):
        try:
            moecore.StandardCombineInput(np.zeros(3, np.uint16))
        except ValueError:
            pytest.fail("a DTypeError was caught as ValueError")


@pytest.mark.parametrize("cls, call, pattern", TRIGGERS)
def test_errors_pickle(cls, call, pattern):
    try:
        call()
    except moecore.MoecoreError as e:
        back = pickle.loads(pickle.dumps(e))
        assert type(back) is type(e) and str(back) == str(e)
    else:
        pytest.fail("no exception")


def test_python_side_errors_use_the_same_classes():
    with pytest.raises(errors.DTypeError, match="tagged: expected a numpy array"):
        moecore.tagged([1, 2], "bf16")
    with pytest.raises(errors.InvalidArgumentError, match="round_to: unknown dtype"):
        moecore.dtypes.round_to(np.zeros(2, np.float32), "f8")
    with pytest.raises(errors.DTypeError, match="ambiguous"):
        moecore.dtypes.to_f32(np.zeros(2, np.uint16))


def test_python_callback_exception_is_not_wrapped():
    class Boom(Exception):
        pass

    def fused(dispatch_output, quant_info, config):
        raise Boom("inside a registered fused func")

    moecore.register_fused_func("customized", "torch_native", fused)
    try:
        runner = moecore.MoeRunner(
            "torch_native", moecore.MoeRunnerConfig(inplace=False), a2a_backend="customized"
        )
        d = moecore.StandardDispatchOutput(
            np.zeros((1, 4), np.float32),
            topk_output=moecore.StandardTopKOutput(
                np.ones((1, 1), np.float32), np.zeros((1, 1), np.int32)
            ),
        )
        with pytest.raises(Boom, match="inside a registered fused func") as info:
            runner.run(d, object())
        assert not isinstance(info.value, moecore.MoecoreError)
    finally:
        moecore.unregister_fused_func("customized", "torch_native")


def test_errors_module_does_not_need_the_extension():
    spec = importlib.util.spec_from_file_location("moecore_errors_standalone", errors.__file__)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert set(module.__all__) == set(errors.__all__)
    with open(errors.__file__) as f:
        source = f.read()
    assert (
        "_moecore" not in source.split('"""', 2)[2]
    )  # no import of the extension after the docstring
