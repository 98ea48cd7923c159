"""Overlap as a user relies on it: buckets start while backward still runs, and are driven between layers."""
from __future__ import annotations

from typing import Any

from pydtnn_lite.comm import Request, SerialCommunicator
from pydtnn_lite.comm.gradients import make_gradient_synchronizer
from pydtnn_lite.layers import StepContext

from helpers import digits_trainer


class RecordingRequest(Request):
    def __init__(self, events: list, bucket: int) -> None:
        self.events, self.bucket = events, bucket

    def test(self) -> bool:
        self.events.append(("test", self.bucket))
        return False  # still running: the synchronizer must keep driving it

    def wait(self) -> None:
        self.events.append(("wait", self.bucket))


class RecordingCommunicator(SerialCommunicator):
    """Two ranks as far as the synchronizer can tell; the sums are the identity and every call is logged."""

    size = 2

    def __init__(self) -> None:
        self.events: list[tuple[str, Any]] = []

    def iallreduce(self, array: Any) -> Request:
        self.events.append(("start", array.size))
        return RecordingRequest(self.events, len([e for e in self.events if e[0] == "start"]) - 1)


def test_buckets_start_during_backward_and_are_tested_until_finish():
    trainer = digits_trainer("lenet", 0.01)
    comm = RecordingCommunicator()
    synchronizer = make_gradient_synchronizer(trainer.network, comm, bucket_mb=0.002, overlap=True)
    assert len(synchronizer.buckets) >= 3
    events = comm.events

    def layer_done(index: int) -> None:
        events.append(("layer", index))
        synchronizer.layer_done(index)

    batch = trainer.load_step(0, 0)
    ctx = StepContext(training=True, global_batch=batch.global_size, sample_offset=batch.offset)
    trainer.loss.forward(trainer.network.forward(batch.images, ctx), batch.labels, ctx)
    trainer.network.backward(trainer.loss.backward(), on_layer_done=layer_done)
    backward_events = list(events)
    synchronizer.finish()

    starts = [i for i, event in enumerate(backward_events) if event[0] == "start"]
    last_layer_done = max(i for i, event in enumerate(backward_events) if event[0] == "layer")
    assert starts and starts[0] < last_layer_done, "no bucket started before backward ended"
    tested_during_backward = {e[1] for e in backward_events if e[0] == "test"}
    assert 0 in tested_during_backward, "the first bucket was never driven while backward ran"
    assert sum(size for kind, size in events if kind == "start") == trainer.network.flat_grads.size
    waits = [e[1] for e in events if e[0] == "wait"]
    assert sorted(waits) == list(range(len(synchronizer.buckets)))
