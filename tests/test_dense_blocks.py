"""In a dense block, a batch norm takes the sums of the block so far from the batch norm before
it, and adds the block's gradient from the later layers into the input gradient it writes."""
from __future__ import annotations

import numpy as np

from pydtnn_lite.costs import Stage
from pydtnn_lite.layers import BatchNorm, Concat, Conv2D, Dense, Flatten, GlobalAvgPool2D, StepContext
from pydtnn_lite.models import create_model
from pydtnn_lite.network import Network

from helpers import FLOAT64, network_gradient_error


def dense_block(layers: int = 3, growth: int = 2) -> Network:
    """A stem, then ``layers`` of BN-ReLU-conv whose output is concatenated to the block so far."""
    net = Network("block", (5, 5, 3), 4)
    index = net.add(Conv2D(3, 3, padding=1))
    for _ in range(layers):
        new = net.add(BatchNorm(activation="relu"), index)
        new = net.add(Conv2D(growth, 3, padding=1), new)
        index = net.add(Concat(), index, new)
    net.add(BatchNorm(), index)
    net.add(GlobalAvgPool2D())
    net.add(Flatten())
    net.add(Dense(4))
    return net.build(FLOAT64, seed=1)


def batch_norms(net: Network) -> list[BatchNorm]:
    return [layer for layer in net.layers if isinstance(layer, BatchNorm)]


def test_each_batch_norm_of_a_block_takes_the_sums_of_the_one_before():
    norms = batch_norms(dense_block())
    assert [norm.statistics_from for norm in norms] == [None, norms[0], norms[1], norms[2]]
    densenet = batch_norms(create_model("densenet121", (32, 32, 3), 10).build(FLOAT64))
    linked = [norm for norm in densenet if norm.statistics_from is not None]
    assert len(linked) == 58  # one per concatenation: the next layer's or the transition's first batch norm


def test_linked_statistics_train_as_unlinked_ones():
    """Forward, parameter gradients and running statistics equal those of a block whose batch
    norms sum every channel themselves."""
    x = np.random.default_rng(0).normal(loc=3.0, size=(4, 5, 5, 3))
    results = []
    for linked in (True, False):
        net = dense_block()
        if not linked:
            for norm in batch_norms(net):
                norm.statistics_from = norm.statistics_to = None
        ctx = StepContext(training=True, global_batch=4)
        logits = net.forward(x, ctx)
        net.backward(np.ones_like(logits))
        results.append((logits, net.flat_grads.copy(), [n.buffers["running_var"].copy() for n in batch_norms(net)]))
    (logits, grads, variances), (expected_logits, expected_grads, expected_variances) = results
    np.testing.assert_allclose(logits, expected_logits, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(grads, expected_grads, rtol=1e-10, atol=1e-12)
    for variance, expected in zip(variances, expected_variances, strict=True):
        np.testing.assert_allclose(variance, expected, rtol=1e-12)


def test_the_block_gradients_match_finite_differences():
    x = np.random.default_rng(3).normal(size=(2, 5, 5, 3))
    assert network_gradient_error(dense_block(), x, np.array([1, 3])) <= 1e-6


def test_a_batch_norm_called_alone_sums_every_channel():
    """Without the earlier batch norm's sums of the same step (a layer run by itself), all of
    the input is read: the statistics stay right."""
    norm = batch_norms(dense_block())[2]
    x = np.random.default_rng(4).normal(loc=5.0, scale=2.0, size=(6, 5, 5, 7))
    out = norm.forward(x, ctx=StepContext(training=True, global_batch=6))
    normalized = (out - norm.params["beta"]) / norm.params["gamma"]
    np.testing.assert_allclose(np.maximum(normalized, 0), normalized, atol=1e-12)  # after the ReLU
    mean = x.reshape(-1, 7).mean(axis=0)
    np.testing.assert_allclose(norm.buffers["running_mean"], 0.1 * mean, rtol=1e-12)


def test_a_linked_batch_norm_lists_only_the_new_channels_it_reads():
    norms = batch_norms(dense_block())
    read = [next(cost for cost in norm.costs(2) if cost.kernel == "batchnorm_sums") for norm in norms]
    assert [cost.dims[-1] for cost in read] == [3, 2, 2, 2]
    assert all(cost.stage == Stage.FP for cost in read)
    assert read[1].bytes == 2 * 2 * 25 * 2 * 8  # float64: two passes over 2 channels of 2 x 5 x 5


def test_batch_norms_that_read_the_block_add_its_later_gradients_in():
    norms = batch_norms(dense_block())
    # Each block so far feeds the next concatenation too; the last one feeds the last batch norm alone.
    assert [norm.adds_input_grad for norm in norms] == [True, True, True, False]
    densenet = batch_norms(create_model("densenet121", (32, 32, 3), 10).build(FLOAT64))
    assert sum(norm.adds_input_grad for norm in densenet) == 58


def test_gradients_added_in_the_batch_norm_equal_a_separate_sum():
    x = np.random.default_rng(5).normal(size=(3, 5, 5, 3))
    grads = []
    for fused in (True, False):
        net = dense_block()
        for norm in batch_norms(net):
            norm.adds_input_grad = norm.adds_input_grad and fused
        logits = net.forward(x, StepContext(training=True, global_batch=3))
        net.backward(np.ones_like(logits))
        grads.append(net.flat_grads.copy())
    np.testing.assert_allclose(grads[0], grads[1], rtol=1e-12, atol=1e-14)


def test_a_gradient_added_in_the_batch_norm_costs_one_read_and_no_add():
    net = dense_block()
    assert [cost.kernel for _, cost in net.costs(2)].count("add") == 0
    norm = batch_norms(net)[1]
    n = norm.elements(2)
    fused = next(cost for cost in norm.costs(2) if cost.kernel == "batchnorm_relu_grad_input")
    norm.adds_input_grad = False
    alone = next(cost for cost in norm.costs(2) if cost.kernel == "batchnorm_relu_grad_input")
    assert (fused.bytes - alone.bytes, fused.flops - alone.flops) == (n * 8, n)
    for layer in net.layers:
        layer.adds_input_grad = False
    assert [cost.kernel for _, cost in net.costs(2)].count("add") == 3


def joins(net: Network) -> list[Concat]:
    return [layer for layer in net.layers if isinstance(layer, Concat)]


def unlink_joins(net: Network) -> None:
    for join in joins(net):
        join.extends = join.extended_by = None
        join.capacity = join.output_shape[-1]


def test_the_joins_of_a_block_write_into_one_buffer():
    """Each join's output is the leading channels of one map as wide as the block, and equals
    the concatenation of its inputs, the earlier outputs unchanged by the later joins."""
    net = dense_block()
    block = joins(net)
    assert [join.extends for join in block] == [None, block[0], block[1]]
    assert [join.capacity for join in block] == [9, 9, 9]
    seen: list[tuple] = []
    for join in block:
        def recording(*inputs, ctx, join=join, forward=join.forward):
            out = forward(*inputs, ctx=ctx)
            seen.append((out, np.concatenate(inputs, axis=-1)))
            return out
        join.forward = recording
    net.forward(np.random.default_rng(6).normal(size=(2, 5, 5, 3)), StepContext(training=True, global_batch=2))
    assert [out.shape[-1] for out, _ in seen] == [5, 7, 9]
    assert all(np.shares_memory(out, seen[-1][0]) for out, _ in seen)
    for out, expected in seen:
        np.testing.assert_array_equal(out, expected)


def test_linked_joins_train_as_unlinked_ones():
    x = np.random.default_rng(7).normal(size=(3, 5, 5, 3))
    results = []
    for linked in (True, False):
        net = dense_block()
        if not linked:
            unlink_joins(net)
        logits = net.forward(x, StepContext(training=True, global_batch=3))
        net.backward(np.ones_like(logits))
        results.append((logits, net.flat_grads.copy()))
    np.testing.assert_array_equal(results[0][0], results[1][0])
    np.testing.assert_array_equal(results[0][1], results[1][1])


def test_a_map_that_two_joins_read_is_joined_apart():
    """Where two joins take one output, neither writes after it: both keep their own map."""
    net = Network("fork", (4, 4, 2), 3)
    stem = net.add(Conv2D(2, 1))
    first = net.add(Concat(), stem, net.add(Conv2D(1, 1), stem))
    left = net.add(Concat(), first, net.add(Conv2D(2, 1), first))
    right = net.add(Concat(), first, net.add(Conv2D(3, 1), first))
    net.add(Concat(), left, right)
    net.add(GlobalAvgPool2D())
    net.add(Flatten())
    net.add(Dense(3))
    net.build(FLOAT64, seed=2)
    assert [join.extends for join in joins(net)] == [None, None, None, net.layers[left]]
    assert network_gradient_error(net, np.random.default_rng(8).normal(size=(2, 4, 4, 2)), np.array([0, 2])) <= 1e-6


def test_a_linked_join_lists_the_copy_of_its_new_channels_alone():
    block = joins(dense_block())
    written = [next(cost for cost in join.costs(2) if cost.kernel == "concat").dims[0] for join in block]
    assert written == [2 * 25 * 5, 2 * 25 * 2, 2 * 25 * 2]
    densenet = joins(create_model("densenet121", (32, 32, 3), 10).build(FLOAT64))
    assert sum(join.extends is not None for join in densenet) == 54  # each block's joins but its first
