"""The notebooks in notebooks/ run top to bottom without error, draw every figure they call
for, write nothing beside themselves, and are stored without outputs."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError

NOTEBOOKS = sorted((Path(__file__).parent.parent / "notebooks").glob("*.ipynb"))
CELL_TIMEOUT_S = 300
# What a cell calls to draw: kvsim's plot functions, or notebook 1's ``show`` (which does).
DRAWS = re.compile(r"plot_\w+|show")


def draws(source: str) -> bool:
    """Whether the cell ``source`` calls a drawing function when it runs (a call inside a
    function it only defines does not count)."""
    for statement in ast.parse(source).body:
        if isinstance(statement, ast.FunctionDef | ast.ClassDef):
            continue
        for node in ast.walk(statement):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name | ast.Attribute):
                name = node.func.id if isinstance(node.func, ast.Name) else node.func.attr
                if DRAWS.fullmatch(name):
                    return True
    return False


def assert_ran_and_drew(path: Path, nb: nbformat.NotebookNode) -> None:
    """No cell of the executed ``nb`` failed, and each cell that draws displayed a PNG (the
    inline backend shows the figures a cell made; a backend switched to Agg shows none)."""
    errors = [o for c in nb.cells for o in c.get("outputs", []) if o.output_type == "error"]
    assert errors == [], path.name
    for index, cell in enumerate(nb.cells):
        if cell.cell_type == "code" and draws(cell.source):
            pngs = [o for o in cell.outputs if "image/png" in o.get("data", {})]
            assert pngs, f"{path.name}, cell {index} drew no image: {cell.source[:80]!r}"


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


@pytest.mark.slow  # 28 s: the default run checks the notebooks' form above; .ci/run runs both
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
            assert_ran_and_drew(path, nb)
            # Anything a notebook writes goes to a temporary folder, not beside the notebook
            # (the working folder, here a new empty one, is notebooks/ in Jupyter).
            assert sorted(p.name for p in folder.iterdir()) == [], path.name


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
    assert_ran_and_drew(path, nb)
    assert sorted(p.name for p in tmp_path.iterdir()) == [], path.name
