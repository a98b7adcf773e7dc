"""examples/zero_stages.ipynb runs top to bottom in a real kernel (nbclient, the test extra's), on
ranks in the kernel's own process (zerompi/inprocess/): every cell without an error, every stage's
loss the same on every rank, the collectives of a step listed, and its two figures drawn. The
notebook is kept in git without outputs (a run's outputs are not source)."""
import os

import nbformat
import pytest
from nbclient import NotebookClient

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
NOTEBOOK = os.path.join(ROOT, "examples", "zero_stages.ipynb")


def test_the_notebook_is_kept_without_outputs():
    notebook = nbformat.read(NOTEBOOK, as_version=4)
    code = [cell for cell in notebook.cells if cell.cell_type == "code"]
    assert code and all(not cell.outputs and cell.execution_count is None for cell in code)


@pytest.mark.timeout(600)
def test_the_notebook_runs_and_shows_each_stage_and_its_figures(tmp_path):
    notebook = nbformat.read(NOTEBOOK, as_version=4)
    NotebookClient(notebook, timeout=300, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}},
                   env={**os.environ, "PYTHONPATH": ROOT}).execute()
    outputs = [output for cell in notebook.cells if cell.cell_type == "code" for output in cell.outputs]
    assert not [o for o in outputs if o.output_type == "error"]
    text = "".join(o.get("text", "") for o in outputs if o.output_type == "stream")
    assert all(f"stage {stage}: rank 0 holds" in text for stage in range(4)), text
    assert text.count("on every rank: True") == 4, text
    assert "stage 3: allgather params" in text and "reduce_scatter grads" in text, text
    assert "a reduce-scatter of" in text and "owners keep" in text, text               # lockstep
    images = [o for o in outputs if o.output_type == "display_data" and "image/png" in o.get("data", {})]
    assert len(images) == 2
