"""Write bench/RESULTS.md from bench/results/*.json and nothing else, so the page cannot drift from the files.

    python3 bench/results_page.py            # (re)write bench/RESULTS.md and the README's headline table
    python3 bench/results_page.py --check    # exit 1 when either is not what it would write

`make results` runs the first. The README's headline table is the block between BEGIN and END below.

Every benchmark under bench/ writes one flat JSON file (figures plus machine, load, data set, commit and
command). Each section below has a small renderer that reads the keys it knows; a key that is missing or of
another shape leaves its cell, row or table out, and nothing is invented in its place. Files that no renderer
claims are listed by name at the end. The output depends only on the files: sorted, no generation time.
How to read the figures: docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Callable, Iterable
from pathlib import Path

BENCH = Path(__file__).resolve().parent
RESULTS = BENCH / "results"
PAGE = BENCH / "RESULTS.md"

DATASETS = {
    "completejourney": "The Complete Journey",
    "nycflights13": "nycflights13",
    "onlineretail": "UCI Online Retail",
    "synthetic_small": "sparse synthetic data (25,000 customers, 60,000 events)",
    "synthetic_cohort": "synthetic data where every entity has events (25,000 entities, 60,000 events)",
}
# the units of the amounts the regression scenarios publish (a label, not a figure)
UNITS = {
    ("completejourney", "spend_28d"): "USD",
    ("nycflights13", "air_minutes_28d"): "minutes",
    ("onlineretail", "spend_28d"): "GBP",
}
BASELINES = (
    "popularity",
    "recent_popularity",
    "cooccurrence",
    "repeat_purchases",
    "lightgbm_aggregates",
    "neural",
)
BASELINE_NAMES = {
    "popularity": "28-day popularity",
    "recent_popularity": "recent popularity",
    "cooccurrence": "co-occurrence",
    "repeat_purchases": "repeat purchases",
    "lightgbm_aggregates": "LightGBM on aggregates",
    "neural": "network alone",
}
PEER_NAMES = {
    "ours": "ours (published model)",
    "lgbm": "aggregates + LightGBM",
    "coles_probe": "CoLES + probe",
    "coles_lgbm": "CoLES + LightGBM",
    "pipeline_lightgbm_aggregates": "the pipeline's LightGBM on aggregates",
}
PART_NAMES = {"ours": "ours", "lgbm": "aggregates + LightGBM", "coles": "CoLES"}

Files = list[tuple[Path, dict]]


# ------------------------------------------------------------------ formatting


def num(x: object, digits: int | None = None) -> str:
    """A number as the page writes it: thousands separated; `digits` decimals when given."""
    if isinstance(x, bool) or not isinstance(x, int | float):
        return "" if x is None else str(x)
    if digits is not None:
        return f"{x:,.{digits}f}"
    if isinstance(x, int) or float(x).is_integer() and abs(x) >= 1000:
        return f"{int(x):,}"
    return f"{x:,}"


def signed(x: object, digits: int = 4) -> str:
    return f"{x:+.{digits}f}" if isinstance(x, int | float) and not isinstance(x, bool) else ""


def interval(lo: object, hi: object) -> str:
    if not all(isinstance(v, int | float) for v in (lo, hi)):
        return ""
    return f"[{lo:+.4f}, {hi:+.4f}]"


def verdict(v: object) -> str:
    return {"win": "**win**", "loss": "**loss**", "tie": "tie"}.get(str(v), str(v or ""))


def per_seed(v: object) -> str:
    if isinstance(v, list):
        return ", ".join(num(x) for x in v)
    return num(v)


def plural(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}es" if word.endswith("s") else f"{n} {word}s"


def table(header: list[str], rows: Iterable[list[str]]) -> list[str]:
    rows = [r for r in rows if r and any(c for c in r[1:])]
    if not rows:
        return []
    out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    rows = [r + [""] * (len(header) - len(r)) for r in rows]
    out += ["| " + " | ".join(c.replace("|", "/") for c in r) + " |" for r in rows]
    return out + [""]


def block(heading: str, body: list[str], tail: list[str]) -> list[str]:
    """A heading, its tables and the lines after them; nothing at all when the tables came out empty."""
    return ([heading, ""] if heading else []) + body + tail if body else []


def first(v: object) -> object:
    """The 1-minute figure of a load average ([1, 5, 15] list, "a, b, c" text or a number)."""
    if isinstance(v, list) and v:
        return v[0]
    if isinstance(v, str) and "," in v:
        return v.split(",")[0].strip()
    return v


def load_of(d: dict) -> str:
    """The machine's load as the file records it: before → after, 1-minute averages."""
    if isinstance(d.get("load"), dict):
        before, after = d["load"].get("before"), d["load"].get("after")
    else:
        before = next(
            (d[k] for k in ("loadavg_before", "load_1min_before", "load_1min_at_start") if k in d), None
        )
        after = next((d[k] for k in ("loadavg_after", "load_1min_after", "loadavg_end") if k in d), None)
    before, after = first(before), first(after)
    if before is None and after is None:
        return ""
    if after is None:
        return f"load {before}"
    if before is None:
        return f"load {after} at the end"
    return f"load {before} → {after}"


def provenance(path: Path, d: dict, command: bool = True) -> list[str]:
    """The line under a table: results file, command, commit, date, machine and load."""
    parts = [f"`bench/results/{path.name}`"]
    if command and d.get("command"):
        parts.append(f"`{d['command']}`")
    for key, label in (("commit", "commit"), ("date", "")):
        if d.get(key):
            parts.append(f"{label} {d[key]}".strip())
    for key in ("machine", "device"):
        if d.get(key) and (key == "machine" or str(d[key]) not in str(d.get("machine", ""))):
            parts.append(str(d[key]))
    if load_of(d):
        parts.append(load_of(d))
    if d.get("dataset"):
        parts.append(f"data: {d['dataset']}")
    return ["Source: " + "; ".join(parts) + ".", ""]


def dataset_name(d: dict, path: Path) -> str:
    ds = str(d.get("dataset", ""))
    return DATASETS.get(ds, ds or path.stem)


def prefixes(d: dict, suffix: str) -> list[str]:
    """The `<name>` of every `<name>.<suffix>` key, in the file's order."""
    return [k[: -len(suffix) - 1] for k in d if k.endswith("." + suffix) and k.count(".") == 1]


# ------------------------------------------------------------------ quality


def is_main_quality(path: Path, d: dict) -> bool:
    return path.stem == f"quality_{d.get('dataset')}"


def is_reference_run(path: Path, d: dict) -> bool:
    return path.stem.startswith("quality_") and any(".new_vs_ref_" in k for k in d)


def baselines_of(d: dict, scenarios: list[str]) -> list[str]:
    found = {k.split(".", 1)[1][3:-8] for k in d if k.endswith("_verdict") and ".vs_" in k}
    found &= {k.split(".", 1)[1][3:-8] for s in scenarios for k in d if k.startswith(s + ".vs_")}
    return [b for b in BASELINES if b in found] + sorted(found - set(BASELINES))


def quality_cell(d: dict, s: str, b: str) -> str:
    k = f"{s}.vs_{b}"
    if k not in d:
        return ""
    base = num(d.get(f"{s}.{b}"))
    cell = f"{signed(d[k])} {interval(d.get(k + '_lo'), d.get(k + '_hi'))} {verdict(d.get(k + '_verdict'))}"
    return f"{base}: {cell.strip()}" if base else cell.strip()


def quality(files: Files) -> list[str]:
    out: list[str] = []
    for path, d in files:
        scenarios = prefixes(d, "metric")
        if not scenarios:
            continue
        bases = baselines_of(d, scenarios)
        rows = []
        tally = {"win": 0, "tie": 0, "loss": 0}
        for s in scenarios:
            weeks = str(d.get(f"{s}.test_split_points", ""))
            rows_n, ents = d.get(f"{s}.test_rows"), d.get(f"{s}.test_entities")
            ratio = [d.get(f"{s}.selection_time_ratio"), d.get(f"{s}.selection_time_ratio_with_features")]
            for b in bases:
                v = d.get(f"{s}.vs_{b}_verdict")
                if v in tally:
                    tally[v] += 1
            rows.append(
                [
                    s,
                    str(d.get(f"{s}.metric", "")),
                    str(len(weeks.split(","))) if weeks else "",
                    f"{num(rows_n)} ({num(ents)})" if rows_n is not None else "",
                    str(d.get(f"{s}.published", "")).replace(",", ", "),
                    num(d.get(f"{s}.model")),
                    *[quality_cell(d, s, b) for b in bases],
                    " / ".join(num(r) for r in ratio if r is not None),
                ]
            )
        body = table(
            ["scenario", "metric", "test weeks", "test rows (entities)", "published, per seed", "published"]
            + [f"vs {BASELINE_NAMES.get(b, b)}" for b in bases]
            + ["time x"],
            rows,
        )
        n = sum(tally.values())
        summary = [
            f"Against every baseline: {plural(tally['win'], 'win')}, {plural(tally['tie'], 'tie')}, "
            f"{plural(tally['loss'], 'loss')} out of {n} comparisons.",
            "",
        ]
        tail = (summary if n else []) + quality_provenance(path, d, scenarios)
        out += block(f"### {dataset_name(d, path)}", body, tail)
    return out


def quality_provenance(path: Path, d: dict, scenarios: list[str]) -> list[str]:
    runs: dict[tuple[str, str], list[str]] = {}
    for s in scenarios:
        if d.get(f"{s}.command"):
            runs.setdefault((str(d[f"{s}.command"]), str(d.get(f"{s}.commit", ""))), []).append(s)
    head = {k: v for k, v in d.items() if k in ("date", "machine", "loadavg_before", "loadavg_after")}
    extra = []
    if d.get("seeds"):
        extra.append(f"seeds {d['seeds']}")
    if d.get("bootstrap_rounds"):
        extra.append(f"bootstrap rounds {d['bootstrap_rounds']}")
    lines = provenance(path, head, command=False)
    lines[0] = lines[0][:-1] + ("; " + "; ".join(extra) if extra else "") + "."
    if runs:
        each = [
            f"{', '.join(names)}: `{cmd}`" + (f" at commit {commit}" if commit else "")
            for (cmd, commit), names in runs.items()
        ]
        lines.insert(-1, "Runs: " + "; ".join(each) + ".")
    return lines


def amounts(files: Files) -> list[str]:
    rows = []
    for path, d in files:
        ds = str(d.get("dataset", ""))
        for s in prefixes(d, "mean_actual"):
            ci = d.get(f"{s}.mean_actual_95")
            within = d.get(f"{s}.mean_within_interval")
            rows.append(
                [
                    dataset_name(d, path),
                    s,
                    UNITS.get((ds, s), ""),
                    num(d[f"{s}.mean_actual"])
                    + (f" [{num(ci[0])}, {num(ci[1])}]" if isinstance(ci, list) and len(ci) == 2 else ""),
                    per_seed(d.get(f"{s}.mean_predicted")),
                    per_seed(d.get(f"{s}.mean_expm1_of_log_prediction")),
                    {True: "yes, every seed", False: "no"}.get(within, ""),
                ]
            )
    return table(
        [
            "data set",
            "scenario",
            "unit",
            "mean label [95%]",
            "published amount, mean per seed",
            "expm1 of the log prediction, per seed",
            "within the interval",
        ],
        rows,
    )


def reference_runs(files: Files) -> list[str]:
    """One table per reference setting, one row per (data set, scenario): the published model against the
    reference, and the differences of the candidates a setting may move, with their seconds."""
    groups: dict[str, list[tuple[Path, dict]]] = {}
    for path, d in files:
        ref = re.search(r"--reference (\S+)", str(d.get("command", "")))
        groups.setdefault(str(d.get("reference") or (ref.group(1) if ref else "")), []).append((path, d))
    out: list[str] = []
    for ref, runs in groups.items():
        rows, sources = [], []
        for path, d in runs:
            for s in prefixes(d, "metric"):
                model = d.get(f"{s}.new_vs_ref_model")
                if not (isinstance(model, list) and len(model) == 3):
                    continue

                def diff(cand: str, s: str = s, d: dict = d) -> str:
                    v = d.get(f"{s}.new_vs_ref_{cand}")
                    return (
                        f"{signed(v[0])} {interval(v[1], v[2])}"
                        if isinstance(v, list) and len(v) == 3
                        else ""
                    )

                def seconds(kind: str, s: str = s, d: dict = d) -> str:
                    ref_s, new_s = mean_of(d.get(f"{s}.ref_{kind}")), mean_of(d.get(f"{s}.new_{kind}"))
                    return f"{ref_s} → {new_s}" if ref_s and new_s else ""

                rows.append(
                    [
                        dataset_name(d, path),
                        s,
                        f"{num(d.get(f'{s}.ref_model'))} → {num(d.get(f'{s}.new_model'))}",
                        diff("model"),
                        diff("lightgbm_aggregates"),
                        diff("neural"),
                        seconds("lightgbm_fit_s"),
                        seconds("network_train_s"),
                    ]
                )
            sources.append(provenance(path, d)[0])
        body = table(
            [
                "data set",
                "scenario",
                "published: reference → this run",
                "this run − reference [95%]",
                "LightGBM on aggregates − reference",
                "network alone − reference",
                "LightGBM fit s, reference → this run",
                "network train s, reference → this run",
            ],
            rows,
        )
        heading = f"### Reference `{ref}`" if ref else "### Reference: in each command"
        out += block(heading, body, [*sources, ""])
    return out


def mean_of(v: object) -> str:
    """The mean of a per-seed list of seconds (None entries skipped), the number itself, or "" for none."""
    values = [x for x in (v if isinstance(v, list) else [v]) if isinstance(x, (int, float))]
    return num(round(sum(values) / len(values), 2)) if values else ""


# ------------------------------------------------------------------ peers


def peers(files: Files) -> list[str]:
    out: list[str] = []
    for path, d in files:
        scenarios = prefixes(d, "metric")
        models = [m for m in PEER_NAMES if any(f"{s}.{m}" in d for s in scenarios)]
        others = [m for m in models if m != "ours"]
        rows = []
        for s in scenarios:
            cells = []
            for m in models:
                ci = d.get(f"{s}.{m}_ci95")
                ci_s = f" [{num(ci[0])}, {num(ci[1])}]" if isinstance(ci, list) and len(ci) == 2 else ""
                cells.append(num(d.get(f"{s}.{m}")) + ci_s if f"{s}.{m}" in d else "")
            rows.append([f"{s} ({d.get(f'{s}.metric', '')})", *cells])
            diffs = []
            for m in others:
                k = f"{s}.ours_minus_{m}"
                ci = d.get(k + "_ci95")
                diffs.append(
                    f"{signed(d.get(k))} {interval(*ci)} {verdict(d.get(k + '_verdict'))}".strip()
                    if isinstance(ci, list) and len(ci) == 2
                    else ""
                )
            if any(diffs):
                rows.append([f"{s}: ours − peer [95%]", "", *diffs])
        body = table(["scenario (metric)"] + [PEER_NAMES[m] for m in models], rows)
        parts = [p for p in PART_NAMES if f"{p}.train_s" in d] + sorted(
            {k.split(".")[0] for k in d if k.endswith(".train_s") and k.count(".") == 1} - set(PART_NAMES)
        )
        rows = []
        for p in parts:
            ratios = [
                d.get(f"ratio_{k}_ours_over_{p}")
                for k in ("train_time", "score_entities_per_s", "peak_anon", "peak_rss")
            ]
            rows.append(
                [
                    PART_NAMES.get(p, p),
                    num(d.get(f"{p}.train_s")),
                    num(d.get(f"{p}.score_s")),
                    num(d.get(f"{p}.score_entities_per_s_all_scenarios")),
                    num(d.get(f"{p}.peak_anon_mb")),
                    num(d.get(f"{p}.peak_rss_mb")),
                    load_of({"loadavg_before": d.get(f"{p}.loadavg_before"), **_after(d, p)}).removeprefix(
                        "load "
                    ),
                    " / ".join(f"{num(r)}x" for r in ratios) if all(r is not None for r in ratios) else "",
                ]
            )
        body += table(
            [
                "part",
                "training s",
                "scoring s, all scenarios",
                "entities scored/s",
                "peak anonymous MB",
                "peak RSS MB",
                "load",
                "ours ÷ part: training time / entities scored/s / peak anonymous / peak RSS",
            ],
            rows,
        )
        body += _where_the_time_goes(d)
        out += block(f"### {dataset_name(d, path)}", body, provenance(path, d))
    return out


def _where_the_time_goes(d: dict) -> list[str]:
    """One line: the pipeline's stages and, per scenario, fine-tuning's phases, in seconds of that run."""
    times = d.get("ours.times")
    if not isinstance(times, dict):
        return []
    stages = ", ".join(f"{k.removesuffix('_s').replace('_', ' ')} {num(v)} s" for k, v in times.items())
    phases = []
    for key, value in sorted(d.items()):
        if key.startswith("ours.") and key.endswith(".timing_s") and isinstance(value, dict):
            name = key[len("ours.") : -len(".timing_s")]
            phases.append(
                f"{name}: " + ", ".join(f"{k.removesuffix('_s')} {num(v)}" for k, v in value.items())
            )
    line = f"Where the pipeline's time goes (s): {stages}."
    peer = d.get("lgbm.wall_s")
    if isinstance(peer, (int, float)) and peer > 0 and "finetune_s" in times:
        line += (
            f" Fine-tuning alone takes {times['finetune_s'] / peer:.2f}x the aggregates + LightGBM peer's"
            f" wall time end to end ({num(peer)} s)."
        )
    if phases:
        line += (
            " Fine-tuning phases (s; featurise is one pass shared by the scenarios): "
            + "; ".join(phases)
            + "."
        )
    return [line, ""]  # the table before it ends with its blank line


def _after(d: dict, p: str) -> dict:
    return {"loadavg_after": d[f"{p}.loadavg_after"]} if f"{p}.loadavg_after" in d else {}


# ------------------------------------------------------------------ foundation, budget, scaling


FOUNDATION_ROWS = (  # (key, label, how a ratio reads: "time" = a / b, "rate" = b / a, "" = none)
    ("time_to_foundation_s", "time to a foundation model, s", "time"),
    ("foundation_examples", "training examples (all epochs)", ""),
    ("train_examples_per_s", "training examples/s", "rate"),
    ("train_history_events_per_s", "history events featurised/s", "rate"),
    ("foundation_featurise_s", "featurisation in pretraining, s", "time"),
    ("featurise_events_per_s", "full-history featurisation, events/s", "rate"),
    ("foundation_val_loss", "validation loss", ""),
    ("peak_anon_mb", "peak anonymous memory, MB", ""),
)


def foundation(files: Files) -> list[str]:
    files = sorted(files, key=lambda f: (f[1].get("device") != "cpu", f[0].name))
    if not files:
        return []
    cols = [f"{d.get('machine', path.stem)}" for path, d in files]
    ratio = len(files) == 2
    rows = []
    for key, label, kind in FOUNDATION_ROWS:
        vals = [d.get(key) for _, d in files]
        cells = [num(v, 4 if key.endswith("val_loss") else None) for v in vals]
        if ratio:
            a, b = vals
            r = ""
            if all(isinstance(v, int | float) and v for v in (a, b)) and kind:
                r = f"{(b / a if kind == 'rate' else a / b):.1f}x"
            cells.append(r)
        rows.append([label, *cells])
    head = ["", *cols]
    if ratio:
        head.append(f"speed-up, {files[1][1].get('device', '')} over {files[0][1].get('device', '')}")
    return block("", table(head, rows), [line for path, d in files for line in provenance(path, d)])


def budget(files: Files) -> list[str]:
    out: list[str] = []
    for path, d in files:
        if d.get("benchmark") != "budget":
            continue
        scales = sorted({k.split(".")[0] for k in d if re.match(r"x\d+\.", k)}, key=lambda s: int(s[1:]))
        scenarios = sorted(
            {k.split(".")[1] for k in d if re.match(r"x\d+\.[^.]+\.neural$", k)},
            key=lambda s: next(i for i, k in enumerate(d) if f".{s}." in k),
        )
        rows = []
        for x in scales:
            row = [
                x,
                num(d.get(f"{x}.max_examples_per_epoch")),
                num(d.get(f"{x}.split_points_per_entity")),
                num(d.get(f"{x}.examples")),
                num(d.get(f"{x}.entities_covered_fraction")),
                num(d.get(f"{x}.pairs_covered_fraction")),
                num(d.get(f"{x}.pretrain_s")),
                num(d.get(f"{x}.val_loss")),
                num(d.get(f"{x}.peak_anon_mb")),
            ]
            for s in scenarios:
                net = _ci_text(d, f"{x}.{s}.neural")
                vs = d.get(f"{x}.{s}.neural_minus_x1")
                if vs is not None:
                    net += f"; vs x1 {signed(vs)} [{_ci_range(d.get(f'{x}.{s}.neural_minus_x1_ci95'))}]"
                row += [net, _ci_text(d, f"{x}.{s}.model")]
            rows.append(row)
        lgbm = ["LightGBM on aggregates"] + [""] * 8
        for s in scenarios:
            lgbm += [_ci_text(d, f"{scales[0]}.{s}.lightgbm_aggregates") if scales else "", ""]
        rows.append(lgbm)
        head = [
            "budget",
            "max examples per epoch",
            "split points per entity",
            "examples (all epochs)",
            "entities covered",
            "pairs covered",
            "pretrain s",
            "validation loss",
            "peak anonymous MB",
        ]
        for s in scenarios:
            head += [f"{s}: network [95%]", f"{s}: published [95%]"]
        heading = f"### {dataset_name(d, path)} (budget scaled by {d.get('budget_by', 'examples')})"
        out += block(heading, table(head, rows), provenance(path, d))
    return out


def _ci_range(v: object) -> str:
    """A "lo..hi" interval as "lo, hi"."""
    return str(v or "").replace("..", ", ")


def _ci_text(d: dict, k: str) -> str:
    if k not in d:
        return ""
    ci = _ci_range(d.get(k + "_ci95"))
    return f"{num(d[k])} [{ci}]" if ci else num(d[k])


STAGES = {
    "extract": "extract",
    "cache": "event cache build",
    "pretrain": "foundation training",
    "finetune": "fine-tuning (churn, baselines included)",
    "state": "per-entity state build",
    "score": "scoring every entity",
}


def scaling(files: Files) -> list[str]:
    out: list[str] = []
    for path, d in files:
        sizes = sorted({k.split(".")[0] for k in d if k.endswith(".events")}, key=lambda s: d[f"{s}.events"])
        stages = [s for s in STAGES if any(f"{z}.{s}.s" in d for z in sizes)]
        stages += sorted({k.split(".")[1] for k in d if k.count(".") == 2 and k.endswith(".s")} - set(stages))
        rows = []
        for st in stages:
            cells = []
            for z in sizes:
                t, m = d.get(f"{z}.{st}.s"), d.get(f"{z}.{st}.anon_mb")
                cells.append(
                    " / ".join(
                        x
                        for x in (
                            f"{num(t)} s" if t is not None else "",
                            f"{num(m)} MB" if m is not None else "",
                        )
                        if x
                    )
                )
            rows.append(
                [STAGES.get(st, st), *cells, num(d.get(f"{st}.slope_time")), num(d.get(f"{st}.slope_anon"))]
            )
        head = ["stage"] + [f"{z} ({num(d.get(f'{z}.entities'))} entities)" for z in sizes]
        work = [
            [
                "foundation training examples/s",
                *[num(d.get(f"{z}.pretrain.train_examples_per_s")) for z in sizes],
            ],
            ["scoring, entities/s", *[num(d.get(f"{z}.score.entities_per_s")) for z in sizes]],
            ["state build, events read/s", *[num(d.get(f"{z}.state.events_read_per_s")) for z in sizes]],
            ["load after the size", *[num(d.get(f"{z}.load_1min_after")) for z in sizes]],
        ]
        body = table(head + ["slope, time", "slope, memory"], rows + work)
        plot = path.with_suffix(".png")
        tail = [f"Plot: [`bench/results/{plot.name}`](results/{plot.name}).", ""] if plot.exists() else []
        out += block("", body, tail + provenance(path, d))
    return out


# ------------------------------------------------------------------ cache, scoring, memory, demo, probe, small


def cache(files: Files) -> list[str]:
    rows = []
    for path, d in sorted(files, key=lambda f: (f[1].get("events", 0), f[0].name)):
        rows.append(
            [
                f"`{path.name}`",
                num(d.get("events")),
                load_of(d).removeprefix("load "),
                num(d.get("cache_s")),
                num(d.get("cache_events_per_s"), 0),
                f"{num(d.get('peak_rss_mb'))} / {num(d.get('peak_anon_mb'))}",
                num(d.get("append_events")),
                num(d.get("append_s")),
                num(d.get("view_merge_s")),
            ]
        )
    out = table(
        [
            "results file",
            "events",
            "load",
            "build s",
            "events/s",
            "peak RSS / anonymous MB",
            "appended events",
            "append s",
            "first open after append, s",
        ],
        rows,
    )
    commands = sorted({str(d["command"]) for _, d in files if d.get("command")})
    machines = sorted({str(d["machine"]) for _, d in files if d.get("machine")})
    if out:
        out += [f"Commands: {'; '.join(f'`{c}`' for c in commands)}. Machine: {'; '.join(machines)}.", ""]
    return out


def inference(files: Files) -> list[str]:
    out: list[str] = []
    for path, d in files:
        if "fp32_forward_entities_per_s" in d or any(k.endswith("_forward_entities_per_s") for k in d):
            precisions = [k.split("_")[0] for k in d if k.endswith("_forward_entities_per_s")]
            metric = next(
                (k.split("_", 1)[1] for k in d if k.startswith(precisions[0] + "_") and "forward" not in k),
                "metric",
            )
            rows = [
                [
                    p,
                    num(d.get(f"{p}_{metric}")),
                    signed(d.get(f"{p}_metric_change"), 5) if f"{p}_metric_change" in d else "",
                    num(d.get(f"{p}_forward_entities_per_s")),
                    f"{num(d[f'{p}_speedup_over_fp32'])}x" if f"{p}_speedup_over_fp32" in d else "",
                ]
                for p in precisions
            ]
            heading = "### Precision of the scoring network (docs/inference.md)"
            body = table(
                ["precision", f"test {metric}", "change vs fp32", "forward entities/s", "speed-up over fp32"],
                rows,
            )
        else:
            rows = [
                [
                    "per-entity state build, s",
                    num(d.get("state_build_s")),
                    num(d.get("peak_anon_mb_state_build")),
                ],
                [
                    f"advance the state by 7 days ({num(d.get('state_advance_7d_new_events'))} new events), s",
                    num(d.get("state_advance_7d_s")),
                    num(d.get("peak_anon_mb_state_advance_7d")),
                ],
                [
                    "scoring every entity as of the latest day, entities/s",
                    num(d.get("inference_entities_per_s")),
                    num(d.get("peak_anon_mb_score_latest")),
                ],
                [
                    "the same end to end (reading the state), entities/s",
                    num(d.get("inference_latest_end_to_end_entities_per_s")),
                    "",
                ],
                [
                    f"replay as of {d.get('replay_as_of', 'an earlier day')} ({num(d.get('replay_entities'))} entities), entities/s",
                    num(d.get("inference_replay_entities_per_s")),
                    num(d.get("peak_anon_mb_score_replay")),
                ],
                [
                    "latest-day / replay scoring over the reference's 2,718 entities/s",
                    " / ".join(
                        f"{num(d[k])}x" for k in ("latest_over_reference", "replay_over_reference") if k in d
                    ),
                    "",
                ],
            ]
            heading = (
                f"### Scoring throughput ({d.get('precision', '')} on {num(d.get('entities'))} entities; "
                "docs/inference.md)"
            )
            body = table(["figure", "value", "peak anonymous MB"], rows)
        out += block(heading, body, provenance(path, d))
    return out


def stage_memory(files: Files) -> list[str]:
    rows, commands = [], []
    for path, d in files:
        for g in [k[: -len(".command")] for k in d if k.endswith(".command")]:
            load = num(d.get(f"{g}.load_1min_before"))
            if f"{g}.s" in d or f"{g}.anon_mb" in d:
                rows.append([f"`{path.name}`", g, num(d.get(f"{g}.s")), num(d.get(f"{g}.anon_mb")), load])
            for part, label in (("state", "state build"), ("score", "scoring")):
                if f"{g}.{part}_s" in d:
                    rows.append(
                        [
                            f"`{path.name}`",
                            f"{g}: {label}",
                            num(d[f"{g}.{part}_s"]),
                            num(d.get(f"{g}.{part}_anon_mb")),
                            load,
                        ]
                    )
            if str(d[f"{g}.command"]) not in commands:
                commands.append(str(d[f"{g}.command"]))
    out = table(["results file", "stage", "s", "peak anonymous MB", "load before"], rows)
    if out:
        machines = sorted({f"{d.get('machine', '')}, {d.get('date', '')}".strip(", ") for _, d in files})
        out += [
            f"Machine and date: {'; '.join(machines)}. Commands: "
            + "; ".join(f"`{c}`" for c in commands)
            + ".",
            "",
        ]
    return out


def demo(files: Files) -> list[str]:
    out: list[str] = []
    for path, d in files:
        scen = [k[: -len("_metric")] for k in d if k.endswith("_metric")]
        rows = [
            [
                s,
                str(d.get(f"{s}_metric", "")),
                num(d.get(f"{s}_model")),
                num(d.get(f"{s}_lightgbm_aggregates")),
                num(d.get(f"{s}_popularity")),
                num(d.get(f"{s}_model_over_lightgbm")),
                num(d.get(f"finetune_{s}_s")),
                num(d.get(f"predict_{s}_s")),
                num(d.get(f"{s}_inference_entities_per_s")),
            ]
            for s in scen
        ]
        body = table(
            [
                "scenario",
                "metric",
                "model",
                "LightGBM on aggregates",
                "popularity",
                "model ÷ LightGBM",
                "fine-tuning s",
                "scoring s",
                "scoring entities/s",
            ],
            rows,
        )
        figures = [
            f"{label} {num(d[k])}"
            for k, label in (
                ("extract_s", "extract s"),
                ("cache_s", "event cache s"),
                ("pretrain_s", "foundation s"),
                ("total_s", "all stages s"),
                ("cache_events_per_s", "event cache build, events/s"),
                ("train_events_per_s", "data set events x epochs per second of foundation wall time"),
                ("peak_rss_mb", "peak RSS, MB"),
            )
            if k in d
        ]
        tail = ["Also: " + "; ".join(figures) + ".", ""] if figures else []
        out += block("", body, tail + provenance(path, d))
    return out


PROTOCOLS = ("recsys", "unseen_weeks", "weekly")


def probe(files: Files) -> list[str]:
    tasks = sorted(
        {k[: -len("_metric")] for _, d in files for k in d if k.endswith("_metric")},
        key=lambda t: (t != "churn", t),
    )
    cols = [(t, p) for t in tasks for p in PROTOCOLS]
    rows = []
    for path, d in files:
        cells = []
        for t, p in cols:
            k = f"{p}_{t}"
            ci = d.get(f"{k}_seed_mean_diff_ci95")
            cells.append(
                f"{signed(d.get(f'{k}_seed_mean_diff'))} {interval(*ci)} "
                f"({num(d[f'{k}_probe_embeddings'])} vs {num(d.get(f'{k}_probe_aggregates'))})"
                if f"{k}_probe_embeddings" in d and isinstance(ci, list) and len(ci) == 2
                else ""
            )
        rows.append([f"`{path.name}`", *cells])
    keep = [i for i in range(len(cols)) if any(r[1 + i] for r in rows)]  # columns some file has
    cols = [cols[i] for i in keep]
    rows = [[r[0], *[r[1 + i] for i in keep]] for r in rows]
    out = table(["results file", *[f"{t}: {p}" for t, p in cols]], rows)
    if out:
        seen = sorted({str(d.get("command", "")) for _, d in files} - {""})
        out += ["Commands: " + "; ".join(f"`{c}`" for c in seen) + ".", ""]
        out += [
            f"- `{path.name}`: {d.get('dataset', '')}; {d.get('workspace', '')}; {d.get('machine', '')}".rstrip(
                "; "
            )
            for path, d in files
        ] + [""]
    return out


SMALL_FIGURES = {  # file name prefix: (key, what it is) in the order shown
    "outputs": (
        ("parquet_rows_per_s", "Parquet predictions file, rows/s"),
        ("parquet_mb", "Parquet file, MB"),
        ("csv_rows_per_s", "CSV predictions file, rows/s"),
        ("tsv_rows_per_s", "TSV predictions file, rows/s"),
        ("csv_mb", "CSV or TSV file, MB"),
        ("peak_rss_mb", "writing them, peak RSS MB"),
    ),
    "explain": (
        ("churn_entity_s", "explaining one entity (the whole command), s"),
        ("churn_population_entities_per_s", "explaining a population, entities/s"),
        ("churn_population_max_abs_gap", "largest completeness gap"),
        ("churn_top_columns", "top columns"),
    ),
    "synthetic_generator": (
        ("events_per_s", "synthetic generator, events/s"),
        ("peak_rss_mb", "synthetic generator, peak RSS MB"),
    ),
}


def small(files: Files) -> list[str]:
    rows, sources = [], []
    for path, d in files:
        figures = next((v for k, v in SMALL_FIGURES.items() if path.stem.startswith(k)), ())
        mine = [
            [label, num(d[k], 4 if k.endswith("gap") else None), f"`{path.name}`"]
            for k, label in figures
            if k in d
        ]
        rows += mine
        if mine:
            sources += provenance(path, d)[:1]
    out = table(["figure", "value", "results file"], rows)
    return out + [line for src in sources for line in (src, "")] if out else []


# ------------------------------------------------------------------ the page


Section = tuple[str, str, Callable[[Path, dict], bool], Callable[[Files], list[str]]]

SECTIONS: list[Section] = [
    (
        "Quality on real data sets",
        "The published model (chosen on validation windows) against every baseline the pipeline computes, "
        "scored once on the test windows; three seeds. Cells: the baseline's score, then the seed-averaged "
        "difference published − baseline (for RMSE: baseline − published, so > 0 is always better) with its "
        "95% bootstrap interval over entities; **win** / **loss** when the interval excludes zero. "
        "time x: fine-tuning time with candidates, selection and blend over the network and baselines alone, "
        'without / with the scenario\'s featurisation. docs/benchmarks.md, "Quality".',
        is_main_quality,
        quality,
    ),
    (
        "Amounts in their own units",
        "Regression scenarios of a log1p amount publish the expected amount. Mean over the test windows' rows; "
        'the interval is the mean label\'s (entities resampled). docs/benchmarks.md, "Amounts".',
        is_main_quality,
        amounts,
    ),
    (
        "Against a reference setting",
        "The same foundations and rows fine-tuned twice: with the defaults (this run) and with the reference "
        "setting; paired bootstrap over the test entities.",
        is_reference_run,
        reference_runs,
    ),
    (
        "Peers in the same run",
        "Each peer in its own process on the same split, labels and test rows; intervals from one paired "
        'bootstrap over the test rows. docs/benchmarks.md, "Peers".',
        lambda p, d: p.stem.startswith("peers_"),
        peers,
    ),
    (
        "Foundation training",
        "The same seeded synthetic data set and the same examples on each machine. docs/benchmarks.md, "
        '"Throughput".',
        lambda p, d: p.stem.startswith("foundation_"),
        foundation,
    ),
    (
        "Quality against the foundation's budget",
        "The foundation trained with 1x, 4x, 16x the default examples; the same scenarios fine-tuned on each; "
        '95% bootstrap intervals, the difference paired against x1. docs/benchmarks.md, "Budget".',
        lambda p, d: p.stem.startswith("budget_") and d.get("benchmark") == "budget",
        budget,
    ),
    (
        "Scaling of every stage",
        "Wall time / peak anonymous memory per stage and size; the log-log slope against events (1 = linear). "
        'docs/benchmarks.md, "Scaling".',
        lambda p, d: p.stem.startswith("scaling_"),
        scaling,
    ),
    (
        "Event cache",
        "Sharded build, then one day appended as a segment; the first reader after an append merges the "
        "segments once. docs/cache.md.",
        lambda p, d: p.stem.startswith("cache_"),
        cache,
    ),
    (
        "Scoring",
        "",
        lambda p, d: p.stem.startswith("inference_"),
        inference,
    ),
    (
        "Peak memory of single stages",
        'Each stage in a fresh process, peak anonymous memory sampled. docs/benchmarks.md, "Memory".',
        lambda p, d: p.stem.startswith("stage_memory_"),
        stage_memory,
    ),
    (
        "Demo stages",
        "The demo's stages without Dagster on The Complete Journey, one seed.",
        lambda p, d: p.stem.startswith("demo_"),
        demo,
    ),
    (
        "Embedding probe",
        "The same fixed probe on the exported embeddings and on the hand-crafted aggregates, means of three "
        'probe seeds; the difference\'s 95% interval is a paired bootstrap. docs/benchmarks.md, "Probe".',
        lambda p, d: p.stem.startswith("embedding_probe"),
        probe,
    ),
    (
        "Outputs, explanations and the generator",
        "",
        lambda p, d: p.stem.startswith(("outputs_", "explain_", "synthetic_generator")),
        small,
    ),
]

HEADER = """# Results

Generated by `make results` (`bench/results_page.py`) from `bench/results/*.json`: do not edit by hand.
Each table names the command, results file, commit, date, machine and load it comes from, where the file
records them. How to read the figures and what they mean: [docs/benchmarks.md](../docs/benchmarks.md).
"""


def load_results(root: Path = RESULTS) -> Files:
    files = []
    for path in sorted(root.glob("*.json")):
        try:
            d = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if isinstance(d, dict):
            files.append((path, d))
    return files


def safely(renderer: Callable[[Files], list[str]], files: Files) -> list[str] | None:
    """The renderer's lines, or None when a value of an unexpected type or shape stopped it."""
    try:
        return renderer(files)
    except (KeyError, TypeError, ValueError, IndexError, AttributeError, ZeroDivisionError):
        return None


def render(files: Files) -> str:
    lines = HEADER.splitlines() + [""]
    used: set[Path] = set()
    for title, caption, claims, renderer in SECTIONS:
        mine = [(p, d) for p, d in files if claims(p, d)]
        body = safely(renderer, mine)
        if body is None:  # a file of a shape the renderer does not expect: the section without it
            body = [line for f in mine for line in safely(renderer, [f]) or []]
        if body:
            lines += [f"## {title}", ""] + ([caption, ""] if caption else []) + body
            used |= {p for p, _ in mine if p.name in "\n".join(body)}
    rest = [p for p, _ in files if p not in used]
    if rest:
        lines += ["## Other result files", ""]
        lines += [
            "Earlier runs kept as files, not rendered here: " + ", ".join(f"`{p.name}`" for p in rest) + "."
        ]
    # a heading is followed directly by its text (Markdown needs no blank line there)
    lines = [x for i, x in enumerate(lines) if x or i == 0 or not lines[i - 1].startswith("#")]
    while lines and not lines[-1]:
        lines.pop()
    return "\n".join(lines) + "\n"


# ------------------------------------------------------------------ the README's headline table

README = BENCH.parent / "README.md"
BEGIN = "<!-- headline results: written by `make results` from bench/results/*.json -->"
END = "<!-- end of headline results -->"


def headline(files: Files) -> list[str]:
    """A few rows for the README, each pointing to its section of RESULTS.md: quality, peers, foundation,
    scoring."""
    quality_rows, peer_rows, other_rows = [], [], []
    for path, d in files:
        scenarios = prefixes(d, "metric")
        if is_main_quality(path, d) and scenarios:
            tally = [d.get(k) for k in d if k.endswith("_verdict") and ".vs_" in k]
            quality_rows.append(
                [
                    f"Quality on {dataset_name(d, path)} ({len(scenarios)} scenarios, seeds {d.get('seeds', '')})",
                    f"the published model against every baseline: {plural(tally.count('win'), 'win')}, "
                    f"{plural(tally.count('tie'), 'tie')}, {plural(tally.count('loss'), 'loss')}",
                    "[RESULTS.md](bench/RESULTS.md#quality-on-real-data-sets)",
                ]
            )
        elif path.stem.startswith("peers_"):
            cells = []
            for s in scenarios:
                peers = [
                    k.removeprefix(f"{s}.ours_minus_").removesuffix("_verdict")
                    for k in d
                    if k.startswith(f"{s}.ours_minus_") and k.endswith("_verdict")
                ]
                vs = [
                    f"{d[f'{s}.ours_minus_{m}_verdict']} vs {PEER_NAMES.get(m, m)}"
                    for m in peers
                    if m in PEER_NAMES and m != "pipeline_lightgbm_aggregates"
                ]
                cells += [f"{s}: {', '.join(vs)}"] if vs else []
            name = DATASETS.get(path.stem[len("peers_") :], path.stem[len("peers_") :])
            if cells:
                peer_rows.append(
                    [
                        f"The pipeline against peers on {name}, one seed",
                        "; ".join(cells),
                        "[RESULTS.md](bench/RESULTS.md#peers-in-the-same-run)",
                    ]
                )
        elif path.stem.startswith("inference_") and "inference_entities_per_s" in d:
            over = d.get("latest_over_reference")
            other_rows.append(
                [
                    f"Scoring {num(d.get('entities'))} entities as of the latest day",
                    f"{num(d['inference_entities_per_s'], 0)} entities/s on {d.get('machine', '')}"
                    + (f" ({num(over)}x the reference's 2,718/s per GPU)" if over else ""),
                    "[RESULTS.md](bench/RESULTS.md#scoring)",
                ]
            )
    found = sorted(
        [(p, d) for p, d in files if p.stem.startswith("foundation_") and "time_to_foundation_s" in d],
        key=lambda f: (f[1].get("device") != "cpu", f[0].name),
    )
    if found:
        other_rows.insert(
            0,
            [
                f"Time to a foundation model, {num(found[0][1].get('events'))} synthetic events",
                ", ".join(f"{num(d['time_to_foundation_s'])} s on {d.get('machine', '')}" for _, d in found),
                "[RESULTS.md](bench/RESULTS.md#foundation-training)",
            ],
        )
    body = table(["claim", "figure", "details"], quality_rows + peer_rows + other_rows)
    return [BEGIN, *body[:-1], END] if body else [BEGIN, END]


def with_headline(readme: str, lines: list[str]) -> str:
    """The README with its headline block replaced; unchanged when it has no such block."""
    start, end = readme.find(BEGIN), readme.find(END)
    if start < 0 or end < start:
        return readme
    return readme[:start] + "\n".join(lines) + readme[end + len(END) :]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="exit 1 when RESULTS.md or the README differ")
    args = ap.parse_args(argv)
    files = load_results()
    wanted = {PAGE: render(files)}
    if README.exists():
        wanted[README] = with_headline(README.read_text(), headline(files))
    stale = [p for p, text in wanted.items() if not p.exists() or p.read_text() != text]
    if args.check:
        for p in stale:
            print(f"{p} is not what bench/results_page.py writes: run `make results`", file=sys.stderr)
        return 1 if stale else 0
    for p in stale:
        p.write_text(wanted[p])
        print(f"wrote {p}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
