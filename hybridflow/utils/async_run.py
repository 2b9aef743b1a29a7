"""Running a coroutine to the end from synchronous code, whatever thread that code is on."""

from __future__ import annotations

import asyncio
import threading
from typing import Any


def run_coroutine(coro: Any) -> Any:
    """``asyncio.run(coro)``, also from a thread that already runs an event loop (e.g. a Ray actor)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coro)
    result: dict[str, Any] = {}

    def target() -> None:
        try:
            result["value"] = asyncio.run(coro)
        except BaseException as exc:  # noqa: BLE001 - re-raised in the caller
            result["error"] = exc

    thread = threading.Thread(target=target, name="hybridflow-coroutine")
    thread.start()
    thread.join()
    if "error" in result:
        raise result["error"]
    return result["value"]
