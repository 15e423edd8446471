"""Every test that needs the scale backends runs in CI: ``make test`` runs the scale suite
(``SCALE_TESTS`` in the Makefile) in ``.venv-scale``, the only environment with vLLM and
DeepSpeed, and the main suite skips a ``needs_vllm`` / ``needs_deepspeed`` test. The forty-eighth
read's vLLM serve test (``tests/test_scale_served_context.py``) was in neither list: it was
skipped in the main suite and never collected by the scale one, so CI never ran it."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def scale_tests() -> set[str]:
    """The modules ``SCALE_TESTS`` names (a ``module::test`` entry by its module)."""
    text = (ROOT / "Makefile").read_text().replace("\\\n", " ")
    [value] = re.findall(r"^SCALE_TESTS \?=(.*)$", text, flags=re.M)
    return {entry.split("::")[0] for entry in value.split()}


def test_every_module_that_needs_the_scale_backends_is_in_the_scale_suite():
    needing = {f"tests/{path.name}" for path in (ROOT / "tests").glob("test_*.py")
               if re.search(r"^\s*@needs_(vllm|deepspeed)\b|^pytestmark.*\bneeds_(vllm|deepspeed)\b", path.read_text(), re.M)}
    assert needing, "no test names needs_vllm or needs_deepspeed: the check reads nothing"
    missing = needing - scale_tests()
    assert not missing, f"skipped in the main suite and not in the Makefile's SCALE_TESTS: {sorted(missing)}"
