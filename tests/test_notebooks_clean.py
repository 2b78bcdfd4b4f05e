"""The notebooks as committed: outputs stripped, the Colab install cell first, guarded and
tagged so that CI (nbmake) skips it, budgets as parameters near the top. (Running them is
nbmake's job: pytest collects notebooks/ with --nbmake.)"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

NOTEBOOKS = sorted((Path(__file__).resolve().parents[1] / "notebooks").glob("*.ipynb"))


def test_there_are_notebooks():
  names = {p.name for p in NOTEBOOKS}
  assert {"quickstart.ipynb", "sac_pendulum.ipynb", "ppo_impala_cartpole.ipynb",
          "rainbow_minatar.ipynb"} <= names, names


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_is_clean_and_installs_only_on_colab(path):
  nb = json.loads(path.read_text())
  code = [c for c in nb["cells"] if c["cell_type"] == "code"]
  for cell in code:
    assert cell.get("outputs") == [] and cell.get("execution_count") is None, (
        f"{path.name}: outputs committed; clear them (Jupyter: Edit > Clear Outputs of All Cells)")
  first = "".join(code[0]["source"])
  assert "google.colab" in first and "pip" in first and "if " in first, first
  assert "skip-execution" in code[0]["metadata"].get("tags", [])
  assert "colab.research.google.com" in "".join(nb["cells"][0]["source"])  # the badge
