"""Validation outputs: a CSV per kernel, one plot per stage, a self-contained HTML report, the text summary
and the figures for JSON."""
from __future__ import annotations

import base64
import csv
import html
import io
import math
import os
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace

from pydtnn_lite.costs import COMPUTE_STAGES
from pydtnn_lite.errors import UserError
from pydtnn_lite.perfmodel.modelling.drift import Drift
from pydtnn_lite.perfmodel.modelling.validation import Comparison, KernelComparison, Validation
from pydtnn_lite.textable import format_table

KERNELS_FILE, REPORT_FILE = "validation.csv", "report.html"


def _percent(value: float) -> str:
    return "-" if math.isnan(value) else f"{100 * value:+.1f} %"


def _magnitude(value: float) -> str:
    return "-" if math.isnan(value) else f"{100 * value:.1f} %"


HALVES_NOTE = ("half diff and half WRE: the same figures between the even and the odd traced steps, "
               "how far the measurement repeats itself; a prediction cannot be expected to come closer")


def write_kernels_csv(path: str, validation: Validation) -> None:
    with open(path, "w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow(["layer", "layer_name", "stage", "kernel", "occurrence", "measured_s", "predicted_s",
                         "relative_error", "wre"])
        for k in validation.kernels:
            writer.writerow([k.layer, k.layer_name, k.stage, k.kernel, k.occurrence, k.measured, k.predicted,
                             k.relative_error, k.wre])


# The most bar pairs a stage's plot draws: beyond, a layer's calls of a kernel are summed into
# one pair, and beyond that a kernel's calls (each call of DenseNet121's backward drew a figure
# 500 inches wide, in 20 s).
MAX_BARS = 120


@dataclass(frozen=True)
class StageBars:
    """What a stage's plot shows: a bar pair per comparison, in execution order, of each call
    of the stage; or where they are more than :data:`MAX_BARS`, of each layer's calls of a
    kernel summed (``grouping`` "layer": Winograd's 36 products of a layer in one pair); or
    where those are too, of each kernel's calls summed, the longest measured first
    (``grouping`` "kernel")."""

    bars: list[Comparison]
    grouping: str  # "call", "layer" or "kernel"


def stage_bars(validation: Validation, stage: str) -> StageBars:
    """The bars of ``stage``'s plot (:class:`StageBars`)."""
    kernels = [k for k in validation.kernels if k.stage == stage]
    if len(kernels) <= MAX_BARS:
        labels = [f"{k.layer_name or k.layer} {k.kernel}" + (f"#{k.occurrence}" if k.occurrence else "")
                  for k in kernels]
        return StageBars([Comparison(label, k.measured, k.predicted) for label, k in zip(labels, kernels, strict=True)],
                         "call")
    by_layer = _summed(kernels, lambda k: f"{k.layer_name or k.layer} {k.kernel}")
    if len(by_layer) <= MAX_BARS:
        return StageBars(by_layer, "layer")
    return StageBars(sorted(_summed(kernels, lambda k: k.kernel), key=lambda bar: -bar.measured), "kernel")


def _summed(kernels: list[KernelComparison], group: Callable[[KernelComparison], str]) -> list[Comparison]:
    """The calls' measured and predicted times summed by ``group``, in the order of each
    group's first call, named with their count where it is more than one."""
    names = [group(k) for k in kernels]
    measured: defaultdict[str, float] = defaultdict(float)
    predicted: defaultdict[str, float] = defaultdict(float)
    for name, k in zip(names, kernels, strict=True):
        measured[name] += k.measured
        predicted[name] += k.predicted
    calls = Counter(names)
    return [Comparison(name + (f" ({calls[name]} calls)" if calls[name] > 1 else ""), measured[name],
                       predicted[name]) for name in measured]


def stage_plot(validation: Validation, stage: str) -> bytes:
    """PNG: measured and predicted time of ``stage``'s kernels (:func:`stage_bars`), with the relative error."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise UserError("the plots need matplotlib: pip install 'pydtnn_lite[plot]'") from None
    plotted = stage_bars(validation, stage)
    bars, positions = plotted.bars, range(len(plotted.bars))
    figure, axis = plt.subplots(figsize=(max(6.0, 0.28 * len(bars) + 2), 4.5))
    axis.bar([p - 0.2 for p in positions], [b.measured * 1e3 for b in bars], width=0.4, label="measured")
    axis.bar([p + 0.2 for p in positions], [b.predicted * 1e3 for b in bars], width=0.4, label="predicted")
    axis.set_ylabel("ms per call" if plotted.grouping == "call" else "ms per step (calls summed)")
    axis.set_xticks(list(positions), [b.name for b in bars], rotation=90, fontsize=7)
    errors = axis.twinx()
    errors.plot(list(positions), [100 * b.relative_error for b in bars], "k.", label="relative error")
    errors.axhline(0.0, color="grey", linewidth=0.5)
    errors.set_ylabel("relative error (%)")
    total = next(s for s in validation.stages if s.name == stage)
    axis.set_title(f"{stage}: measured {total.measured * 1e3:.1f} ms, predicted {total.predicted * 1e3:.1f} ms, "
                   f"WRE {_magnitude(total.wre)}")
    axis.legend(loc="upper left")
    figure.tight_layout()
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=110)
    plt.close(figure)
    return buffer.getvalue()


def _rows(comparisons: list[Comparison]) -> str:
    return "".join(f"<tr><td>{html.escape(c.name)}</td><td>{c.measured * 1e3:.3f}</td><td>{c.predicted * 1e3:.3f}</td>"
                   f"<td>{_percent(c.relative_error)}</td><td>{_magnitude(c.wre)}</td>"
                   f"<td>{_magnitude(c.half_difference)}</td><td>{_magnitude(c.half_wre)}</td></tr>"
                   for c in comparisons)


def write_report(directory: str, validation: Validation, title: str) -> list[str]:
    """Write the CSV, the stage plots and the HTML report into ``directory``; return the paths."""
    os.makedirs(directory, exist_ok=True)
    paths = [os.path.join(directory, KERNELS_FILE)]
    write_kernels_csv(paths[0], validation)
    images = []
    for stage in COMPUTE_STAGES:
        if any(k.stage == stage for k in validation.kernels):
            png = stage_plot(validation, stage)
            paths.append(os.path.join(directory, f"stage-{stage}.png"))
            with open(paths[-1], "wb") as handle:
                handle.write(png)
            images.append(f'<h3>{stage}</h3><img alt="{stage} kernels" '
                          f'src="data:image/png;base64,{base64.b64encode(png).decode()}">')
    kernel_rows = "".join(
        f"<tr><td>{k.layer} {html.escape(k.layer_name)}</td><td>{k.stage}</td><td>{html.escape(k.kernel)}</td>"
        f"<td>{k.occurrence}</td><td>{k.measured * 1e3:.3f}</td><td>{k.predicted * 1e3:.3f}</td>"
        f"<td>{_percent(k.relative_error)}</td><td>{_percent(k.wre)}</td></tr>" for k in validation.kernels)
    head = ("<tr><th></th><th>measured ms</th><th>predicted ms</th><th>relative error</th><th>WRE</th>"
            "<th>half diff</th><th>half WRE</th></tr>")
    document = f"""<!DOCTYPE html>
<html><head><meta charset="utf-8"><title>{html.escape(title)}</title>
<style>body{{font-family:sans-serif;margin:2em}}table{{border-collapse:collapse;margin:1em 0}}
td,th{{border:1px solid #ccc;padding:2px 8px;text-align:right}}td:first-child{{text-align:left}}
img{{max-width:100%}}</style></head><body>
<h1>{html.escape(title)}</h1>
<h2>Step and stages</h2>
<table>{head}{_rows([validation.step] + validation.stages + _comm_part_rows(validation))}</table>
<p>Relative error = (predicted - measured) / measured. WRE of a stage = mean over its kernels of
|predicted - measured| / (mean measured kernel time of the stage). The step excludes data loading.
{html.escape(HALVES_NOTE)}. {validation.unmatched} traced calls had no prediction.</p>
<h2>Kernels per stage</h2>{''.join(images)}
<h2>Every kernel</h2>
<table><tr><th>layer</th><th>stage</th><th>kernel</th><th>#</th><th>measured ms</th><th>predicted ms</th>
<th>relative error</th><th>WRE</th></tr>{kernel_rows}</table>
</body></html>
"""
    paths.append(os.path.join(directory, REPORT_FILE))
    with open(paths[-1], "w", encoding="utf-8") as handle:
        handle.write(document)
    return paths


def _comm_part_rows(validation: Validation) -> list[Comparison]:
    """The COMM parts as rows under COMM (none where the model has no parts)."""
    return [replace(part, name=f"  {part.name}") for part in validation.comm_parts]


def summary_text(validation: Validation) -> str:
    """The step and stage table as text, COMM's parts under it where the model has them."""
    rows = [(c.name, f"{c.measured * 1e3:.3f}", f"{c.predicted * 1e3:.3f}", _percent(c.relative_error),
             _magnitude(c.wre), _magnitude(c.half_difference), _magnitude(c.half_wre))
            for c in [validation.step] + validation.stages + _comm_part_rows(validation)]
    table = format_table(("", "measured ms", "predicted ms", "error", "WRE", "half diff", "half WRE"), rows)
    return "\n".join([table, HALVES_NOTE])


def json_number(value: float) -> float | None:
    """``value``, or None where it is NaN (JSON has no NaN)."""
    return None if math.isnan(value) else value


def validation_figures(validation: Validation, raw: Validation | None = None,
                       drift: Drift | None = None) -> dict:
    """The step's and stages' figures of a validation, ready for JSON (None where a figure
    does not exist). Errors are signed fractions, (predicted - measured) / measured.

    ``step_error`` is the step's error of ``validation``, after correcting the prediction
    for the machine's drift since its calibration where a probe measured it; then
    ``raw_step_error`` is the error of ``raw``, the validation before the correction,
    ``drift_factor`` the ratio of the two predicted steps and ``drift`` the time ratios
    of each kind of work. Without a probe, both errors are equal and the drift None.
    ``comm_parts`` holds COMM's parts (posts, tests, wait) where the model has them, else
    nothing.
    """
    step, stages = validation.step, validation.stages
    corrected = json_number(step.relative_error)
    before = raw.step if raw is not None else step
    return {"measured_step_seconds": step.measured, "predicted_step_seconds": step.predicted,
            "raw_step_error": json_number(before.relative_error),
            "drift_factor": step.predicted / before.predicted if drift is not None and before.predicted else None,
            "drift": asdict(drift) if drift is not None else None, "step_error": corrected,
            "wre": {s.name: json_number(s.wre) for s in stages if s.name in COMPUTE_STAGES},
            "measured_stage_seconds": {s.name: s.measured for s in stages},
            "predicted_stage_seconds": {s.name: s.predicted for s in stages},
            "stage_errors": {s.name: json_number(s.relative_error) for s in stages},
            "comm_parts": {part.name: {"measured_seconds": part.measured, "predicted_seconds": part.predicted,
                                       "error": json_number(part.relative_error)} for part in validation.comm_parts},
            "split_half": {"step_difference": json_number(step.half_difference),
                           "stage_differences": {s.name: json_number(s.half_difference) for s in stages},
                           "wre": {s.name: json_number(s.half_wre) for s in stages if s.name in COMPUTE_STAGES}},
            "unmatched_calls": validation.unmatched}
