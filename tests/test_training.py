"""Single-process training: convergence on real data, optimizers, schedule, partitions, buckets."""
from __future__ import annotations

import itertools

import numpy as np
import pytest

from pydtnn_lite.backend import BackendError, gpu_available, make_backend
from pydtnn_lite.comm.gradients import plan_buckets
from pydtnn_lite.data import EpochSampler, open_dataset, partition
from pydtnn_lite.layers import MaxPool2D, StepContext
from pydtnn_lite.models import create_model, model_names
from pydtnn_lite.models.blocks import relu_before_pools
from pydtnn_lite.optim import SGD, LearningRateSchedule
from pydtnn_lite.training import TrainerSettings, build_trainer

from helpers import digits_trainer


@pytest.mark.parametrize("model,lr,epochs", [("lenet", 0.02, 5), ("mlp", 0.02, 3)])
def test_converges_on_digits(model, lr, epochs):
    trainer = digits_trainer(model, lr)
    for epoch in range(epochs):
        trainer.train_epoch(epoch)
    result = trainer.evaluate(open_dataset("digits", "test"), 64)
    assert result.accuracy >= 0.90, result


def test_the_embedded_synthetic_data_set_is_learnable():
    """The README's main job trains on the synthetic data: 20 steps of an MLP already classify its held-out
    test split far above chance (10 %), so a short run shows learning."""
    data = open_dataset("synthetic")
    network = create_model("mlp", data.input_shape, data.num_classes).build(make_backend(), seed=0)
    trainer = build_trainer(network, data, TrainerSettings(32, steps_per_epoch=10),
                            optimizer=SGD(network, momentum=0.9), schedule=LearningRateSchedule(0.003))
    for epoch in range(2):
        trainer.train_epoch(epoch)
    result = trainer.evaluate(open_dataset("synthetic", "test"), 100, max_steps=3)
    assert result.accuracy >= 0.8, result


def test_schedule_warmup_and_decay():
    schedule = LearningRateSchedule(0.1, warmup_epochs=1, decay_epochs=(2, 3), decay_factor=0.5)
    assert schedule(0, 10) == pytest.approx(0.01)
    assert schedule(9, 10) == pytest.approx(0.1)
    assert schedule(15, 10) == pytest.approx(0.1)
    assert schedule(20, 10) == pytest.approx(0.05)
    assert schedule(35, 10) == pytest.approx(0.025)


def test_partition_sums_and_follows_weights():
    assert partition(64, [1, 1]) == [32, 32]
    assert partition(64, [10, 20, 34]) == [10, 20, 34]
    assert partition(7, [1, 1, 1]) == [3, 2, 2]
    # 30.3, 50.5 and 20.2 samples: the one left over goes to the largest remainder.
    assert partition(101, [0.3, 0.5, 0.2]) == [30, 51, 20]
    assert partition(10, [0.26, 0.37, 0.37]) == [2, 4, 4]
    with pytest.raises(ValueError):
        partition(8, [0, 0])


def test_sampler_covers_each_epoch_once_and_reshuffles():
    sampler = EpochSampler(10, 4, seed=3)
    assert sampler.steps_per_epoch == 3
    epoch0 = np.concatenate([sampler.batch(0, s) for s in range(3)])
    assert sorted(epoch0.tolist()) == list(range(10))
    assert len(sampler.batch(0, 2)) == 2
    assert not np.array_equal(sampler.order(0), sampler.order(1))


def test_buckets_tile_the_gradient_in_reverse_layer_order():
    net = create_model("vgg11", (32, 32, 3), 10).build(make_backend())
    buckets = plan_buckets(net, 4 << 20, 1 << 20)
    assert buckets[0].stop == net.flat_grads.size and buckets[-1].start == 0
    assert all(a.start == b.stop for a, b in itertools.pairwise(buckets))
    assert buckets[0].size * 4 <= 1 << 20
    assert all(b.size * 4 <= 4 << 20 for b in buckets)
    assert [b.first_layer for b in buckets] == sorted((b.first_layer for b in buckets), reverse=True)


def test_every_model_has_the_parameters_of_its_reference_architecture():
    """--model NAME on CIFAR-sized images is the published network: its parameter count is the reference one.

    VGG, ResNet and DenseNet: the common CIFAR implementations without batch norm in VGG
    (9,231,114 and 14,728,266 with it). By hand from the architectures: LeNet 456 + 2,416
    + 123,000 + 10,164 + 850; the MLP 1,573,376 + 131,328 + 2,570; AlexNet's convolutions
    4,864 + 307,392 + 663,936 + 884,992 + 590,080 and head 2,360,320 + 1,049,600 + 10,250.
    """
    expected = {"vgg11": 9_225_610, "vgg16": 14_719_818, "alexnet": 5_871_434, "resnet18": 11_173_962,
                "resnet50": 23_520_842, "densenet121": 6_956_426, "lenet": 136_886, "mlp": 1_707_274}
    assert sorted(expected) == sorted(model_names())
    for name in model_names():
        assert create_model(name, (32, 32, 3), 10).build(make_backend()).param_count == expected[name], name


@pytest.mark.parametrize("name,shape", [("vgg11", (32, 32, 3)), ("alexnet", (32, 32, 3)), ("lenet", (8, 8, 1))])
def test_pooling_before_the_relu_changes_nothing_bit_for_bit(name, shape):
    """The zoo runs a ReLU that precedes a max pool after it (a quarter of the values to pass
    over): logits and every gradient equal those of conv - ReLU - pool exactly, ties and
    windows of negative values included (AlexNet's windows overlap)."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((3, *shape))
    x[0, : shape[0] // 2] = -1.0  # whole windows of equal, negative inputs
    grad_logits = rng.standard_normal((3, 10))
    results = []
    for network in (create_model(name, shape, 10), relu_before_pools(create_model(name, shape, 10))):
        built = network.build(make_backend("cpu", "float64"), seed=1)
        logits = built.forward(x, StepContext(training=False, global_batch=3))
        built.backward(grad_logits.copy())
        results.append((logits, built.flat_grads.copy()))
    assert [type(layer) for layer in create_model(name, shape, 10).layers].count(MaxPool2D) >= 2
    np.testing.assert_array_equal(results[0][0], results[1][0])
    np.testing.assert_array_equal(results[0][1], results[1][1])


def test_without_a_gpu_auto_means_cpu_and_gpu_fails_clearly():
    if gpu_available():
        pytest.skip("this machine has a GPU")
    assert make_backend("auto").device == "cpu"
    with pytest.raises(BackendError, match="--device cpu"):
        make_backend("gpu")


def test_weights_round_trip_through_npz(tmp_path):
    net = create_model("lenet", (8, 8, 1), 10).build(make_backend(), seed=1)
    net.save(str(tmp_path / "w.npz"))
    other = create_model("lenet", (8, 8, 1), 10).build(make_backend(), seed=2)
    other.load(str(tmp_path / "w.npz"))
    np.testing.assert_array_equal(other.flat_params, net.flat_params)
    with pytest.raises(ValueError, match="do not fit"):
        create_model("mlp", (8, 8, 1), 10).build(make_backend()).load(str(tmp_path / "w.npz"))
