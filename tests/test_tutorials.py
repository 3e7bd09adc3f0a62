"""Every tutorial notebook runs top to bottom."""

from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

TUTORIALS = sorted((Path(__file__).resolve().parents[1] / "tutorials").glob("*.ipynb"))


@pytest.mark.slow
@pytest.mark.parametrize("notebook", TUTORIALS, ids=[p.stem for p in TUTORIALS])
def test_tutorial_runs(notebook, tmp_path):
    nb = nbformat.read(notebook, as_version=4)
    NotebookClient(nb, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}).execute()
