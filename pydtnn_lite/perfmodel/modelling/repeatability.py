"""Several runs of one configuration: the model's figures beside how far the runs repeat each other.

On a shared machine two runs of the same command differ by 5-30 % in a step, and more in
a kernel, so a model's error means little without that spread beside it. Here each run
is validated as usual, and its measurement also stands in for the prediction of every
other run (each ordered pair): the figures that gives are the lowest error a prediction
made in advance can expect on that machine that hour. Beside them, the split-half
figures within each run (its even against its odd traced steps). Where the model has
COMM's parts (over a network: the posts, the tests, the wait), each part's error is set
beside how far the runs' parts differ too.
"""
from __future__ import annotations

import itertools
import math
import statistics
from collections.abc import Callable, Sequence

from pydtnn_lite.costs import COMPUTE_STAGES, Stage
from pydtnn_lite.errors import UserError
from pydtnn_lite.perfmodel.modelling.report import json_number
from pydtnn_lite.perfmodel.modelling.validation import COMM_PARTS, Comparison, Validation, weighted_relative_error
from pydtnn_lite.textable import format_table

FIGURES = ("step error", "WRE FP", "WRE BP", "WRE WU", "COMM error")
PART_FIGURES = tuple(f"{part} error" for part in COMM_PARTS)
NAN = float("nan")
BETWEEN_NOTE = ("the between-run figures set each run's measurement in place of the prediction of another: how far "
                "the machine repeats a run, the lowest error a prediction made in advance can expect here")
# What makes two traced runs the same configuration, from their meta.json.
CONFIGURATION_KEYS = ("model", "dataset", "global_batch", "accumulate", "clip_grad_norm", "ranks", "dtype",
                      "optimizer", "overlap", "bucket_mb", "device", "strategy")
OLDER_TRACES = {"accumulate": 1}  # what traces written before a key existed ran (a missing key reads None)


def figures(validation: Validation) -> dict[str, float]:
    """The step error, the stage WREs (FP, BP, WU) and the COMM error of a validation, as fractions."""
    return _stage_figures(validation, lambda total: total.relative_error, lambda stage: stage.wre)


def _stage_figures(validation: Validation, total_figure: Callable[[Comparison], float],
                   kernels_figure: Callable[[Comparison], float]) -> dict[str, float]:
    """The :data:`FIGURES` of a validation: ``total_figure`` of its step and COMM,
    ``kernels_figure`` of each compute stage."""
    stages = {s.name: s for s in validation.stages}
    return {"step error": total_figure(validation.step),
            **{f"WRE {stage}": kernels_figure(stages[stage]) for stage in COMPUTE_STAGES},
            "COMM error": total_figure(stages[Stage.COMM])}


def between(measured: Validation, reference: Validation) -> dict[str, float]:
    """The :func:`figures` of ``measured`` with ``reference``'s measurement in place of the prediction."""
    stand_in = {k.key: k.measured for k in reference.kernels}
    out = {"step error": (reference.step.measured - measured.step.measured) / measured.step.measured}
    for stage in COMPUTE_STAGES:
        kernels = [k for k in measured.kernels if k.stage == stage and k.key in stand_in]
        out[f"WRE {stage}"] = weighted_relative_error([stand_in[k.key] for k in kernels], [k.measured for k in kernels])
    comm = {s.name: s.measured for s in measured.stages}[Stage.COMM]
    reference_comm = {s.name: s.measured for s in reference.stages}[Stage.COMM]
    out["COMM error"] = _stand_in_error(comm, reference_comm)
    return out


def _stand_in_error(measured: float, stand_in: float) -> float:
    """The error of ``stand_in``, another run's figure, as a prediction of ``measured``; NaN
    where nothing was measured."""
    return (stand_in - measured) / measured if measured > 0 else NAN


def split_half(validation: Validation) -> dict[str, float]:
    """The :func:`figures` of a run's even traced steps against its odd ones."""
    return _stage_figures(validation, lambda total: total.half_difference, lambda stage: stage.half_wre)


def part_figures(validation: Validation) -> dict[str, float]:
    """The error of each of COMM's parts of a validation, as fractions (:data:`PART_FIGURES`)."""
    return {f"{part.name} error": part.relative_error for part in validation.comm_parts}


def part_between(measured: Validation, reference: Validation) -> dict[str, float]:
    """:func:`part_figures` of ``measured`` with ``reference``'s measured parts in place of the prediction."""
    stand_in = {part.name: part.measured for part in reference.comm_parts}
    return {f"{part.name} error": _stand_in_error(part.measured, stand_in[part.name]) for part in measured.comm_parts}


def median_magnitudes(rows: Sequence[dict[str, float]], names: Sequence[str] = FIGURES) -> dict[str, float]:
    """Each of ``names``' median magnitude over ``rows``, leaving out where it does not exist (NaN)."""
    def median(values: list[float]) -> float:
        return statistics.median(values) if values else NAN
    return {name: median([abs(row[name]) for row in rows if not math.isnan(row[name])]) for name in names}


def model_and_floor(validations: Sequence[Validation]) -> tuple[dict[str, float], dict[str, float]]:
    """The figures over two or more runs of one configuration, each the median of magnitudes:
    the model's, and between runs (every ordered pair, one run's measurement standing in for
    the prediction of the other)."""
    model = median_magnitudes([figures(v) for v in validations])
    floor = median_magnitudes([between(a, b) for a, b in itertools.permutations(validations, 2)])
    return model, floor


def parts_model_and_floor(validations: Sequence[Validation]) -> tuple[dict[str, float], dict[str, float]] | None:
    """:func:`model_and_floor` of COMM's parts (:data:`PART_FIGURES`); None unless every run has them."""
    if not all(v.comm_parts for v in validations):
        return None
    model = median_magnitudes([part_figures(v) for v in validations], PART_FIGURES)
    floor = median_magnitudes([part_between(a, b) for a, b in itertools.permutations(validations, 2)], PART_FIGURES)
    return model, floor


def _row(label: str, values: dict[str, float], names: Sequence[str], signed: bool = True) -> tuple[str, ...]:
    """A label and its percentages; errors carry their sign where ``signed``, a WRE never does."""
    return (label, *(f"{100 * values[name]:+.1f}" if signed and "error" in name else f"{100 * values[name]:.1f}"
                     for name in names))


def _ratio(model: dict[str, float], floor: dict[str, float]) -> tuple[str, ...]:
    return ("model / between runs", *(f"{model[name] / floor[name]:.2f}" if floor[name] > 0 else "nan"
                                      for name in model))


def _model_rows(per_run: Sequence[dict[str, float]], model: dict[str, float], floor: dict[str, float],
                names: Sequence[str]) -> list[tuple[str, ...]]:
    """Each run's figures of ``names``, then their median and the between-run median."""
    return [*(_row(f"model, run {i + 1}", figures, names) for i, figures in enumerate(per_run)),
            _row("model, median", model, names, signed=False),
            _row("between runs, median", floor, names, signed=False)]


def comparison_table(validations: Sequence[Validation]) -> str:
    """The model's figures run by run and their medians, beside the between-run and split-half
    medians and the ratio of the model's to the between-run ones (two or more runs); the same
    for COMM's parts where every run has them."""
    model, floor = model_and_floor(validations)
    rows = [*_model_rows([figures(v) for v in validations], model, floor, FIGURES),
            _row("split-half, median", median_magnitudes([split_half(v) for v in validations]), FIGURES, signed=False),
            _ratio(model, floor)]
    tables = [format_table(("(%; medians of magnitudes)", *FIGURES), rows)]
    parts = parts_model_and_floor(validations)
    if parts is not None:
        part_rows = [*_model_rows([part_figures(v) for v in validations], *parts, PART_FIGURES), _ratio(*parts)]
        tables.append(format_table(("(%) COMM's parts", *PART_FIGURES), part_rows))
    return "\n".join([*tables, BETWEEN_NOTE])


def comparison_summary(validations: Sequence[Validation]) -> dict:
    """:func:`comparison_table` as one JSON object: fractions (None where a figure does not
    exist, as a WRE of a stage without kernels), keys with underscores; ``comm_parts`` empty
    unless every run has them."""
    model, floor = model_and_floor(validations)

    def keyed(values: dict[str, float]) -> dict[str, float | None]:
        return {name.lower().replace(" ", "_"): json_number(value) for name, value in values.items()}
    parts = parts_model_and_floor(validations)
    return {"runs": len(validations), "model_median": keyed(model), "between_runs_median": keyed(floor),
            "split_half_median": keyed(median_magnitudes([split_half(v) for v in validations])),
            "comm_parts": {} if parts is None else {"model_median": keyed(parts[0]),
                                                    "between_runs_median": keyed(parts[1])}}


def check_same_configuration(traces: Sequence[str], metas: Sequence[dict]) -> None:
    """Refuse runs that differ in what they trained (:data:`CONFIGURATION_KEYS`): between
    them, the spread would be the configurations' difference, not the machine's."""
    first = metas[0]
    for trace, meta in zip(traces[1:], metas[1:], strict=True):
        for key in CONFIGURATION_KEYS:
            this, that = (m.get(key, OLDER_TRACES.get(key)) for m in (meta, first))
            if this != that:
                raise UserError(f"{trace} trained {key} {this!r} where {traces[0]} trained "
                                f"{that!r}: validate runs of one configuration together, or each alone")
