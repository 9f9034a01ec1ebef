"""Deferred index errors on the GPU (kernels/cuda/errors.py), on Numba's CUDA simulator.

A bad index found by a kernel raises the CPU's IndexError at the next numbapos
call that can see it, and at the latest at a synchronising call; nothing the
failing op or any op queued after it would have modified changes, and the
device stays usable. ``NUMBAPOS_CUDA_SYNC_CHECKS=1`` (``cuda_sync_checks``)
raises at the op itself.
"""

import numpy as np
import pytest
from conftest import dev

import numbapos
import numbapos.functional as F
from numbapos import config, nn, optim

pytestmark = pytest.mark.skipif(not numbapos.cuda_available(), reason="needs CUDA or the simulator")

V, D = 10, 4
CPU_MESSAGE = (r"indices: index 12 \(at flat position 3\) is out of range for num_embeddings=10; "
               r"valid indices are 0 <= index < 10")
BAD = np.array([[1, 2], [5, 12], [-1, 3]])  # first bad position 3 (12), then 4 (-1)
GOOD = np.array([[1, 2], [2, 7]])


@pytest.fixture(autouse=True)
def _no_error_left():
    numbapos.synchronize()
    yield
    numbapos.synchronize()


def test_the_message_is_the_cpus():
    with pytest.raises(IndexError, match=CPU_MESSAGE):
        F.embedding(BAD, np.ones((V, D), np.float32))
    F.embedding(dev(BAD), dev(np.ones((V, D), np.float32)))  # queued: no error yet
    with pytest.raises(IndexError, match=CPU_MESSAGE + r" \(found on the GPU by a call queued "
                                         "earlier"):
        numbapos.synchronize()


@pytest.mark.parametrize("how", ["synchronize", "to_host", "next_op", "state_dict",
                                 "parameter_on_host"])
def test_raised_at_the_next_call_that_sees_it_then_usable(rng, how):
    table = rng.normal(size=(V, D)).astype(np.float32)
    emb = nn.Embedding.from_pretrained(table, freeze=False).to("cuda")
    emb(dev(BAD))
    with pytest.raises(IndexError, match=CPU_MESSAGE):
        if how == "synchronize":
            numbapos.synchronize()
        elif how == "to_host":
            numbapos.to_host(emb.weight.data)
        elif how == "next_op":  # the simulator has finished the kernel: the host sees it
            F.embedding(dev(GOOD), emb.weight.data)
        elif how == "state_dict":
            emb.state_dict()
        else:
            emb.cpu()  # moves every parameter through a host copy
    numbapos.synchronize()  # cleared
    np.testing.assert_array_equal(numbapos.to_host(emb.weight.data), table)  # unchanged
    np.testing.assert_array_equal(numbapos.to_host(emb(dev(GOOD) if emb.weight.device == "cuda"
                                                       else GOOD)), table[GOOD])


def test_a_training_step_after_a_bad_lookup_changes_nothing(rng):
    table = rng.normal(size=(V, D)).astype(np.float32)
    emb = nn.Embedding.from_pretrained(table, freeze=False, sparse=True).to("cuda")
    opt = optim.SGD(emb.parameters(), lr=0.5, momentum=0.9)
    emb(dev(GOOD))  # a good step first: momentum started for some rows
    emb.backward(dev(np.ones(GOOD.shape + (D,), np.float32)))
    opt.step()
    opt.zero_grad()
    before = {name: numbapos.to_host(v).copy() for name, v in emb.state_dict().items()}
    state_before = {k: numbapos.to_host(v).copy() for k, v in opt.state[id(emb.weight)].items()
                    if hasattr(v, "shape")}
    with config.override(cuda_sync_checks=False):
        emb(dev(BAD))
        # The host cannot know yet on a GPU; on the simulator it can, so each call below
        # would raise at its start: run the kernels directly as queued work would.
        from numbapos._device import _NAMESPACES
        from numbapos._gpuhost import errors

        found = errors.pending()
        assert found is not None and found[:3] == (3, 12, V)
        # Queued work after the failing lookup: a backward and an optimiser step.
        K = _NAMESPACES["cuda"]
        grad = dev(np.ones(BAD.shape + (D,), np.float32))
        flat = dev(np.array([1, 2, 5, 3]))
        groups = K.group_rows(flat, None, V)
        values = K.empty((4, D), np.float32)
        K.sum_row_groups(grad.reshape(BAD.size, D)[:4], groups, False, values)
        hyper = F.optim._sgd_hyper(np.dtype(np.float32), 0.5, 0.9, 0.0, 0.0, False, False)
        state = opt.state[id(emb.weight)]
        K.sgd_rows_(emb.weight.data, groups.rows, values, groups.used,
                    state["momentum_buffer"], state["row_started"], hyper)
        K.sgd_dense_(emb.weight.data.reshape(V * D), dev(np.ones(V * D, np.float32)),
                     state["momentum_buffer"].reshape(V * D), False, hyper)
    with pytest.raises(IndexError, match=CPU_MESSAGE):
        numbapos.synchronize()
    after = {name: numbapos.to_host(v) for name, v in emb.state_dict().items()}
    for name in before:
        np.testing.assert_array_equal(after[name], before[name])
    for k, v in state_before.items():
        np.testing.assert_array_equal(numbapos.to_host(opt.state[id(emb.weight)][k]), v)
    emb(dev(GOOD))  # usable again
    emb.backward(dev(np.ones(GOOD.shape + (D,), np.float32)))
    opt.step()
    assert not np.array_equal(numbapos.to_host(emb.weight.data), before["weight"])


def test_max_norm_with_a_bad_index_clips_nothing(rng):
    table = (rng.normal(size=(V, D)) * 10).astype(np.float32)
    weight = dev(table)
    F.embedding(dev(BAD), weight, max_norm=1.0)
    with pytest.raises(IndexError, match=CPU_MESSAGE):
        numbapos.synchronize()
    np.testing.assert_array_equal(weight.copy_to_host(), table)


def test_backward_with_a_bad_index_writes_no_gradient(rng):
    grad = dev(rng.normal(size=BAD.shape + (D,)).astype(np.float32))
    dense = F.embedding_backward(grad, dev(BAD), V)
    with pytest.raises(IndexError, match=CPU_MESSAGE):
        numbapos.synchronize()
    np.testing.assert_array_equal(numbapos.to_host(dense), 0)
    sparse = F.embedding_backward(grad, dev(BAD), V, sparse=True)
    with pytest.raises(IndexError, match=CPU_MESSAGE):
        numbapos.synchronize()
    # Its rows were grouped without the bad ids, and nothing was summed into them.
    np.testing.assert_array_equal(numbapos.to_host(sparse.indices), [1, 2, 3, 5])


def test_sync_checks_raise_at_the_op_itself():
    weight = dev(np.ones((V, D), np.float32))
    with config.override(cuda_sync_checks=True):
        with pytest.raises(IndexError, match=CPU_MESSAGE):
            F.embedding(dev(BAD), weight)
        with pytest.raises(IndexError, match=CPU_MESSAGE):
            F.embedding_backward(dev(np.ones(BAD.shape + (D,), np.float32)), dev(BAD), V)
    F.embedding(dev(GOOD), weight)


def test_the_first_failing_kernel_wins():
    weight = dev(np.ones((V, D), np.float32))
    F.embedding(dev(np.array([0, 11])), weight)  # first: index 11 at position 1
    from numbapos._device import _NAMESPACES

    _NAMESPACES["cuda"].check_indices(dev(np.array([20, 0, 0])), V, "other", "size")
    with pytest.raises(IndexError, match=r"indices: index 11 \(at flat position 1\)"):
        numbapos.synchronize()
