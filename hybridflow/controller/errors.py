"""Errors a worker-group call raises on the controller, each naming the rank and the cause."""

from __future__ import annotations

__all__ = ["WorkerError", "WorkerDiedError", "WorkerTimeoutError"]


class WorkerError(RuntimeError):
    """A worker method raised.

    ``cause`` is the original exception when it could be carried back (else None);
    ``remote_traceback`` is the worker-side traceback text.
    """

    headline = "failed in"

    def __init__(
        self, rank: int, method: str, cause_text: str, remote_traceback: str = "", cause: BaseException | None = None
    ) -> None:
        self.rank = rank
        self.method = method
        self.cause_text = cause_text
        self.remote_traceback = remote_traceback
        self.cause = cause
        message = f"rank {rank} {self.headline} {method}: {cause_text}"
        if remote_traceback:
            message += f"\n--- traceback on rank {rank} ---\n{remote_traceback.rstrip()}"
        super().__init__(message)

    def __reduce__(self) -> tuple[type, tuple[object, ...]]:
        return (type(self), (self.rank, self.method, self.cause_text, self.remote_traceback, self.cause))

    def rank_label(self) -> str:
        """``"rank R failed in METHOD"``: where it happened, without the cause's text."""
        return f"rank {self.rank} {self.headline} {self.method}"


class WorkerDiedError(WorkerError):
    """The worker's process died (killed, out of memory, crashed) while or before running a call."""

    headline = "died (worker process lost) during"


class WorkerTimeoutError(WorkerError):
    """A call did not finish within the group's ``call_timeout_s``."""

    headline = "timed out in"
