"""The kernels' own threads (kernels/csrc/parallel.h, pool.cpp): work claimed in chunks, so a
result never depends on how many threads ran it or which took a chunk; a second caller while a
region runs, a fork, and an engine built with the kernels (PyTorch's ops on one thread, the
kernels on the rest) all work."""

import os
import threading

import pytest
import torch

from tierserve import kernels
from tierserve.model import quant

if kernels.mode() == "off":
    pytest.skip("TIERSERVE_KERNELS=off", allow_module_level=True)
EXT = kernels.get()


@pytest.fixture
def restore_threads():
    before = EXT.kernel_threads()
    yield
    EXT.set_kernel_threads(before)


def quantized(fmt: str, n: int, k: int, int8: bool, bf16: bool = False):
    p = quant.pack(quant.quantize(torch.randn(n, k) * 0.1, fmt))
    return EXT.QWeight(quant.KERNEL_FORMAT[fmt], p.q, p.d, p.m, bf16, int8)


def run_all(weights, xs) -> list[torch.Tensor]:
    outs = []
    for w in weights:
        for x in xs:
            out = torch.empty(x.shape[0], w.N)
            EXT.weight_linear_into(x, w, None, out, False)
            outs.append(out)
    return outs


def test_results_are_bit_identical_for_any_thread_count(restore_threads):
    torch.manual_seed(0)
    weights = [quantized("q4_1", 960, 576, int8=True), quantized("q8_0", 576, 1536, int8=True),
               quantized("q4_1", 192, 64, int8=False), quantized("q4_1", 3072, 576, False, True),
               EXT.QWeight(0, torch.randn(576, 640))]  # fmt: skip
    xs_by_k = {w.K: [torch.randn(m, w.K) for m in (1, 4, 49, 160)] for w in weights}
    reference = None
    for threads in (1, 2, 3, 5):
        EXT.set_kernel_threads(threads)
        assert EXT.kernel_threads() == threads
        got = [o for w in weights for o in run_all([w], xs_by_k[w.K])]
        if reference is None:
            reference = got
        else:
            assert all(torch.equal(a, b) for a, b in zip(got, reference, strict=True)), threads


def test_two_callers_at_once_both_get_exact_results(restore_threads):
    # One region at a time runs on the pool; a caller that finds it busy runs its own alone.
    EXT.set_kernel_threads(2)
    torch.manual_seed(1)
    w = quantized("q4_1", 3072, 576, int8=True)
    xs = [torch.randn(m, 576) for m in (1, 7, 64)]
    expected = run_all([w], xs)
    failures = []

    def hammer():
        for _ in range(30):
            if not all(torch.equal(a, b) for a, b in zip(run_all([w], xs), expected, strict=True)):
                failures.append(1)

    threads = [threading.Thread(target=hammer) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not failures


@pytest.mark.skipif(not hasattr(os, "fork"), reason="no fork here")
def test_a_forked_child_runs_kernels_without_the_parents_workers(restore_threads):
    EXT.set_kernel_threads(2)
    w = quantized("q4_1", 960, 576, int8=True)
    x = torch.randn(32, 576)
    expected = run_all([w], [x])[0]  # the parent's workers are started
    pid = os.fork()
    if pid == 0:  # the child: its pool starts afresh, the result must be the same
        try:
            ok = torch.equal(run_all([w], [x])[0], expected)
        finally:
            os._exit(0 if ok else 3)
    _, status = os.waitpid(pid, 0)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0


def test_an_engine_with_the_fused_layer_gives_the_kernels_the_threads(restore_threads):
    from tierserve.engine.builder import split_threads

    class Model:
        kernels = EXT

        def __init__(self, paths):
            self._paths = paths

        def paths(self, block_size):
            return self._paths

    before = torch.get_num_threads()
    try:
        # PyTorch's ops run on the engine thread alone, the kernels on three
        assert split_threads(Model(("fused", "kernel", "torch")), 3, 16) == 1
        assert EXT.kernel_threads() == 3 and torch.get_num_threads() == 1
        # a model that needs PyTorch's attention (a window, soft-capping) keeps PyTorch's threads
        torch.set_num_threads(2)
        assert split_threads(Model(("mixed", "torch")), 2, 16) == 2
        assert torch.get_num_threads() == 2
        Model.kernels = None
        assert split_threads(Model(("torch",)), None, 16) is None
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)
