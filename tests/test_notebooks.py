"""The notebooks in notebooks/ run top to bottom without error, and are stored without outputs."""

from __future__ import annotations

from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError

NOTEBOOKS = sorted((Path(__file__).parent.parent / "notebooks").glob("*.ipynb"))
CELL_TIMEOUT_S = 300


def test_the_five_notebooks_are_there() -> None:
    assert [p.name[:3] for p in NOTEBOOKS] == ["01_", "02_", "03_", "04_", "05_"]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_is_stored_without_outputs(path: Path) -> None:
    nb = nbformat.read(path, as_version=4)
    nbformat.validate(nb)
    for cell in nb.cells:
        if cell.cell_type == "code":
            assert cell.outputs == [] and cell.execution_count is None, (path.name, cell.source)
    # Notebooks call kvsim's own functions; they define no plotting or metric logic.
    source = "\n".join(c.source for c in nb.cells if c.cell_type == "code")
    assert "from kvsim" in source
    assert "import matplotlib" not in source


def test_the_notebooks_run_one_after_another_in_one_kernel(tmp_path: Path) -> None:
    """Every notebook top to bottom, in one kernel whose start and imports (about 4 s) are paid
    once. Before each, the namespace is emptied (%reset -f), so a notebook that uses a name it
    neither defines nor imports still fails, and the working folder is a new one of its own.
    test_notebook_runs (-m slow) runs each in a fresh kernel of its own."""
    client = NotebookClient(
        nbformat.v4.new_notebook(),
        timeout=CELL_TIMEOUT_S,
        kernel_name="python3",
        resources={"metadata": {"path": str(tmp_path)}},
    )
    with client.setup_kernel():
        for path in NOTEBOOKS:
            folder = tmp_path / path.stem
            folder.mkdir()
            fresh = nbformat.v4.new_code_cell(f"%reset -f\n__import__('os').chdir({str(folder)!r})")
            client.nb = nbformat.v4.new_notebook(cells=[fresh])  # the client stores outputs there
            client.execute_cell(fresh, 0)
            nb = client.nb = nbformat.read(path, as_version=4)
            for index, cell in enumerate(nb.cells):
                try:  # raises CellExecutionError, naming the cell, on any error
                    client.execute_cell(cell, index)
                except CellExecutionError as error:
                    raise AssertionError(f"{path.name}, cell {index}: {error}") from None
            errors = [o for c in nb.cells for o in c.get("outputs", []) if o.output_type == "error"]
            assert errors == [], path.name


@pytest.mark.slow
@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_runs(path: Path, tmp_path: Path) -> None:
    nb = nbformat.read(path, as_version=4)
    client = NotebookClient(
        nb,
        timeout=CELL_TIMEOUT_S,
        kernel_name="python3",
        resources={"metadata": {"path": str(tmp_path)}},  # anything written lands in tmp_path
    )
    client.execute()  # raises CellExecutionError, naming the cell, on any error
    errors = [o for c in nb.cells for o in c.get("outputs", []) if o.output_type == "error"]
    assert errors == []
