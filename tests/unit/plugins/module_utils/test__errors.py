# SPDX-License-Identifier: GPL-3.0-or-later
"""_errors.StepError, the one error of the core logic: an ordinary Exception (it never slips past `except Exception`
the way the old BaseException did), and the GPU backend block passes a step's own error through unchanged instead of
calling it an unexpected backend error."""
from __future__ import annotations

import pytest

from ansible_collections.gpufleet.serving.plugins.module_utils import _gpumod, _nvml
from ansible_collections.gpufleet.serving.plugins.module_utils._errors import StepError


def test_step_error_is_an_exception_carrying_its_partial_result():
    try:
        raise StepError("GPUs not clean", holders=[4242], phase="clean")
    except Exception as e:  # pylint: disable=broad-except
        assert str(e) == "GPUs not clean" and e.details == {"holders": [4242], "phase": "clean"}


def test_a_step_error_inside_the_backend_block_keeps_its_message_and_details(nvml):
    with pytest.raises(StepError) as ei:
        with _gpumod.backend_or_fail("nvml") as backend:
            assert backend.count() == 2
            raise StepError("GPUs not clean after 1.0 s", clean={"holders": [1]})
    assert str(ei.value) == "GPUs not clean after 1.0 s" and ei.value.details == {"clean": {"holders": [1]}}


def test_a_gpu_error_in_the_block_is_a_step_error_naming_the_backend(nvml):
    with pytest.raises(StepError) as ei:
        with _gpumod.backend_or_fail("nvml"):
            raise _nvml.GpuError("GPU 7 does not exist")
    assert str(ei.value) == "GPU 7 does not exist" and ei.value.details == {"backend": "nvml"}


def test_any_other_error_in_the_block_is_unexpected_with_its_traceback(nvml):
    with pytest.raises(StepError) as ei:
        with _gpumod.backend_or_fail("nvml"):
            raise KeyError("boom")
    assert str(ei.value).startswith("Unexpected GPU backend error") and "Traceback" in ei.value.details["exception"]
