"""The package layout docs/architecture.md describes: no import circles, imports only go down
the layers, and kvsim/ stays a small top level over its subpackages.

Every import counts, those inside functions and under ``if TYPE_CHECKING:`` included; only a
package ``__init__`` re-exporting its own modules is exempt (Python imports it on the way to
any of its modules, so it cannot be a layer of its own).
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).parents[1]
PACKAGES = ("engine", "workloads", "kvsim")

# kvsim's layers, top to bottom: each may import only the layers below it (and engine /
# workloads). docs/architecture.md shows the same order.
KVSIM_LAYERS = (
    ("kvsim.cli", "kvsim.__main__"),
    ("kvsim.commands",),
    ("kvsim.sweep",),
    ("kvsim.outputs",),
    ("kvsim.plots",),
    ("kvsim.runner",),
    ("kvsim.fleet",),
    ("kvsim.analysis",),
    ("kvsim.sim",),
    ("kvsim.config",),
    ("kvsim.costmodel",),
    ("kvsim.option_spec",),
    ("kvsim.atomic", "kvsim.errors"),
)

# engine's layers, top to bottom, the same way (docs/architecture.md, "The engine"). The torch
# engine sits on everything; the factory on every scheduler; the fast variants on the readable
# schedulers they must agree with; the BlockManager on v1's block-pool halves it mixes in; and
# sequences, events and errors at the bottom, beside the prefix-cache keys a Sequence carries
# and the compiled core, which imports nothing of the engine's Python.
ENGINE_LAYERS = (
    ("engine.torch_engine",),
    ("engine.factory",),
    ("engine.fast",),
    ("engine.v1.scheduler", "engine.v1.offloading_scheduler"),
    ("engine.pd",),  # P/D disaggregation: a pull connector whose link is the offload tier's
    ("engine.offload",),  # KV offload tiers: the v1 scheduler's connector, over the core
    ("engine.core.scheduler", "engine.contiguous"),
    ("engine.core.block_manager",),
    (
        "engine.v1.kv_cache_manager",
        "engine.v1.decode_blocks",
        "engine.v1.prefix_cache",
        "engine.v1.request_queue",
    ),
    (
        "engine.core.sequence",
        "engine.core.scheduler_output",
        "engine.core.invariants",
        "engine.core.events",
        "engine.core.event_sink",
        "engine.core.event_rows",
        "engine.core.event_kinds",
        "engine.core.errors",
    ),
    ("engine.v1.prefix_keys", "engine.compiled"),
)

# The one import allowed to go up (and to close a circle): Scheduler(config) with a v1 config,
# written before engine.factory existed, asks the factory for the v1 class inside __new__.
EXEMPT_IMPORTS = {("engine.core.scheduler", "engine.factory")}


def module_files() -> dict[str, Path]:
    files = {}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            files[".".join(parts)] = path
    return files


def imported_modules(name: str, path: Path, known: set[str]) -> set[str]:
    """The project modules ``name`` imports, anywhere in its body."""

    def resolve(target: str) -> str | None:
        parts = target.split(".")
        while parts and ".".join(parts) not in known:
            parts.pop()
        return ".".join(parts) or None

    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
                base = ".".join(package[: len(package) - node.level + 1] + [base] * bool(base))
            targets = [
                f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names
            ]
        found |= {m for t in targets if (m := resolve(t)) is not None and m != name}
    return found


def import_graph() -> dict[str, set[str]]:
    files = module_files()
    known = set(files)
    graph = {name: imported_modules(name, path, known) for name, path in files.items()}
    for name, path in files.items():
        if path.name == "__init__.py":  # re-exports of the package's own modules
            graph[name] = {m for m in graph[name] if not m.startswith(name + ".")}
    for module, target in EXEMPT_IMPORTS:
        graph[module].discard(target)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (iterative Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def layer_of(module: str, layers: tuple[tuple[str, ...], ...] = KVSIM_LAYERS) -> int | None:
    for rank, layer in enumerate(layers):
        if any(module == top or module.startswith(top + ".") for top in layer):
            return rank
    return None


def test_no_module_imports_one_that_imports_it_back() -> None:
    assert cycles(import_graph()) == []


def test_the_cycle_finder_finds_a_cycle() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert cycles(graph) == [["a", "b", "c"]]


def test_kvsim_imports_only_go_down_its_layers() -> None:
    graph = import_graph()
    upward = []
    for module, targets in graph.items():
        rank = layer_of(module)
        if module == "kvsim" or rank is None:
            continue
        for target in targets:
            target_rank = layer_of(target)
            if target_rank is not None and target_rank < rank:
                upward.append(f"{module} -> {target}")
    assert upward == []


def test_every_kvsim_module_belongs_to_a_layer() -> None:
    unplaced = [m for m in module_files() if m.startswith("kvsim.") and layer_of(m) is None]
    assert unplaced == []


def test_engine_imports_only_go_down_its_layers() -> None:
    graph = import_graph()
    upward = []
    for module, targets in graph.items():
        rank = layer_of(module, ENGINE_LAYERS)
        if rank is None:
            continue
        for target in targets:
            target_rank = layer_of(target, ENGINE_LAYERS)
            if target_rank is not None and target_rank < rank:
                upward.append(f"{module} -> {target}")
    assert upward == []


def test_every_engine_module_belongs_to_a_layer() -> None:
    # subpackage __init__ files hold only docstrings (and engine's own re-exports)
    packages = {"engine", "engine.core", "engine.v1", "engine.fast", "engine.contiguous"}
    unplaced = [
        m
        for m in module_files()
        if m.startswith("engine.") and m not in packages
        and layer_of(m, ENGINE_LAYERS) is None
    ]  # fmt: skip
    assert unplaced == []


def test_the_exempt_import_is_still_the_only_way_up() -> None:
    """The exemption names a real import: if engine.core.scheduler stops asking the factory,
    EXEMPT_IMPORTS must shrink with it (an unused exemption would hide a new one)."""
    files = module_files()
    for module, target in EXEMPT_IMPORTS:
        assert target in imported_modules(module, files[module], set(files))


def test_the_block_manager_and_schedulers_import_no_torch() -> None:
    """Cost mode must never pay torch's import: nothing outside engine.torch_engine imports it."""
    offenders = []
    for module, path in module_files().items():
        if module.startswith("engine") and not module.startswith("engine.torch_engine"):
            tree = ast.parse(path.read_text(encoding="utf-8"))
            for node in ast.walk(tree):
                names = (
                    [a.name for a in node.names] if isinstance(node, ast.Import)
                    else [node.module or ""] if isinstance(node, ast.ImportFrom) else []
                )  # fmt: skip
                if any(n == "torch" or n.startswith("torch.") for n in names):
                    offenders.append(module)
    assert offenders == []


def test_engine_and_workloads_import_nothing_of_kvsim_or_each_other() -> None:
    graph = import_graph()
    for module, targets in graph.items():
        top = module.split(".")[0]
        if top == "engine":
            assert not {t for t in targets if not t.startswith("engine")}, module
        if top == "workloads":
            assert not {t for t in targets if not t.startswith("workloads")}, module


def test_kvsim_top_level_is_small() -> None:
    kvsim = ROOT / "kvsim"
    modules = [p.name for p in kvsim.glob("*.py")]
    subpackages = [p.name for p in kvsim.iterdir() if (p / "__init__.py").exists()]
    assert len(modules) <= 8, modules
    assert len(subpackages) >= 4, subpackages


def test_the_cli_starts_without_the_heavy_libraries() -> None:
    """`kvsim --help` (and every command's start) must not pay for pandas, pyarrow,
    matplotlib, torch, numpy, simpy or the engine: commands import them where they are used."""
    code = (
        "import sys, kvsim.cli, kvsim; "
        "print(sorted({m.split('.')[0] for m in sys.modules} & "
        "{'pandas', 'pyarrow', 'matplotlib', 'torch', 'numpy', 'simpy', 'engine'}))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT
    )
    assert out.stdout.strip() == "[]"


def test_help_does_not_load_the_compiled_core() -> None:
    """`kvsim --help` imports every command's module but loads no extension (issue 26);
    `kvsim run` loads it once, on its first ``engine.compiled.load()`` (cached)."""
    code = (
        "import sys\n"
        "from kvsim.cli import main\n"
        "sys.argv = ['kvsim', '--help']\n"
        "try:\n    main()\nexcept SystemExit as e:\n    assert not e.code, e.code\n"
        "print(sorted(m for m in sys.modules if m.startswith('engine.compiled')))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT
    )
    assert "engine.compiled._core" not in out.stdout.strip().splitlines()[-1], out.stdout


def test_a_cost_mode_run_without_plots_imports_no_pandas(tmp_path: Path) -> None:
    """`kvsim run --no-plots` computes its tables on numpy columns and writes them through
    pyarrow (kvsim.analysis.table): importing pandas would cost it 0.3-0.5 s of its 1.0 s
    (issue 13); matplotlib, scipy and torch belong to the plots, calibration and engine mode.
    Nor numpy.ma (np.percentile / np.median import it: kvsim.analysis.quantiles), secrets, or
    rich.progress when stdout is not a terminal (no bar is shown): 8-25 ms each."""
    trace = tmp_path / "t.jsonl"
    trace.write_text(
        "".join(
            f'{{"request_id": "r{i}", "arrival_time_s": {i / 4}, "prompt_tokens": {40 + i}, '
            f'"output_tokens": {3 + i}}}\n'
            for i in range(6)
        )
    )
    code = (
        "import sys\n"
        "from kvsim.cli import main\n"
        f"sys.argv = ['kvsim', 'run', {str(trace)!r}, '--no-plots', '--out', "
        f"{str(tmp_path / 'run')!r}]\n"
        "try:\n    main()\nexcept SystemExit as e:\n    assert not e.code, e.code\n"
        "print(sorted({m.split('.')[0] for m in sys.modules} & "
        "{'pandas', 'matplotlib', 'scipy', 'torch'}))\n"
        "print(sorted(m for m in sys.modules if m.startswith('kvsim.commands.') and m not in "
        "('kvsim.commands.run', 'kvsim.commands.console', 'kvsim.commands.options', "
        "'kvsim.commands.summary')))\n"
        "print(sorted({'numpy.ma', 'secrets', 'rich.progress'} & set(sys.modules)))\n"
        "print(sorted(m for m in sys.modules if m.startswith(('engine.offload.', "
        "'engine.v1.offloading', 'kvsim.sim.compiled_offload')) and m not in "
        "('engine.offload.transfer', 'engine.offload.worker')))\n"
        "print('engine.compiled._core' in sys.modules)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT
    )
    heavy, other_commands, lazy, offload, core = out.stdout.strip().splitlines()[-5:]
    assert heavy == "[]", out.stdout
    # a run without a CPU tier loads none of the tier's modules (~15 ms of its start)
    assert offload == "[]", out.stdout
    import engine.compiled

    # the compiled core, where built (and not KVSIM_PURE_PYTHON=1), runs it
    assert core == str(engine.compiled.load() is not None), out.stdout
    assert other_commands == "[]", out.stdout  # only `run`'s module is loaded (kvsim.cli)
    assert lazy == "[]", out.stdout
    assert (tmp_path / "run" / "requests.parquet").is_file()
