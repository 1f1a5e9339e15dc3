"""Why-no-GPU on a real GPU box (skipped elsewhere; the image's self-test runs it).

NOT run on the development and CI machines (no GPU there): the rules themselves are
covered by tests/unit/machine/test_gpu_problems.py with fake probes and a stub libcuda.so.1.
"""
import pytest

pytestmark = pytest.mark.gpu


def test_a_visible_usable_gpu_gives_an_empty_list_or_only_no_tensor_cores():
    import tensorflow as tf

    from app.machine.gpu_problems import problems_here
    from app.machine.hardware import detect

    hw = detect()
    problems = problems_here(tf=tf, tf_gpus=hw.gpus)
    if all(g.tensor_cores for g in hw.gpus):
        assert problems == []
    else:
        # A pre-Volta GPU (or a GTX 16xx): the one problem is the missing Tensor Cores.
        assert [p["id"] for p in problems] == ["no_tensor_cores"]
        assert "picks float32" in problems[0]["line"]


def test_the_driver_read_without_tensorflow_agrees_with_tensorflow():
    from app.machine.gpu_problems import read_driver
    from app.machine.hardware import detect

    reading = read_driver()
    assert reading.load_error is None and reading.cuinit_status == 0
    assert reading.cuda_version >= 11000
    tf_gpus = detect().gpus
    assert [g.compute_capability for g in reading.gpus] == [g.compute_capability
                                                           for g in tf_gpus]
    assert [g.tensor_cores for g in reading.gpus] == [g.tensor_cores for g in tf_gpus]
