"""``stream=true``: tokens from the engine thread to Server-Sent Events, text decoded as it grows.

Each :class:`~hybridflow.inference.batcher_types.GenRequest` gets an ``on_token`` callback that
hands ``(request, row, token)`` to the event loop; the request's future, once done, is handed
over the same way, after its last token. :class:`IncrementalText` turns one response's tokens
into text deltas: only text that cannot change is released — not a partial multi-byte
character (the decoder shows it as U+FFFD until its last byte arrives), and with stop strings
not the last ``len(longest stop) - 1`` characters, which a stop string may still claim. At the
end the rest of the final text — the same text a non-streamed reply has — is released, so the
deltas concatenate to exactly the non-streamed text.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
from collections.abc import AsyncIterator, Sequence
from concurrent.futures import Future
from typing import Any

from hybridflow.inference.batcher_types import GenRequest
from hybridflow.server.text import TextCodec, truncate_at_stop

logger = logging.getLogger("hybridflow.server")

_REPLACEMENT = "\ufffd"


class IncrementalText:
    """One response's text, decoded token by token (a small window, not the whole response)."""

    def __init__(self, codec: TextCodec, stops: Sequence[str] = ()) -> None:
        self.codec = codec
        self.stops = tuple(stops)
        self.hold = max((len(s) for s in self.stops), default=1) - 1
        self.ids: list[int] = []
        self.text = ""  # decoded so far (complete characters only)
        self.sent = ""  # released so far
        self._prefix = 0  # the window ids[_prefix:_read] is decoded already, for context
        self._read = 0

    def add(self, token: int) -> str:
        """Append ``token``; returns the newly released text (often empty)."""
        self.ids.append(token)
        before = self.codec.decode(self.ids[self._prefix : self._read])
        after = self.codec.decode(self.ids[self._prefix :])
        if len(after) > len(before) and not after.endswith(_REPLACEMENT):
            self.text += after[len(before) :]
            self._prefix, self._read = self._read, len(self.ids)
        visible, cut = truncate_at_stop(self.text, self.stops)
        if not cut and self.hold:
            visible = visible[: max(len(self.sent), len(visible) - self.hold)]
        return self._release(visible)

    def finish(self, final_text: str) -> str:
        """The rest of ``final_text`` (the reply's full text) not yet released."""
        if not final_text.startswith(self.sent):  # a tokenizer whose decode is not prefix-stable
            logger.warning("streamed text is not a prefix of the final text; the stream differs from the reply")
            return final_text[len(self.sent) :] if len(final_text) > len(self.sent) else ""
        return self._release(final_text)

    def _release(self, visible: str) -> str:
        if len(visible) <= len(self.sent):
            return ""
        delta = visible[len(self.sent) :]
        self.sent = visible
        return delta


def with_callbacks(
    requests: Sequence[GenRequest], loop: asyncio.AbstractEventLoop, queue: asyncio.Queue
) -> list[GenRequest]:
    """``requests`` whose tokens go to ``queue`` as ``(request index, row, token id)``."""

    def put(item: tuple) -> None:
        try:
            loop.call_soon_threadsafe(queue.put_nowait, item)
        except RuntimeError:  # the loop is closed: nobody is listening any more
            pass

    def callback(k: int):
        return lambda row, token: put((k, row, token))

    return [dataclasses.replace(r, on_token=callback(k)) for k, r in enumerate(requests)]


def watch_futures(futures: Sequence[Future], loop: asyncio.AbstractEventLoop, queue: asyncio.Queue) -> None:
    """Each future, once done, goes to ``queue`` as ``(request index, None, future)`` (after its tokens)."""
    for k, future in enumerate(futures):

        def done(f: Future, k: int = k) -> None:
            try:
                loop.call_soon_threadsafe(queue.put_nowait, (k, None, f))
            except RuntimeError:
                pass

        future.add_done_callback(done)


def sse(payload: dict[str, Any] | str) -> str:
    """One Server-Sent Event: ``data: <json>`` and a blank line."""
    data = payload if isinstance(payload, str) else json.dumps(payload, ensure_ascii=False)
    return f"data: {data}\n\n"


def stream_chunk(head: dict[str, Any], choice: dict[str, Any], include_usage: bool) -> str:
    """One chunk event of a streamed reply: ``head`` with one choice (and ``"usage": null`` when
    the client asked for usage, which then comes in a last chunk of its own)."""
    extra = {"usage": None} if include_usage else {}
    return sse({**head, "choices": [choice], **extra})


async def events(first: tuple, queue: asyncio.Queue, count: int) -> AsyncIterator[tuple]:
    """``first`` and then the queue's items until ``count`` futures are done."""
    item, done = first, 0
    while True:
        yield item
        if item[1] is None:
            done += 1
            if done == count:
                return
        item = await queue.get()
