"""The run configuration: every flag parsed once, into what the job reads; the trainer factory's one rule."""
from __future__ import annotations

import pytest

from pydtnn_lite.backend import make_backend
from pydtnn_lite.comm import SerialCommunicator, make_gradient_synchronizer
from pydtnn_lite.data import open_dataset
from pydtnn_lite.errors import UserError
from pydtnn_lite.models import create_model
from pydtnn_lite.run_config import RunConfig
from pydtnn_lite.train import build_parser
from pydtnn_lite.training import TrainerSettings, build_trainer


def config_of(*flags: str, ranks: int = 2, rank: int = 1) -> RunConfig:
    return RunConfig.from_arguments(build_parser().parse_args(list(flags)), ranks, rank)


def test_flags_become_one_rank_s_configuration():
    config = config_of("--local-batch-size", "16", "--device", "cpu,gpu", "--partition", "1,3",
                       "--inject-failure", "1:3", "--inject-delay", "0:2.5", "--lr", "0.1", "--warmup-epochs", "2",
                       "--lr-decay-epochs", "5", "8", "--no-overlap", "--no-progress", "--resume",
                       "--checkpoint-dir", "ckpt")
    assert config.global_batch == 32 and config.device == "gpu"
    assert config.share_weights == (1.0, 3.0)
    assert config.faults.failure == (1, 3) and config.faults.stall is None
    assert config.faults.delay == (0, pytest.approx(0.0025))
    assert (config.schedule.base_lr, config.schedule.warmup_epochs, config.schedule.decay_epochs) == (0.1, 2.0, (5, 8))
    assert not config.overlap and not config.progress
    assert config.resume == "ckpt"  # --resume without a path: the checkpoint directory's


def test_balance_auto_follows_the_job_s_devices_unless_shares_are_fixed():
    assert config_of().balances(mixed_devices=True) and not config_of().balances(mixed_devices=False)
    assert not config_of("--partition", "1,1").balances(mixed_devices=True)
    assert config_of("--balance").balances(mixed_devices=False)


@pytest.mark.parametrize("flags, message", [
    (("--batch-size", "1"), "smaller than the 2 ranks"),
    (("--partition", "1,2,3"), "--partition needs 2"),
    (("--inject-stall", "2:3"), "--inject-stall names rank 2, but the job has ranks 0 to 1"),
    (("--device", "tpu"), "--device takes cpu, gpu or auto"),
    (("--validate", "c.json"), "add --trace DIR"),
])
def test_a_bad_flag_is_named(flags, message):
    with pytest.raises(UserError, match=message):
        config_of(*flags)


def test_a_trainer_takes_a_communicator_or_a_synchronizer_not_both():
    data = open_dataset("digits")
    network = create_model("lenet", data.input_shape, data.num_classes).build(make_backend(), seed=0)
    comm = SerialCommunicator()
    synchronizer = make_gradient_synchronizer(network, comm, 4.0, overlap=True)
    trainer = build_trainer(network, data, TrainerSettings(8), synchronizer=synchronizer)
    assert trainer.comm is comm and trainer.synchronizer is synchronizer
    with pytest.raises(ValueError, match="not both"):
        build_trainer(network, data, TrainerSettings(8), comm=comm, synchronizer=synchronizer)
