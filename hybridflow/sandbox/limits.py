"""What one sandboxed run may use: :class:`SandboxLimits`."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class SandboxLimits:
    """Resource caps of one run. Every limit is enforced in every isolation level.

    * ``wall_s`` — wall-clock time; the run's processes are killed when it passes;
    * ``cpu_s`` — CPU seconds per process (``RLIMIT_CPU``; None = ``wall_s`` rounded up + 1);
    * ``memory_mb`` — address space per process (``RLIMIT_AS``);
    * ``max_processes`` — processes and threads the run may start (``RLIMIT_NPROC`` under a uid
      of its own; see docs/sandbox.md for when that holds);
    * ``max_output_bytes`` — stdout and stderr each; the run is stopped when either passes it;
    * ``max_file_bytes`` — the largest file the code may write (``RLIMIT_FSIZE``) and, under
      bubblewrap, the size of its private working directory.
    """

    wall_s: float = 10.0
    cpu_s: int | None = None
    memory_mb: int = 1024
    max_processes: int = 32
    max_output_bytes: int = 1 << 20
    max_file_bytes: int = 16 << 20

    def __post_init__(self) -> None:
        if not self.wall_s > 0:
            raise ValueError(f"wall_s must be > 0, got {self.wall_s}")
        if self.cpu_s is not None and self.cpu_s < 1:
            raise ValueError(f"cpu_s must be >= 1 or None, got {self.cpu_s}")
        if self.memory_mb < 32:
            raise ValueError(f"memory_mb must be >= 32 (an interpreter needs that much), got {self.memory_mb}")
        if self.max_processes < 1:
            raise ValueError(f"max_processes must be >= 1, got {self.max_processes}")
        if self.max_output_bytes < 1 or self.max_file_bytes < 1:
            raise ValueError("max_output_bytes and max_file_bytes must be >= 1")

    @property
    def cpu_seconds(self) -> int:
        return self.cpu_s if self.cpu_s is not None else int(self.wall_s) + 1
