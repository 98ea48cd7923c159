"""Batches read ahead on a background thread: the same batches for any depth, errors raised where
the batch is taken, the reading drawn on the rank's data timeline."""
from __future__ import annotations

import threading

import numpy as np
import pytest

from pydtnn_lite.backend import make_backend
from pydtnn_lite.data import Augmentation, open_dataset
from pydtnn_lite.data.prefetch import Prefetcher
from pydtnn_lite.models import create_model
from pydtnn_lite.optim import SGD, LearningRateSchedule
from pydtnn_lite.tracing import Tracer
from pydtnn_lite.tracing.chrome import chrome_trace
from pydtnn_lite.tracing.records import DATA_THREAD
from pydtnn_lite.training import TrainerSettings, build_trainer


@pytest.mark.parametrize("depth", [0, 1, 3])
def test_items_come_in_step_order_from_the_thread(depth):
    threads = set()

    def produce(step: int) -> int:
        threads.add(threading.current_thread().name)
        return step * step

    with Prefetcher(produce, range(2, 9), depth) as items:
        produced = list(items)
    assert [p.item for p in produced] == [step * step for step in range(2, 9)]
    assert all(p.started <= p.finished for p in produced)
    assert threads == ({"pydtnn-prefetch"} if depth else {threading.current_thread().name})


def test_an_error_while_reading_is_raised_where_its_batch_is_taken():
    def produce(step: int) -> int:
        if step == 2:
            raise OSError("shard 2 is gone")
        return step

    with Prefetcher(produce, range(5), 2) as items:
        assert [next(items).item, next(items).item] == [0, 1]
        with pytest.raises(OSError, match="shard 2 is gone"):
            next(items)


def test_closing_early_stops_the_thread():
    produced = threading.Semaphore(0)

    def produce(step: int) -> int:
        produced.release()
        return step

    items = Prefetcher(produce, range(10**9), 2)
    assert next(items).item == 0
    for _ in range(4):  # steps 0-3: two queued, the fourth waiting for room in the full queue
        produced.acquire()
    closing = threading.Thread(target=items.close)
    closing.start()
    closing.join(timeout=30)  # a bound on a hang, not a timing: close must free the waiting thread
    assert not closing.is_alive()
    assert not any(thread.name == "pydtnn-prefetch" for thread in threading.enumerate())


def trained(prefetch: int, steps: int = 6, tracer: bool = False):
    data = open_dataset("digits")
    network = create_model("lenet", data.input_shape, data.num_classes).build(make_backend(), seed=0)
    settings = TrainerSettings(16, seed=3, steps_per_epoch=steps, augmentation=Augmentation(2, True),
                               prefetch=prefetch)
    trainer = build_trainer(network, data, settings, optimizer=SGD(network), schedule=LearningRateSchedule(0.05))
    traced = Tracer(trainer, skip_steps=1).attach() if tracer else None
    for epoch in range(2):
        trainer.train_epoch(epoch)
    if traced is not None:
        traced.detach()
    return network, traced


def test_the_same_batches_train_the_same_weights_for_any_depth():
    expected = trained(0)[0].flat_params
    for depth in (1, 2, 5):
        np.testing.assert_array_equal(trained(depth)[0].flat_params, expected)


def test_the_trace_draws_the_batches_read_ahead_on_the_data_timeline():
    _, tracer = trained(2, steps=4, tracer=True)
    reads = [k for k in tracer.kernels if k.thread == DATA_THREAD]
    # 2 epochs of 4 steps, the first step skipped as warm-up: one read per traced step.
    assert sorted((k.step, k.kernel) for k in reads) == [(step, "data_load") for step in range(1, 8)]
    assert all(k.duration > 0 and k.stage == "DATA" for k in reads)
    events = chrome_trace(tracer.kernels, tracer.steps)["traceEvents"]
    assert {"ph": "M", "pid": 0, "tid": 3, "name": "thread_name", "args": {"name": "data"}} in events
    assert sum(e.get("tid") == 3 and e["ph"] == "X" for e in events) == len(reads)
