"""Cost of tracing: training steps with the tracer attached against the same steps without it.

    python benchmarks/tracing_overhead.py [--model vgg11] [--batch-size 64] [--threads 2] [--rounds 6] [--steps 3]

Traced and untraced steps alternate in rounds (the order flips every round) on the same
trainer and batch, so machine noise hits both alike. A traced step is timed from the
caller, so the tracer's end-of-step work (pairing calls with their costs) is included.
Prints the median step time of each and the overhead of tracing.
"""
from __future__ import annotations

import argparse
import statistics
import time

from pydtnn_lite.backend import make_backend
from pydtnn_lite.comm import SerialCommunicator, make_gradient_synchronizer
from pydtnn_lite.data import open_dataset
from pydtnn_lite.models import create_model
from pydtnn_lite.optim import SGD, LearningRateSchedule
from pydtnn_lite.runtime import set_blas_threads
from pydtnn_lite.tracing import Tracer
from pydtnn_lite.training import Trainer


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="vgg11")
    parser.add_argument("--dataset", default="synthetic")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--steps", type=int, default=3, help="steps per mode and round")
    args = parser.parse_args()

    set_blas_threads(args.threads)
    data = open_dataset(args.dataset)
    network = create_model(args.model, data.input_shape, data.num_classes).build(make_backend(), seed=0)
    comm = SerialCommunicator()
    trainer = Trainer(network, SGD(network), LearningRateSchedule(0.001), comm,
                      make_gradient_synchronizer(network, comm, 4.0, overlap=True), data, args.batch_size)
    images, labels, batch, _ = trainer.load_step(0, 0)
    for _ in range(2):
        trainer.train_step(images, labels, batch, 0)
    times: dict[bool, list[float]] = {False: [], True: []}
    events = 0
    for round_index in range(args.rounds):
        for traced in ((False, True) if round_index % 2 == 0 else (True, False)):
            tracer = Tracer(trainer).attach() if traced else None
            for _ in range(args.steps):
                started = time.perf_counter()
                trainer.train_step(images, labels, batch, 0)
                times[traced].append(time.perf_counter() - started)
            if tracer is not None:
                tracer.detach()
                events = len(tracer.kernels) // args.steps
    plain, traced = statistics.median(times[False]), statistics.median(times[True])
    print(f"{args.model} batch {args.batch_size}, {args.threads} BLAS threads, {args.rounds * args.steps} steps each:")
    print(f"  untraced step {plain * 1e3:.1f} ms, traced step {traced * 1e3:.1f} ms ({events} kernel records per step)")
    print(f"  tracing overhead {traced / plain - 1:+.2%} (median traced / median untraced - 1)")


if __name__ == "__main__":
    main()
