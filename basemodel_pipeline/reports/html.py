"""One self-contained HTML report per scenario (PNG charts embedded as base64), written beside the checkpoint.

Contents: the test metric table of the model next to the baselines, ROC and precision-recall curves,
cumulative gain and lift, calibration, and the training curves (train loss, validation metric per epoch).
Multilabel and multiclass curves are micro-averaged over (example, class) pairs; regression shows predicted
vs actual, decile calibration and the gain of ranking by prediction; recommendation shows HitRate@K and
NDCG@K for K = 1..100.
"""

from __future__ import annotations

import base64
import html
import io
import json
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from sklearn import metrics as skm  # noqa: E402

from basemodel_pipeline.config import Scenario  # noqa: E402
from basemodel_pipeline.evaluation.metrics import higher_is_better, ranking_hits  # noqa: E402
from basemodel_pipeline.tasks import Task, task_named  # noqa: E402

MAX_POINTS = 200_000  # (example, class) pairs drawn for the micro-averaged curves
CURVE_POINTS = 600  # vertices of one drawn curve (the metrics in the legends use every row)
# one colour and line style per curve, so that no two curves of a chart share a legend entry's look
STYLES = {
    "model": ("#1f77b4", "-"),
    "neural": ("#9467bd", "--"),
    "lightgbm_aggregates": ("#ff7f0e", "-"),
    "lightgbm_hybrid": ("#8c564b", "-."),
    "lightgbm_hybrid_seeds": ("#8c564b", ":"),
    "blend": ("#e377c2", "-."),
    "reranker": ("#bcbd22", "-"),
    "popularity": ("#2ca02c", ":"),
    "recent_popularity": ("#17becf", ":"),
    "repeat_purchases": ("#d62728", "--"),
    "cooccurrence": ("#aec7e8", "-."),
}
OTHER_STYLES = [("#7f7f7f", "-"), ("#7f7f7f", "--"), ("#7f7f7f", ":"), ("#000000", "-.")]


def style(name: str, names: list[str] | None = None) -> dict[str, str]:
    """The colour and line style of one curve (`names`: every curve of the chart, for the unknown ones)."""
    if name in STYLES:
        color, ls = STYLES[name]
    else:
        others = [n for n in (names or [name]) if n not in STYLES]
        color, ls = (
            OTHER_STYLES[others.index(name) % len(OTHER_STYLES)] if name in others else OTHER_STYLES[0]
        )
    return {"color": color, "ls": ls}


def _png(fig) -> str:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90, bbox_inches="tight")
    plt.close(fig)
    return f'<img alt="chart" src="data:image/png;base64,{base64.b64encode(buf.getvalue()).decode()}">'


def _thin(x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """A curve of at most CURVE_POINTS vertices, evenly spaced along its points, both ends kept: the same
    picture, drawn in a fraction of the time."""
    if len(x) <= CURVE_POINTS:
        return x, y
    idx = np.unique(np.linspace(0, len(x) - 1, CURVE_POINTS).round().astype(int))
    return np.asarray(x)[idx], np.asarray(y)[idx]


def _pairs(
    task: type[Task], truth: np.ndarray, outputs: dict[str, np.ndarray]
) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """Flattened (label, score) pairs for binary-style curves, subsampled deterministically."""
    truth = task.indicators(truth, np.shape(next(iter(outputs.values())))[-1])
    y = np.asarray(truth).ravel() > 0
    flat = {k: np.asarray(v, np.float64).ravel() for k, v in outputs.items()}
    if len(y) > MAX_POINTS:
        idx = np.random.default_rng(0).choice(len(y), MAX_POINTS, replace=False)
        y, flat = y[idx], {k: v[idx] for k, v in flat.items()}
    return y, flat


def _binary_charts(y: np.ndarray, scores: dict[str, np.ndarray], probabilistic: set[str]) -> list[str]:
    charts = []
    if y.all() or not y.any():
        return ["<p>ROC, precision-recall and gain need both classes in the test window.</p>"]
    fig, (roc, pr) = plt.subplots(1, 2, figsize=(10, 4))
    for name, s in scores.items():
        fpr, tpr, _ = skm.roc_curve(y, s)
        auc = skm.auc(fpr, tpr)
        roc.plot(*_thin(fpr, tpr), label=f"{name} (AUROC {auc:.3f})", **style(name, list(scores)))
        prec, rec, _ = skm.precision_recall_curve(y, s)
        pr.plot(
            *_thin(rec, prec),
            label=f"{name} (AP {skm.average_precision_score(y, s):.3f})",
            **style(name, list(scores)),
        )
    roc.plot([0, 1], [0, 1], "k:", lw=0.8)
    roc.set(xlabel="false positive rate", ylabel="true positive rate", title="ROC")
    pr.axhline(y.mean(), color="k", ls=":", lw=0.8)
    pr.set(xlabel="recall", ylabel="precision", title="Precision-recall")
    roc.legend(fontsize=8)
    pr.legend(fontsize=8)
    charts.append(_png(fig))
    fig, (gain, lift) = plt.subplots(1, 2, figsize=(10, 4))
    share = np.arange(1, len(y) + 1) / len(y)
    for name, s in scores.items():
        captured = np.cumsum(y[np.argsort(-s, kind="stable")]) / y.sum()
        gain.plot(*_thin(share, captured), label=name, **style(name, list(scores)))
        lift.plot(*_thin(share, captured / share), label=name, **style(name, list(scores)))
    gain.plot([0, 1], [0, 1], "k:", lw=0.8)
    gain.set(
        xlabel="share of entities contacted (by score)",
        ylabel="share of positives captured",
        title="Cumulative gain",
    )
    lift.axhline(1.0, color="k", ls=":", lw=0.8)
    lift.set(xlabel="share of entities contacted (by score)", ylabel="lift", title="Lift", xlim=(0.01, 1))
    gain.legend(fontsize=8)
    charts.append(_png(fig))
    fig, ax = plt.subplots(figsize=(5, 4))
    for name, s in scores.items():
        if name not in probabilistic:
            continue
        bins = np.clip((s * 10).astype(int), 0, 9)
        cnt = np.bincount(bins, minlength=10)
        ok = cnt > 0
        mean_p = np.bincount(bins, weights=s, minlength=10)[ok] / cnt[ok]
        mean_y = np.bincount(bins, weights=y, minlength=10)[ok] / cnt[ok]
        ax.plot(mean_p, mean_y, marker="o", label=name, **style(name, list(scores)))
    ax.plot([0, 1], [0, 1], "k:", lw=0.8)
    ax.set(xlabel="predicted probability", ylabel="observed frequency", title="Calibration (10 bins)")
    ax.legend(fontsize=8)
    charts.append(_png(fig))
    return charts


def _regression_charts(y: np.ndarray, preds: dict[str, np.ndarray]) -> list[str]:
    y = np.asarray(y, np.float64)
    fig, (sc, cal, gain) = plt.subplots(1, 3, figsize=(15, 4))
    idx = np.random.default_rng(0).choice(len(y), min(len(y), 5000), replace=False)
    share = np.arange(1, len(y) + 1) / len(y)
    for name, p in preds.items():
        p = np.asarray(p, np.float64)
        sc.scatter(p[idx], y[idx], s=3, alpha=0.4, label=name, color=style(name, list(preds))["color"])
        order = np.argsort(p, kind="stable")
        deciles = np.array_split(order, 10)
        cal.plot(
            [p[d].mean() for d in deciles],
            [y[d].mean() for d in deciles],
            marker="o",
            label=name,
            **style(name, list(preds)),
        )
        captured = np.cumsum(y[order[::-1]]) / max(y.sum(), 1e-12)
        gain.plot(*_thin(share, captured), label=name, **style(name, list(preds)))
    lo, hi = float(y.min()), float(y.max())
    sc.plot([lo, hi], [lo, hi], "k:", lw=0.8)
    sc.set(xlabel="predicted", ylabel="actual", title="Predicted vs actual")
    cal.plot([lo, hi], [lo, hi], "k:", lw=0.8)
    cal.set(xlabel="mean predicted (decile)", ylabel="mean actual", title="Calibration by decile")
    gain.set(xlabel="share of entities (by prediction)", ylabel="share of the total target", title="Gain")
    for ax in (sc, cal, gain):
        ax.legend(fontsize=8)
    return [_png(fig)]


def _curve_charts(task: type[Task], truth: Any, outputs: dict[str, np.ndarray]) -> tuple[str, list[str]]:
    y, flat = _pairs(task, truth, outputs)
    note = " (micro-averaged over (entity, class) pairs)" if task.per_class else ""
    return note, _binary_charts(y, flat, {n for n in outputs if n != "popularity"})


def _ranking_charts(truth: tuple, ranked: dict[str, np.ndarray]) -> list[str]:
    indptr, indices, n_items = truth
    n_rel = np.diff(indptr).astype(np.float64)
    fig, (hr, nd) = plt.subplots(1, 2, figsize=(10, 4))
    for name, top in ranked.items():
        hits = ranking_hits(top, indptr, indices, n_items)
        ks = np.arange(1, hits.shape[1] + 1)
        hr.plot(ks, np.maximum.accumulate(hits, axis=1).mean(0), label=name, **style(name, list(ranked)))
        disc = 1.0 / np.log2(ks + 1.0)
        dcg = np.cumsum(hits * disc, axis=1)
        ideal = np.cumsum(disc)[np.minimum(n_rel[:, None], ks[None, :]).astype(int) - 1]
        nd.plot(ks, (dcg / ideal).mean(0), label=name, **style(name, list(ranked)))
    hr.set(xlabel="K", ylabel="HitRate@K", title="HitRate@K", xscale="log")
    nd.set(xlabel="K", ylabel="NDCG@K", title="NDCG@K", xscale="log")
    hr.legend(fontsize=8)
    return [_png(fig)]


def _training_chart(history: list[dict], metric: str) -> str:
    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 3.5))
    ep = [h["epoch"] for h in history]
    a.plot(ep, [h["train_loss"] for h in history], "o-")
    a.set(xlabel="epoch", ylabel="train loss", title="Training loss")
    b.plot(ep, [h["val_metric"] for h in history], "o-", color="#ff7f0e")
    b.set(xlabel="epoch", ylabel=f"validation {metric}", title="Validation metric (best epoch kept)")
    return _png(fig)


def _table(all_metrics: dict[str, dict[str, float]]) -> str:
    models = list(all_metrics)
    names = list(next(iter(all_metrics.values())))
    head = "".join(f"<th>{html.escape(m)}</th>" for m in models)
    rows = []
    for metric in names:
        vals = [all_metrics[m].get(metric) for m in models]
        finite = [v for v in vals if v is not None and np.isfinite(v)]
        best = (max if higher_is_better(metric) else min)(finite) if finite else None
        cells = "".join(
            f"<td{' class=best' if v == best else ''}>{'' if v is None or not np.isfinite(v) else f'{v:.4f}'}</td>"
            for v in vals
        )
        rows.append(f"<tr><th>{html.escape(metric)}</th>{cells}</tr>")
    return f"<table><tr><th>metric</th>{head}</tr>{''.join(rows)}</table>"


def _seed_spread(result: dict[str, Any]) -> str:
    """One line per seed ensemble: what its seeds scored on validation and test, and the ensemble."""
    lines = []
    for name, s in (result.get("seed_spread") or {}).items():
        parts = [
            f"{part} {p['mean']:.4f} ± {p['std']:.4f} (range {p['range']:.4f}; ensemble {p['ensemble']:.4f})"
            for part, p in ((k, s.get(k)) for k in ("select", "test"))
            if p
        ]
        seeds = ", ".join(str(x) for x in s["seeds"])
        lines.append(f"<li><code>{html.escape(name)}</code>, seeds {seeds}: {'; '.join(parts)}</li>")
    if not lines:
        return ""
    return (
        "<h2>Seed spread</h2><p>Each seed ensemble's members, one per seed: mean ± standard deviation of the "
        "primary metric on the validation (select) and test rows. A gap between candidates smaller than this "
        f"spread is within what a different seed gives.</p><ul>{''.join(lines)}</ul>"
    )


BASELINES = {"popularity", "recent_popularity", "lightgbm_aggregates", "repeat_purchases", "cooccurrence"}


def _selection_table(result: dict[str, Any]) -> str:
    """Every candidate's validation and test primary metric, which one is published and why."""
    sel = result.get("selection")
    if not sel:
        return ""
    metric, test = sel["metric"], result["test"]
    rows = []
    for name, val in sel["validation"].items():
        t = test.get(name)
        kind = "baseline" if name in BASELINES else "candidate"
        mark = " class=best" if name == sel["published"] else ""
        fmt = lambda v: "" if v is None or not np.isfinite(v) else f"{v:.4f}"  # noqa: E731
        rows.append(
            f"<tr><th>{html.escape(name)}</th><td>{kind}</td><td{mark}>{fmt(val)}</td><td>{fmt(t)}</td>"
            f"<td>{'published' if name == sel['published'] else ''}</td></tr>"
        )
    blend = sel.get("blend") or {}
    weights = (
        "; blend weights "
        + ", ".join(f"{m} {w}" for m, w in zip(blend["members"], blend["weights"], strict=True))
        if blend
        else ""
    )
    how = "pinned in the config" if sel.get("pinned") else "chosen on the validation windows (select rows)"
    worse = result.get("test_worse_than") or []
    warning = (
        f"<p style='color:#b00'><b>Warning:</b> on the test window the published model is worse than "
        f"{html.escape(', '.join(worse))}: the choice made on validation did not hold there.</p>"
        if worse
        else ""
    )
    na = "".join(
        f"<p>{html.escape(name)}: not applicable ({html.escape(why)}).</p>"
        for name, why in (result.get("not_applicable") or {}).items()
    )
    regime = (
        f" Data regime: <b>{html.escape(str(result.get('regime', '')))}</b>." if result.get("regime") else ""
    )
    return (
        f"<h2>Candidates: published <code>{html.escape(sel['published'])}</code> ({how})</h2>"
        f"<p>Why: {html.escape(sel['reason'])}{html.escape(weights)}.{regime} The test column was computed "
        f"once, after the choice; it played no part in it.</p>{_published(result)}"
        f"<table><tr><th>candidate</th><th>kind</th><th>validation {html.escape(metric)}</th>"
        f"<th>test {html.escape(metric)}</th><th></th></tr>{''.join(rows)}</table>{warning}{na}"
    )


def _published(result: dict[str, Any]) -> str:
    """What the published candidate is (its describe(): metrics.json's published_description)."""
    d = result.get("published_description")
    if not d:
        return ""
    fitted = json.dumps(d["parameters"], separators=(", ", ": "))
    return (
        f"<p>Published model: {html.escape(d['description'])}. It reads {html.escape(', '.join(d['inputs']))}; "
        f"fitted: <code>{html.escape(fitted)}</code></p>"
    )


CHARTS = {"values": _regression_charts, "ranking": _ranking_charts}  # charts of one output per row


def scenario_report(
    scenario: Scenario, result: dict[str, Any], truth: Any, outputs: dict[str, np.ndarray]
) -> str:
    """The report's HTML text. `outputs`: test scores (or ranked items) per model name."""
    task = result["task"]
    kind = task_named(task).charts  # the charts the task asks for (Task.charts)
    if kind == "curves":
        note, charts = _curve_charts(task_named(task), truth, outputs)
    else:
        note, charts = "", CHARTS[kind](truth, outputs) if kind in CHARTS else []
    charts.append(_training_chart(result["history"], result["metric"]))
    timing = ", ".join(f"{k} {v} s" for k, v in result.get("timing_s", {}).items())
    examples = ", ".join(f"{k} {v:,}" for k, v in result["examples"].items() if k != "available")
    capped = {
        k: v for k, v in result["examples"].get("available", {}).items() if v > result["examples"].get(k, v)
    }
    if capped:
        examples += " (sampled from " + ", ".join(f"{k} {v:,}" for k, v in capped.items()) + ")"
    for name, r in (result.get("lightgbm_rows") or {}).items():
        sampled = [n for n in r.get("rows_per_booster", []) if 0 < n < r.get("rows", 0)]
        if sampled:  # the multilabel LightGBM row bound applied: say so next to the examples
            examples += (
                f"; {name}: {len(sampled)} of {r['boosters']} boosters trained on a sample of at most "
                f"{r['max_rows']:,} of the {r['rows']:,} rows (lightgbm_max_rows; 0 = every row)"
            )
    target = html.escape(scenario.target.model_dump_json(exclude_defaults=True))
    return f"""<!doctype html>
<html><head><meta charset="utf-8"><title>Scenario {html.escape(scenario.name)}</title>
<style>body{{font-family:sans-serif;max-width:1100px;margin:2em auto;color:#222}}
table{{border-collapse:collapse}}td,th{{border:1px solid #ccc;padding:3px 8px;text-align:right}}
td.best{{font-weight:bold;background:#eef6ee}}img{{max-width:100%;display:block;margin:1em 0}}
code{{background:#f4f4f4;padding:2px 4px}}</style></head><body>
<h1>Scenario <code>{html.escape(scenario.name)}</code> ({task})</h1>
<p>Target: <code>{target}</code></p>
<p>Test split points {", ".join(result.get("test_split_points", [result["test_date"]]))} (an entity's
windows count together in the intervals); fine-tuning mode <b>{result["mode"]}</b>; examples: {examples};
outputs: {result["classes"]}. Primary metric: <b>{result["metric"]}</b>. Timing: {timing}.</p>
{_selection_table(result)}{_seed_spread(result)}
<h2>Test metrics: the published model ("model") vs every candidate and baseline</h2>{_table(result["test_metrics"])}
<h2>Charts{note}</h2>{"".join(charts)}
</body></html>
"""


# ---- explanations (inference/explain.py) ------------------------------------------------------------
TOP_BARS = 12  # bars per panel of the explanation charts


def _bars(ax, labels: list[str], values: list[float], title: str, signed: bool) -> None:
    y = np.arange(len(values))[::-1]
    colors = ["#d62728" if v < 0 else "#1f77b4" for v in values] if signed else "#1f77b4"
    ax.barh(y, values, color=colors)
    ax.set_yticks(y, [lab if len(lab) <= 48 else lab[:45] + "..." for lab in labels], fontsize=8)
    ax.set_title(title, fontsize=10)
    if signed:
        ax.axvline(0.0, color="k", lw=0.6)


def explanation_figure(expl: dict[str, Any]):
    """Bar charts of an explanation: one entity (signed contributions of its sources and top values) or a
    population (mean |attribution| of each source and of the top columns of each source)."""
    single = expl["entities"] == 1
    key = "attribution" if single else "mean_abs_attribution"
    if single:
        fig, (a, b, c) = plt.subplots(1, 3, figsize=(15, 4.5), gridspec_kw={"width_ratios": [1, 2, 2]})
        _bars(
            a, [r["source"] for r in expl["sources"]], [r[key] for r in expl["sources"]], "per source", True
        )
        top = expl["columns"][:TOP_BARS]
        _bars(b, [f"{r['source']} . {r['column']}" for r in top], [r[key] for r in top], "top columns", True)
        top = expl["values"][:TOP_BARS]
        labels = [f"{r['column']} = {r['value']}" for r in top]
        _bars(c, labels, [r[key] for r in top], "top values", True)
        out = expl["output"]
        fig.suptitle(
            f"entity {expl.get('entity_id', '')}: {out['description']} {out['value']:.3f} "
            f"(baseline {expl['baseline']['kind']}: {expl['baseline']['output']:.3f})",
            fontsize=10,
        )
        fig.tight_layout()
        return fig
    sources = [r["source"] for r in expl["sources"]]
    ncols = min(3, len(sources) + 1)
    nrows = -(-(len(sources) + 1) // ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(5.2 * ncols, 4.2 * nrows), squeeze=False)
    panels = list(axes.ravel())
    _bars(panels[0], sources, [r[key] for r in expl["sources"]], "mean |attribution| per source", False)
    for ax, src in zip(panels[1:], sources, strict=False):
        top = [r for r in expl["columns"] if r["source"] == src][:TOP_BARS]
        _bars(ax, [r["column"] for r in top], [r[key] for r in top], f"top columns: {src}", False)
    for ax in panels[len(sources) + 1 :]:
        ax.axis("off")
    fig.suptitle(
        f"{expl['output']['description']}, {expl['entities']} entities, baseline {expl['baseline']['kind']}",
        fontsize=10,
    )
    fig.tight_layout()
    return fig


def explanation_png(expl: dict[str, Any]) -> bytes:
    buf = io.BytesIO()
    fig = explanation_figure(expl)
    fig.savefig(buf, format="png", dpi=90, bbox_inches="tight")
    plt.close(fig)
    return buf.getvalue()


def explanation_section(expl: dict[str, Any]) -> str:
    """HTML section of a population explanation: the chart and the top values table."""
    img = base64.b64encode(explanation_png(expl)).decode()
    rows = "".join(
        f"<tr><td style='text-align:left'>{html.escape(r['source'])}</td>"
        f"<td style='text-align:left'>{html.escape(r['column'])}</td>"
        f"<td style='text-align:left'>{html.escape(r['value'])}</td>"
        f"<td>{r['mean_abs_attribution']:.4f}</td><td>{r['mean_attribution']:+.4f}</td></tr>"
        for r in expl["values"][:20]
    )
    comp = expl["completeness"]
    return (
        "<h2>What drives the model (integrated gradients)</h2>"
        f"<p>Mean |attribution| to the {html.escape(expl['output']['description'])} over "
        f"{expl['entities']} test entities, against the <b>{html.escape(expl['baseline']['kind'])}</b> baseline "
        f"(up to {expl['steps']['max_used']} quadrature steps; mean completeness gap "
        f"{comp['mean_abs_gap']:.2g} vs mean |output change| {comp['mean_abs_output_change']:.3g}). "
        "Each entity's totals per source and column are taken before the absolute value; "
        "see docs/explain.md.</p>"
        f'<img alt="explanation" src="data:image/png;base64,{img}">'
        "<table><tr><th>source</th><th>column</th><th>value</th><th>mean |attribution|</th>"
        f"<th>mean attribution</th></tr>{rows}</table>"
    )


def with_explanation(report: str, expl: dict[str, Any] | None) -> str:
    """The report with the explanation section inserted before the end of its body."""
    if not expl:
        return report
    return report.replace("</body>", explanation_section(expl) + "\n</body>", 1)
