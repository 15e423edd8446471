"""The report's "best eval/avg pass@1" is the trained weights' best, as ``summary.json``'s.

``run.eval_at_start: true`` evaluates the starting models as step 0; ``summary.json``'s
``best_pass@1`` leaves that evaluation out (config.md), but ``dashboards report`` / ``compare``
took the maximum over every logged step, so a run whose training never reached its starting
score showed the start's score as its best (issue #51's thirtieth read).

The series a run logs per model (``eval/avg/pass_at_1`` at steps 0, 25 and 50), given to the
real report code."""

from __future__ import annotations

import re

from dashboards.data import RunData
from dashboards.report import summary_table


def test_the_best_pass_at_1_leaves_out_the_starting_models_evaluation():
    series = {"qwen2.5-3b": {"eval/avg/pass_at_1": [(0, 0.5), (25, 0.3), (50, 0.4)]}}
    data = RunData(name="graft-pair-3b", models=["qwen2.5-3b"], series=series)
    row = re.search(r"<td class=\"l\">best eval/avg pass@1</td><td class=\"\">(.*?)</td>", summary_table([("", data)]))
    assert row is not None and row.group(1) == "0.400", row and row.group(1)
