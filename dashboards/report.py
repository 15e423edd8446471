"""Self-contained HTML reports: one run (``report``) or several side by side (``compare``).

Plots are PNGs embedded as base64 and the style is inline, so one file opens anywhere,
offline. The data comes from MLflow (or a run folder's ``metrics.jsonl``, see
:func:`dashboards.data.load_run`).
"""

from __future__ import annotations

import base64
import datetime as dt
import html
import math
from pathlib import Path

import numpy as np

from dashboards.data import POOL, RunData

STYLE = """
body{font-family:-apple-system,'DejaVu Sans',Arial,sans-serif;margin:24px;color:#222;max-width:1400px}
h1{font-size:22px;margin-bottom:4px} h2{font-size:17px;margin-top:28px;border-bottom:1px solid #ddd}
table{border-collapse:collapse;margin:8px 0;font-size:13px} td,th{border:1px solid #ccc;padding:4px 8px;
text-align:right} th{background:#f2f4f7} td.l,th.l{text-align:left} .meta{color:#666;font-size:13px}
img{max-width:100%;border:1px solid #eee;margin:6px 0} .note{background:#fff4e5;padding:6px 10px}
.grid{display:flex;flex-wrap:wrap;gap:16px}
"""

COMPARE_METRICS = [
    ("eval/avg/pass_at_1", "eval/avg: pass@1 (mean over sets)"),
    ("train/reward_mean", "train/reward_mean"),
    ("exchange/rate", "exchange/rate (grafted / all-fail groups)"),
    ("exchange/all_fail_rate", "exchange/all_fail_rate"),
]


def _fmt(value, digits: int = 3) -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "-"
    if isinstance(value, float) and value.is_integer() and abs(value) >= 1:
        return f"{value:.0f}"
    return f"{value:.{digits}f}" if isinstance(value, float) else html.escape(str(value))


def _table(headers: list[str], rows: list[list], left: int = 1, caption: str = "") -> str:
    head = "".join(f'<th class="{"l" if i < left else ""}">{html.escape(h)}</th>' for i, h in enumerate(headers))
    body = "".join("<tr>" + "".join(f'<td class="{"l" if i < left else ""}">{_fmt(c)}</td>'
                                    for i, c in enumerate(row)) + "</tr>" for row in rows)
    cap = f"<caption>{html.escape(caption)}</caption>" if caption else ""
    head = f"<tr>{head}</tr>" if any(headers) else ""
    return f"<table>{cap}{head}{body}</table>"


def _img(fig, alt: str, name: str) -> str:
    from dashboards.plots import png_bytes

    data = base64.b64encode(png_bytes(fig)).decode()
    return f'<figure><img id="{name}" alt="{html.escape(alt)}" src="data:image/png;base64,{data}"></figure>'


def _page(title: str, body: str) -> str:
    stamp = dt.datetime.now().strftime("%Y-%m-%d %H:%M")
    return (f"<!DOCTYPE html><html lang=en><head><meta charset=utf-8><title>{html.escape(title)}</title>"
            f"<style>{STYLE}</style></head><body><h1>{html.escape(title)}</h1>"
            f'<p class="meta">GraftPool dashboards, generated {stamp}</p>{body}</body></html>')


SUMMARY_ROWS = [
    ("final eval/avg pass@1", lambda d, m: d.final(m, "eval/avg/pass_at_1")),
    # the trained weights' best: step 0 (run.eval_at_start) is the starting model's, as summary.json's best_pass@1
    ("best eval/avg pass@1", lambda d, m: max((v for s, v in d.metric(m, "eval/avg/pass_at_1") if s > 0), default=None)),
    ("mean train/reward_mean", lambda d, m: d.mean(m, "train/reward_mean")),
    ("mean exchange/all_fail_rate", lambda d, m: d.mean(m, "exchange/all_fail_rate")),
    ("mean exchange/rate", lambda d, m: d.mean(m, "exchange/rate")),
    ("exchange/received (groups, total)", lambda d, m: d.total(m, "exchange/received")),
    ("exchange/given (groups, total)", lambda d, m: d.total(m, "exchange/given")),
    ("mean gate/admission_rate", lambda d, m: d.mean(m, "gate/admission_rate")),
    ("mean gate/mean_s", lambda d, m: d.mean(m, "gate/mean_s")),
    ("mean gate/mean_w", lambda d, m: d.mean(m, "gate/mean_w")),
    ("mean train/own_clip_frac", lambda d, m: d.mean(m, "train/own_clip_frac")),
    ("mean train/peer_clip_frac", lambda d, m: d.mean(m, "train/peer_clip_frac")),
    ("mean exchange/peer_push (sum w a)", lambda d, m: d.mean(m, "exchange/peer_push")),
    ("mean exchange/peer_push_ratio", lambda d, m: d.mean(m, "exchange/peer_push_ratio")),
    ("mean train/peer_grad_share", lambda d, m: d.peer_grad_share(m)),  # "-": not split at every mixed update
    ("peer-only updates (total)", lambda d, m: d.total(m, "train/updates_peer")),
    ("mixed updates (total)", lambda d, m: d.total(m, "train/updates_mixed")),
]


def summary_table(runs: list[tuple[str, RunData]]) -> str:
    """Rows: the summary quantities; columns: (run:) model."""
    columns = [(label, r, m) for label, r in runs for m in r.models]
    headers = ["", *[f"{label}: {m}" if label else m for label, _, m in columns]]
    return _table(headers, [[name, *[fn(r, m) for _, r, m in columns]] for name, fn in SUMMARY_ROWS])


def exchange_label(params: dict[str, str]) -> str:
    """The run's exchange as its config names it: ``exchange.name`` (a preset or a plugin policy), else
    ``<routing>+<transfer>`` as the policy names itself (``policies.presets.compose``; one left out is
    ``pool`` / ``graft``, as ``make_exchange`` fills it in); "-" where the params say nothing. A config
    with ``exchange.routing`` / ``exchange.transfer`` has ``exchange.name: null``, which MLflow's params
    and a run folder's ``config.yaml`` hold as "None"."""
    name = params.get("exchange.name")
    if name not in (None, "None"):
        return name
    routing, transfer = params.get("exchange.routing.name"), params.get("exchange.transfer.name")
    if routing is None and transfer is None:
        return "-"
    return f"{routing or 'pool'}+{transfer or 'graft'}"


def exchange_routing(params: dict[str, str]) -> str | None:
    """The routing the run's exchange used (a preset's, ``policies.presets.PRESETS``), else None."""
    from policies.presets import PRESETS

    label = exchange_label(params)
    if "+" in label:
        return label.split("+", 1)[0]
    return next((p.routing for p in PRESETS if p.name == label), None)


EVERY_PROMPT_NOTE = ("<p>Routing every_prompt (HACPO): every model's group on every prompt goes to every other "
                     "model, so these counts are not a share of the receivers' all-fail groups.</p>")


def all_fail_groups(data: RunData, model: str) -> float | None:
    """Sum over steps of the model's all-fail groups (all_fail_rate x prompt_batch)."""
    try:
        batch = float(data.params["algorithm.prompt_batch"])
    except (KeyError, ValueError):
        return None
    return sum(v * batch for _, v in data.metric(model, "exchange/all_fail_rate"))


def who_fed_whom(data: RunData) -> str:
    """One line per (donor, receiver) pair with traffic, busiest first, with its share of the receiver's
    all-fail groups where the routing moves groups to all-fail prompts only (not HACPO's every_prompt,
    which moves every group: a share of the all-fail groups would pass 100%)."""
    donors, flow = data.donors(), data.flow()
    every_prompt = exchange_routing(data.params) == "every_prompt"
    pairs = sorted(((flow[d, r], donor, receiver) for d, donor in enumerate(donors)
                    for r, receiver in enumerate(data.models) if donor != receiver and flow[d, r] > 0),
                   reverse=True)
    if not pairs:
        return "<p>No group moved between models in this run.</p>"
    items = []
    for count, donor, receiver in pairs:
        af = all_fail_groups(data, receiver)
        share = f" ({count / af:.0%} of {receiver}'s {af:.0f} all-fail groups)" if af and not every_prompt else ""
        items.append(f"<li><b>{html.escape(donor)}</b> &rarr; <b>{html.escape(receiver)}</b>: "
                     f"{count:.0f} groups{share}</li>")
    return f'<ul id="who_fed_whom">{"".join(items)}</ul>' + (EVERY_PROMPT_NOTE if every_prompt else "")


def faults_section(data: RunData) -> str:
    """Every actor death of the run: when, in which stage, what died, what was done, and the
    time to recover; with the count and the median and max recovery time per stage, and the
    restarts per actor."""
    body = "<h2>Faults: actor deaths and recoveries</h2>"
    if not data.faults:
        return body + '<p id="faults">No actor died in this run.</p>'
    times = [f["recovery_s"] for f in data.faults if isinstance(f.get("recovery_s"), int | float)]
    stopped = [f for f in data.faults if f.get("action") == "stopped the run"]
    body += (f'<p id="faults">{len(data.faults)} death{"s" if len(data.faults) != 1 else ""}, {len(times)} recovered'
             + (f", {len(stopped)} stopped the run" if stopped else "")
             + (f"; time to recover: median {float(np.median(times)):.2f} s, max {max(times):.2f} s"
                if times else "") + ".</p>")
    stages: dict[str, list[float]] = {}
    for f in data.faults:
        stages.setdefault(str(f.get("stage", "-")), [])
        if isinstance(f.get("recovery_s"), int | float):
            stages[str(f.get("stage", "-"))].append(float(f["recovery_s"]))
    body += _table(["stage", "deaths", "recovered", "median s", "max s"],
                   [[stage, float(sum(str(f.get("stage", "-")) == stage for f in data.faults)), float(len(v)),
                     float(np.median(v)) if v else None, max(v) if v else None]
                    for stage, v in sorted(stages.items())], caption="time to recover, by the stage the death was noticed in")
    per_actor: dict[str, int] = {}
    for f in data.faults:
        if f.get("action") != "stopped the run":
            per_actor[str(f.get("actor", "-"))] = per_actor.get(str(f.get("actor", "-")), 0) + 1
    body += _table(["actor", "restarts"], [[actor, float(n)] for actor, n in sorted(per_actor.items())],
                   caption="restarts per actor", left=1)
    rows = [[dt.datetime.fromtimestamp(float(f["time"])).strftime("%H:%M:%S") if "time" in f else "-",
             f.get("step"), f.get("stage", "-"), f.get("phase", "-"), f.get("actor", "-"),
             f.get("error") or f.get("action", "-"),
             float(f["recovery_s"]) if isinstance(f.get("recovery_s"), int | float) else None] for f in data.faults]
    return body + _table(["time", "step", "stage", "phase (redone)", "what died", "what was done", "recovery s"],
                         rows, left=6)


def render_report(data: RunData, window: int | None = None) -> str:
    """The HTML of one run's report."""
    from dashboards.views import render_views

    steps = data.steps()
    meta = [["run", data.name], ["MLflow run id", data.run_id or "-"], ["status", data.status or "-"],
            ["read from", data.source], ["models", ", ".join(data.models)],
            ["exchange policy", exchange_label(data.params)],
            ["steps logged", f"{steps[0]}-{steps[-1]} ({len(steps)})" if steps else "none"]]
    body = "".join(f'<p class="note">{html.escape(n)}</p>' for n in data.notes)
    body += _table(["", ""], meta, left=2)
    figures = render_views(data, window=window)
    body += "<h2>Which model fed which: exchange flow</h2>"
    body += _img(figures["flow_heatmap.png"], "flow-matrix heatmap", "flow_heatmap")
    donors, flow = data.donors(), data.flow()
    body += who_fed_whom(data)
    body += _table(["donor \\ receiver", *data.models, "total given"],
                   [[d, *[None if d == r else float(flow[i, j]) for j, r in enumerate(data.models)],
                     float(flow[i].sum())] for i, d in enumerate(donors)],
                   caption="F[donor, receiver]: groups moved over all steps")
    body += "<h2>Per model (over all steps)</h2>" + summary_table([("", data)])
    body += "<h2>Exchange and all-fail rates</h2>"
    body += _img(figures["exchange_rates.png"], "exchange rate and all-fail rate curves", "exchange_rates")
    body += "<h2>Peer data in the update</h2>"
    body += _img(figures["peer_push.png"], "net peer push and peer share of the gradient", "peer_push")
    sets = data.eval_sets()
    body += "<h2>Eval pass@1 per set</h2>"
    if sets:
        body += _img(figures["eval_pass_at_1.png"], "eval pass@1 curves", "eval_pass_at_1")
        body += _table(["model", *sets], [[m, *[data.final(m, f"eval/{s}/pass_at_1") for s in sets]]
                                          for m in data.models], caption="final pass@1")
    else:
        body += "<p>No eval steps logged.</p>"
    body += "<h2>Complementarity</h2>"
    comp = data.complementarity
    if "complementarity.png" in figures:
        body += _img(figures["complementarity.png"], "complementarity matrix", "complementarity")
        body += _table(["A \\ B", *comp["models"], "A's all-fail groups"],
                       [[a, *comp["C"][i], comp["all_fail"][i]] for i, a in enumerate(comp["models"])],
                       caption=comp["definition"])
    else:
        body += "<p>No complementarity matrix (needs a trajectory store with at least two models).</p>"
    body += faults_section(data)
    pool = data.series.get(POOL, {})
    times = sorted(k for k in pool if k.startswith("time/"))
    if times:
        body += "<h2>Step time (s, mean per step)</h2>" + _table(
            ["phase", "mean s"], [[k, data.mean(POOL, k)] for k in times])
    if data.params:
        body += "<h2>Config (MLflow params)</h2>" + _table(
            ["param", "value"], [[k, v] for k, v in sorted(data.params.items())], left=2)
    return _page(f"GraftPool run {data.name}", body)


def render_compare(runs: list[RunData], labels: list[str] | None = None) -> str:
    """Several runs (e.g. GRPO vs GRAFT vs pool) on the same axes, and a summary table."""
    from dashboards.plots import compare_curves

    labels = labels or [r.name for r in runs]
    if len(set(labels)) < len(labels):
        labels = [f"{label} ({r.run_id[:8] if r.run_id else i})" for i, (label, r) in
                  enumerate(zip(labels, runs, strict=True))]
    series = {label: {m: r.series.get(m, {}) for m in r.models} for label, r in zip(labels, runs, strict=True)}
    body = _table(["run", "MLflow run id", "exchange policy", "models", "steps", "read from"],
                  [[label, r.run_id or "-", exchange_label(r.params), ", ".join(r.models),
                    len(r.steps()), r.source] for label, r in zip(labels, runs, strict=True)], left=6)
    for r in runs:
        body += "".join(f'<p class="note">{html.escape(r.name)}: {html.escape(n)}</p>' for n in r.notes)
    body += "<h2>Side by side (colour: run, line style: model)</h2>"
    body += _img(compare_curves(series, COMPARE_METRICS), "runs compared", "compare_curves")
    body += "<h2>Per run and model (over all steps)</h2>" + summary_table(list(zip(labels, runs, strict=True)))
    sets = sorted({s for r in runs for s in r.eval_sets()})
    if sets:
        body += _table(["run", "model", *sets],
                       [[label, m, *[r.final(m, f"eval/{s}/pass_at_1") for s in sets]]
                        for label, r in zip(labels, runs, strict=True) for m in r.models],
                       left=2, caption="final pass@1 per eval set")
    return _page("GraftPool runs compared: " + " vs ".join(labels), body)


def write(html_text: str, out: str | Path) -> Path:
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(html_text)
    return out
