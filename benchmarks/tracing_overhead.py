"""Cost of tracing: training steps with the tracer attached against the same steps without it.

    python benchmarks/tracing_overhead.py [--model vgg11] [--batch-size 64] [--threads 2] [--rounds 10]

Traced and untraced steps alternate (the order rotates every round) on the same trainer
and batch, so a slow spell of the machine hits both alike. A traced step is timed from
the caller, so the tracer's end-of-step work (pairing calls with their costs) counts.
Prints the median step of each, the overhead of tracing, and how much of a traced
step's wall time its kernel records cover.
"""
from __future__ import annotations

import statistics

from pydtnn_lite.comm import SerialCommunicator
from pydtnn_lite.runtime import set_blas_threads
from pydtnn_lite.tracing import Tracer
from pydtnn_lite.tracing.records import TRAIN

from common import interleave, make_trainer, model_parser, timed


def main() -> None:
    parser = model_parser(__doc__)
    parser.add_argument("--rounds", type=int, default=10)
    args = parser.parse_args()

    set_blas_threads(args.threads)
    trainer = make_trainer(args.model, args.dataset, args.batch_size, SerialCommunicator())
    batch = trainer.load_step(0, 0)
    tracer = Tracer(trainer)

    def step() -> float:
        return timed(lambda: trainer.train_step(batch))

    def untraced() -> dict[str, float]:
        return {"untraced": step()}

    def traced() -> dict[str, float]:
        tracer.attach()
        try:
            return {"traced": step()}
        finally:
            tracer.detach()

    samples = interleave([untraced, traced], args.rounds, warmup=2)
    plain, with_tracer = statistics.median(samples["untraced"]), statistics.median(samples["traced"])
    records = len(tracer.kernels) // max(len(tracer.steps), 1)
    print(f"{args.model} batch {args.batch_size}, {args.threads} BLAS threads, {args.rounds} steps each "
          f"(medians): untraced {plain * 1e3:.1f} ms, traced {with_tracer * 1e3:.1f} ms "
          f"({records} kernel records per step)")
    print(f"tracing overhead {with_tracer / plain - 1:+.2%}")
    print(f"records cover {statistics.median(coverage(tracer)):.1%} of a traced step's wall time (median); "
          "the rest is Python between kernels")


def coverage(tracer: Tracer) -> list[float]:
    """Per traced step, the fraction of its wall time that its kernel records account for."""
    return [sum(k.duration for k in tracer.kernels if k.step == step.step and k.phase == TRAIN) / step.duration
            for step in tracer.steps]


if __name__ == "__main__":
    main()
