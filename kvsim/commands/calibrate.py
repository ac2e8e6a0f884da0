"""Calibration commands: ``kvsim calibrate`` (fit a GPU's step-time coefficients from measured
profiles) and ``kvsim validate`` (their error against profiles: tables, CSVs, plots).

Each hands off to kvsim.costmodel.calibrate / validate and kvsim.outputs.validation; only this
edge turns their exceptions into one red line and exit code 2.
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.table import Table

from kvsim.commands.console import Command, console, fail, say
from kvsim.errors import KvsimError

if TYPE_CHECKING:
    import pandas as pd

    from kvsim.costmodel import GPUSpec, StepCoefficients
    from kvsim.costmodel.profiles import ProfileSet

Opt = typer.Option
ProfileDir = Annotated[
    Path,
    typer.Argument(
        metavar="PROFILE_DIR", help="Profile folder: compute/, attention/, network/, steps/ CSVs."
    ),
]
DeviceOption = Annotated[
    str | None,
    Opt(
        metavar="PREFIX",
        help="Profile file prefix of the GPU's rows (default: a100 / h100 / cpu, or the only one)",
    ),
]
ForceOption = Annotated[bool, Opt("--force", help="Replace an existing output")]


def _may_replace(path: Path, force: bool, inputs: tuple[Path, ...] = ()) -> None:
    """A coefficient file may be written where none is, or with --force over one kvsim wrote
    (its sidecar says so, kvsim.atomic.output_file); never over anything else, nor over an
    input of the command (--base, --gpu FILE). Checked before the fit."""
    from kvsim.atomic import check_output_file

    try:
        check_output_file(path, force=force, inputs=inputs)
    except KvsimError as exc:
        fail(str(exc))


def _save(co: StepCoefficients, path: Path, force: bool, inputs: tuple[Path, ...]) -> None:
    from kvsim.atomic import output_file
    from kvsim.costmodel import save_coefficients

    with output_file(path, force=force, inputs=inputs) as tmp:
        save_coefficients(co, tmp)


def _os_line(exc: OSError) -> str:
    from kvsim.commands.run import os_error_message

    return os_error_message(exc)


def print_tables(tables: list[tuple[str, pd.DataFrame]]) -> None:
    """Each table as a rich table under its title (MAPE and worst error in %)."""
    for title, frame in tables:
        table = Table(title=title, title_justify="left", header_style="bold")
        for column in frame.columns:
            table.add_column(
                str(column), justify="left" if frame[column].dtype == object else "right"
            )
        for row in frame.itertuples(index=False):
            table.add_row(*(str(v) for v in row))
        console.print(table)


def calibrate_command(
    profile_dir: ProfileDir,
    gpu: Annotated[
        str | None,
        Opt(
            metavar="NAME|FILE",
            help="GPU preset or GPU spec JSON file (engine profiles: device.json)",
        ),
    ] = None,
    out: Annotated[
        Path | None, Opt("-o", "--out", metavar="FILE", help="Coefficient file to write")
    ] = None,
    device: DeviceOption = None,
    system: Annotated[
        str | None,
        Opt(metavar="SYSTEM", help="All-reduce system of network/ (default: the GPU's DGX system)"),
    ] = None,
    base: Annotated[
        Path | None,
        Opt(
            metavar="FILE",
            help="Coefficients for the parts the folder has no profiles of (default: the preset's)",
        ),
    ] = None,
    num_sms: Annotated[
        int | None,
        Opt(metavar="SMS", help="Streaming multiprocessors (default: datasheet or profile.json)"),
    ] = None,
    presets: Annotated[
        bool,
        Opt("--presets", help="Refit all shipped presets from the Vidur profiles into folder -o"),
    ] = False,
    noisy_ok: Annotated[
        bool, Opt("--noisy-ok", help="Fit an engine profile its measurement called noisy")
    ] = False,
    force: ForceOption = False,
) -> None:
    """Fit one GPU's step-time coefficients from measured profiles.

    Least squares on relative error; prints the fit error per operator and per model."""
    from kvsim.costmodel import (
        load_coefficients,
        preset_coefficient_names,
        resolve_gpu,
    )
    from kvsim.costmodel import preset_coefficients as preset
    from kvsim.costmodel.calibrate import fit_gpu, fit_presets, noise_refusal
    from kvsim.costmodel.profiles import load_profile_dir
    from kvsim.costmodel.validate import error_tables, validate_gpu

    if out is None:
        fail("pass -o FILE (or -o FOLDER with --presets)")
    try:
        profiles = load_profile_dir(profile_dir)
        if presets:
            fitted = fit_presets(profiles)
            if out.exists() and not out.is_dir():
                fail(f"{out}: is not a folder (--presets writes one file per preset into it)")
            for name in fitted:
                _may_replace(out / f"{name}.json", force)
            for name, co in fitted.items():
                _save(co, out / f"{name}.json", force, ())
                say(f"wrote {out / f'{name}.json'}")
            return
        if gpu is None:
            fail("pass --gpu GPU (a preset, or a GPU spec file: an engine profile's device.json)")
        spec = resolve_gpu(gpu)
        reason = noise_refusal(profiles.meta)
        if reason and not noisy_ok:
            fail(
                f"{profile_dir}: {reason}; measure again on a quieter machine (or pass --noisy-ok)"
            )
        inputs = tuple(Path(f) for f in (base, gpu) if f is not None)
        _may_replace(out, force, inputs)
        start = (
            load_coefficients(base)
            if base
            else (preset(spec.name) if spec.name in preset_coefficient_names() else None)
        )
        co = fit_gpu(profiles, spec, device=device, system=system, num_sms=num_sms, base=start)
        validation = validate_gpu(profiles, spec, co, _device_of(profiles, spec, device))
        _save(co, out, force, inputs)
    except KvsimError as exc:
        fail(str(exc))
    except OSError as exc:
        fail(_os_line(exc))
    wanted = (
        "Per operator",
        "by GPU and model",
        "Attention",
        "All-reduce by worker",
        "Whole steps",
    )
    print_tables([t for t in error_tables([validation]) if any(w in t[0] for w in wanted)])
    say(f"wrote {out}")


def _device_of(profiles: ProfileSet, gpu: GPUSpec, device: str | None) -> str:
    from kvsim.costmodel.calibrate import profile_device

    return profile_device(profiles, gpu, device)


def validate_command(
    profile_dir: ProfileDir,
    gpu: Annotated[
        list[str] | None,
        Opt(metavar="NAME|FILE", help="GPU preset or spec file; repeat for several"),
    ] = None,
    coefficients: Annotated[
        Path | None,
        Opt(metavar="FILE", help="Coefficient file (default: the GPU preset's shipped file)"),
    ] = None,
    device: DeviceOption = None,
    lomo: Annotated[
        bool, Opt("--lomo", help="Also leave each model out of the fit and validate on it")
    ] = False,
    out: Annotated[
        Path | None,
        Opt(
            "-o",
            "--out",
            metavar="DIR",
            help="Output folder",
            show_default="validation/GPUS-TIMESTAMP",
        ),
    ] = None,
    force: ForceOption = False,
) -> None:
    """Check step-time coefficients against measured profiles.

    MAPE and worst error per operator, model, TP and token range (--lomo: each model left out
    of the fit); errors_*.csv, tables.md and predicted-vs-measured plots/ in the folder."""
    from kvsim.atomic import check_target
    from kvsim.costmodel import load_coefficients, preset_coefficients, resolve_gpu
    from kvsim.costmodel.profiles import load_profile_dir
    from kvsim.costmodel.validate import error_tables, validate_gpu
    from kvsim.outputs.validation import VALIDATION_FOLDER, write_validation

    names = gpu or []
    if not names:
        fail("pass --gpu GPU (repeat it for several)")
    if coefficients is not None and len(names) != 1:
        fail("--coefficients is one GPU's file: pass exactly one --gpu with it")
    out_dir = (
        out
        or Path("validation")
        / f"{'+'.join(Path(n).stem for n in names)}-{dt.datetime.now():%Y%m%d-%H%M%S}"
    )
    try:
        check_target(out_dir, VALIDATION_FOLDER, force=force)  # before the work, not after
        profiles = load_profile_dir(profile_dir)
        validations: list[Any] = []
        for name in names:
            spec = resolve_gpu(name)
            co: StepCoefficients = (
                load_coefficients(coefficients) if coefficients else preset_coefficients(spec.name)
            )
            where = _device_of(profiles, spec, device)
            validations.append(validate_gpu(profiles, spec, co, where, lomo=lomo))
        tables = error_tables(validations)
        if not tables:
            fail(f"{profile_dir}: no rows of device(s) {', '.join(v.device for v in validations)}")
        used = str(coefficients) if coefficients else "shipped presets"
        what = {"profiles": str(profile_dir), "gpus": names, "lomo": lomo, "coefficients": used}
        files = write_validation(validations, tables, out_dir, what=what, force=force)
    except KvsimError as exc:
        fail(str(exc))
    except OSError as exc:
        fail(_os_line(exc))
    print_tables(tables)
    say(f"wrote {out_dir} ({len(files)} files)")


def register(app: typer.Typer) -> None:
    app.command("calibrate", cls=Command)(calibrate_command)
    app.command("validate", cls=Command)(validate_command)
