"""The report's "mean train/peer_grad_share" is not a mean over the steps that happen to have it.

The DeepSpeed backend (the GPU template's) cannot split a mixed update's gradient into its own
and peer parts: ``train/peer_grad_share`` is NaN at a step with a mixed update, and NaN is not
logged (``Tracker.log``). The steps left are those whose updates held no peer rows next to own
ones: share 0 on a step without an exchange. ``dashboards report`` / ``compare`` averaged those,
so a GRAFT run of the template showed a peer share of the gradient of 0.000 (issue #51's
thirtieth read). Now the row is "-" where a step with a mixed update has no share; a run whose
every mixed update was split (the torch backend) keeps its mean.

The series are those the template's runs log per model and step (``train/updates_mixed`` and
``train/peer_grad_share``), given to the real report code."""

from __future__ import annotations

import re

from dashboards.data import RunData
from dashboards.report import summary_table


def _row(html: str, name: str) -> list[str]:
    row = re.search(rf"<tr><td class=\"l\">{re.escape(name)}</td>(.*?)</tr>", html)
    assert row is not None, name
    return re.findall(r"<td class=\"\">(.*?)</td>", row.group(1))


def test_the_mean_peer_grad_share_is_not_given_from_the_steps_without_a_mixed_update():
    deepspeed = {"train/updates_mixed": [(1, 0.0), (2, 1.0), (3, 0.0), (4, 1.0)],
                 "train/peer_grad_share": [(1, 0.0), (3, 0.0)]}  # NaN at steps 2 and 4: not logged
    torch = {"train/updates_mixed": [(1, 0.0), (2, 1.0)],
             "train/peer_grad_share": [(1, 0.0), (2, 0.3)]}
    data = RunData(name="graft-pair-3b", models=["qwen2.5-3b", "torch-model"],
                   series={"qwen2.5-3b": deepspeed, "torch-model": torch})
    assert _row(summary_table([("", data)]), "mean train/peer_grad_share") == ["-", "0.150"]
