"""A compiled CPU kernel for paged attention in float32 (decodes and prefill chunks over
cached context), loaded with ctypes.

engine/torch_engine/csrc/paged_decode.c (plain C and OpenMP, no torch headers) reads K and V in
place through the block tables, where the torch path first gathers them into a padded copy. It
is compiled on first use with the system C compiler and cached on disk under a name that hashes
the source, the flags, the compiler and the machine: `$KVSIM_CACHE_DIR`, else
`$XDG_CACHE_HOME/kvsim`, else `~/.cache/kvsim`. Each build is written to a temporary file and
renamed into place, so concurrent processes never load a half-written library.

The expected ways to be without the kernel — no C compiler, a compiler that cannot build the
file, an unwritable cache folder, `KVSIM_CPU_KERNEL=0` — leave `load_cpu_decode().kernel`
None with the reason in `.reason`; attention then runs the torch path. Anything else
raises.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import importlib.resources
import math
import os
import platform
import shlex
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch

from engine.core.errors import EngineError

SOURCE = "torch_engine/csrc/paged_decode.c"  # inside the engine package
FLAGS = ("-O3", "-march=native", "-fopenmp", "-std=gnu11", "-shared", "-fPIC")
COMPILE_TIMEOUT_S = 300
_ERRORS = {
    1: "a block table names a block outside the pool",
    2: "a context length is < 1 or longer than its block table",
    3: "a row names a sequence outside the block tables",
    4: "out of memory",
}


class CpuKernelUnavailableError(EngineError, RuntimeError):
    """The CPU kernel was asked for but could not be built: the message says why."""


class CpuDecodeKernel:
    """The loaded library. Its OpenMP is the libgomp torch already loaded (same soname)."""

    def __init__(self, library: ctypes.CDLL, path: Path) -> None:
        self.path = path  # the cached shared library
        fn = library.kvsim_paged_attention_f32
        fn.argtypes = [ctypes.c_void_p] * 7 + [ctypes.c_int64] * 8 + [ctypes.c_float, ctypes.c_int]
        fn.restype = ctypes.c_int
        self._fn = fn

    def paged_decode(
        self,
        query: torch.Tensor,
        key_cache: torch.Tensor,
        value_cache: torch.Tensor,
        block_tables: torch.Tensor,
        context_lens: torch.Tensor,
        *,
        num_threads: int | None = None,
    ) -> torch.Tensor:
        """query [B, H, D], caches [N, bs, KVH, D] (CPU float32, contiguous), block_tables
        [B, max_blocks] and context_lens [B] (int64) -> [B, H, D].

        Deterministic: each output row is computed by one thread in a fixed order.
        `num_threads` defaults to torch.get_num_threads().
        """
        return self.paged_attention(
            query, key_cache, value_cache, block_tables, context_lens, num_threads=num_threads
        )

    def paged_attention(
        self,
        query: torch.Tensor,
        key_cache: torch.Tensor,
        value_cache: torch.Tensor,
        block_tables: torch.Tensor,
        context_lens: torch.Tensor,
        row_seqs: torch.Tensor | None = None,
        *,
        num_threads: int | None = None,
    ) -> torch.Tensor:
        """Query rows over their sequences' cached K/V: query [R, H, D] -> [R, H, D].

        Row r attends to the first context_lens[r] tokens of sequence row_seqs[r] (its row of
        block_tables [S, max_blocks]; row r when row_seqs is None, a decode step). A prefill
        chunk of n tokens over c cached ones is n rows of one sequence with context lengths
        c+1 .. c+n: causal attention, with the chunk's K/V already written to the cache.
        Consecutive rows like these share one walk over the K/V. A row's output does not depend
        on the other rows, the thread count or the schedule (bitwise).
        """
        _check_inputs(query, key_cache, value_cache, block_tables, context_lens, row_seqs)
        rows, heads, head_dim = query.shape
        num_blocks, block_size, kv_heads, _ = key_cache.shape
        out = torch.empty_like(query)
        status: int = self._fn(
            query.data_ptr(),
            key_cache.data_ptr(),
            value_cache.data_ptr(),
            block_tables.data_ptr(),
            None if row_seqs is None else row_seqs.data_ptr(),
            context_lens.data_ptr(),
            out.data_ptr(),
            rows,
            block_tables.shape[0],
            heads,
            kv_heads,
            head_dim,
            num_blocks,
            block_size,
            block_tables.shape[1],
            1.0 / math.sqrt(head_dim),
            torch.get_num_threads() if num_threads is None else num_threads,
        )
        if status:
            raise IndexError(f"paged attention kernel: {_ERRORS.get(status, f'status {status}')}")
        return out


def _check_inputs(
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    block_tables: torch.Tensor,
    context_lens: torch.Tensor,
    row_seqs: torch.Tensor | None,
) -> None:
    named = {
        "query": query,
        "key_cache": key_cache,
        "value_cache": value_cache,
        "block_tables": block_tables,
        "context_lens": context_lens,
    }
    if row_seqs is not None:
        named["row_seqs"] = row_seqs
    for name, t in named.items():
        want = torch.float32 if name in ("query", "key_cache", "value_cache") else torch.int64
        if t.device.type != "cpu" or t.dtype != want or not t.is_contiguous():
            raise ValueError(
                f"{name} must be a contiguous CPU {want} tensor, got {t.dtype} on {t.device} "
                f"(contiguous: {t.is_contiguous()})"
            )
    rows, heads, head_dim = query.shape
    if key_cache.dim() != 4 or key_cache.shape != value_cache.shape:
        raise ValueError(f"key_cache {key_cache.shape} and value_cache {value_cache.shape} differ")
    kv_heads = key_cache.shape[2]
    if key_cache.shape[3] != head_dim or not 1 <= kv_heads <= heads or heads % kv_heads:
        raise ValueError(f"query {query.shape} does not fit a cache of shape {key_cache.shape}")
    seqs_ok = block_tables.shape[0] == rows if row_seqs is None else row_seqs.shape == (rows,)
    if block_tables.dim() != 2 or context_lens.shape != (rows,) or not seqs_ok:
        raise ValueError(
            f"block_tables {block_tables.shape} / context_lens {context_lens.shape} / row_seqs "
            f"{None if row_seqs is None else row_seqs.shape} for {rows} query rows"
        )


@dataclass(frozen=True, slots=True)
class CpuDecodeStatus:
    """The kernel, or None and why not."""

    kernel: CpuDecodeKernel | None
    reason: str | None = None  # set when kernel is None


@functools.cache
def load_cpu_decode() -> CpuDecodeStatus:
    """Compile (once per machine, cached on disk) and load the kernel, once per process."""
    if os.environ.get("KVSIM_CPU_KERNEL") == "0":
        return CpuDecodeStatus(None, "disabled by KVSIM_CPU_KERNEL=0")
    compiler = _find_compiler()
    if compiler is None:
        return CpuDecodeStatus(None, "no C compiler found ($CC, cc, gcc or clang)")
    source = importlib.resources.files("engine").joinpath(SOURCE).read_bytes()
    key = hashlib.sha256(
        b"\0".join([source, " ".join(FLAGS).encode(), *_compiler_identity(compiler), _machine()])
    ).hexdigest()[:16]
    folder = _cache_dir()
    path = folder / f"paged_decode-{key}.so"
    if not path.exists():
        try:
            folder.mkdir(parents=True, exist_ok=True)
            failure = _compile(compiler, source, path)
        except OSError as exc:  # unwritable cache folder, full disk
            return CpuDecodeStatus(None, f"cannot write the kernel in {folder}: {exc}")
        if failure is not None:
            return CpuDecodeStatus(None, failure)
    return CpuDecodeStatus(CpuDecodeKernel(ctypes.CDLL(str(path)), path))


def _find_compiler() -> list[str] | None:
    """$CC if set and found, else the first of cc, gcc, clang on PATH: [executable, *args]."""
    candidates = [shlex.split(os.environ.get("CC", "")), ["cc"], ["gcc"], ["clang"]]
    for command in candidates:
        found = shutil.which(command[0]) if command else None
        if found is not None:
            return [found, *command[1:]]
    return None


def _compiler_identity(compiler: list[str]) -> list[bytes]:
    """The command and its --version output (empty if that fails: the build will say why)."""
    try:
        version = subprocess.run(
            [*compiler, "--version"], capture_output=True, timeout=60, check=False
        ).stdout
    except (OSError, subprocess.TimeoutExpired):
        version = b""
    return [" ".join(compiler).encode(), version]


def _machine() -> bytes:
    """What -march=native depends on: the CPU's architecture and, on Linux, its feature flags."""
    parts = [platform.system(), platform.machine(), platform.processor()]
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists():
        lines = cpuinfo.read_text(errors="replace").splitlines()
        for prefix in ("model name", "flags"):
            parts.append(next((line for line in lines if line.startswith(prefix)), ""))
    return "\n".join(parts).encode()


def _cache_dir() -> Path:
    if "KVSIM_CACHE_DIR" in os.environ:
        return Path(os.environ["KVSIM_CACHE_DIR"])
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "kvsim"


def _compile(compiler: list[str], source: bytes, path: Path) -> str | None:
    """Build `source` into `path` (atomically); returns why it failed, or None."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.stem}-", suffix=".so", dir=path.parent)
    os.close(fd)
    try:
        failure = _run_compiler([*compiler, *FLAGS, "-x", "c", "-", "-o", tmp, "-lm"], source)
        if failure is None:
            os.replace(tmp, path)
        return failure
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def _run_compiler(command: list[str], source: bytes) -> str | None:
    """Compile `source` (fed on stdin); returns why it failed, or None."""
    try:
        result = subprocess.run(
            command, input=source, capture_output=True, timeout=COMPILE_TIMEOUT_S, check=False
        )
    except subprocess.TimeoutExpired:
        return f"{shlex.join(command)} took over {COMPILE_TIMEOUT_S} s"
    except OSError as exc:  # say, $CC names a file that is not a program
        return f"{shlex.join(command)} could not run: {exc}"
    if result.returncode == 0:
        return None
    stderr = result.stderr.decode(errors="replace").strip().splitlines()
    return f"{shlex.join(command)} failed (exit {result.returncode}): {' | '.join(stderr[-5:])}"
