"""Continuous batching over the decoder's step API: requests join a running batch between steps.

The built-in sampler's :func:`~hybridflow.inference.generation.generate` runs one closed
batch from prefill to the last token. A server sees requests arrive at any time, each with its
own sampling settings and length, so :class:`ContinuousBatcher` drives the same decoder
(:class:`~hybridflow.inference.generation.Decoder`: ``prefill`` / ``decode`` /
``select_rows``) and the same token choice (:func:`~hybridflow.inference.sampling.sample_next`)
one step at a time::

    step():  waiting requests and room?  ──yes──▶ decode the running rows, prefill the new
                                                  prompts, splice the two caches (see below)
                                        ──no───▶ decode one token for every cache row
             sample a token per live row (rows grouped by their sampling settings)
             rows that hit a stop token / stop check / their max_new_tokens finish
             once ≥ 1/4 of the cache rows are finished, drop them from the cache

A failure that belongs to one request — its seed, its stop check, non-finite logits in its
rows, a sampling error in its group — fails that request alone: :meth:`step` reports it with
the exception in place of its outputs and the other requests go on. Only a failed forward
(shared by every row) raises out of :meth:`step`. :meth:`cancel` drops a request whose client
went away, waiting or running. What a request and a response are (:class:`GenRequest`,
:class:`SampleOutput`) lives in :mod:`hybridflow.inference.batcher_types`.

Joining splices: the running rows decode their next token as in any step, the new prompts are
prefilled into a cache of their own, and the decoder's ``join`` appends those rows to the
running cache, both right-aligned at the longer length (keys carry their RoPE positions, and the
validity mask moves with them). No running row is recomputed. A new prompt's longest prefix that
a cache row has already run — an agent's next turn extends its last turn's row, the ``n``
samples of a prompt and a shared system prompt repeat one another — is copied from that row
instead of run (``stats.reused_prefix_tokens``); finished rows therefore stay in the cache until
compaction drops them, as at any step. So an agent loop whose trajectories come back one by one
from their tool calls pays, per new turn, the prefill of what that turn added.
A decoder without ``join`` (the Hugging Face one, and so every image request) joins by
recompute: one batched prefill of every live row's prompt-and-response-so-far (counted in
``stats.recomputed_tokens``). Either way a request that arrives while a batch decodes waits at
most one step, and a single request decodes exactly as ``generate`` does (prefill, then one
decode step per token), so greedy output matches the sampler's token for token.

Positions count real tokens only (``clamp(cumsum(mask) − 1, 0)``), as in the RL dataset, so a
sequence gets the same positions whether it was prefilled once or re-prefilled after joining.

Images: a request with ``prompt_positions`` (:class:`GenRequest`) makes the prefill a vision-
language one (positions ``(3, rows, width)``, the image rows' pixels in row order, the decoder's
``prefill_multimodal``); the vision tower reruns at each join. Response positions continue past
the prompt's largest one, as in ``generate``. Rows are one sequence only when their image inputs
are one object too (the ``n`` rows of one request).
"""

from __future__ import annotations

import os
from collections import Counter, deque
from dataclasses import dataclass, field
from typing import Any

import torch

from hybridflow.engine.multimodal_inputs import concat_image_inputs
from hybridflow.inference.batcher_types import (
    FINISH_ABORT,
    FINISH_LENGTH,
    FINISH_STOP,
    BatcherStats,
    Finished,
    GenRequest,
    SampleOutput,
)
from hybridflow.inference.generation import Decoder
from hybridflow.inference.sampling import GenerationParams, sample_next, token_log_probs

_COMPACT_FRACTION = 4  # drop finished rows once they are ≥ 1/4 of the cache rows
_MIN_REUSED_PREFIX = 16  # shorter prefixes are run again rather than copied from another row
_FINISH_DROPPED = "dropped"  # a row of a failed or cancelled request (never reported to a client)


@dataclass
class _Row:
    """One response being generated (a cache row while it is live)."""

    handle: int
    request: GenRequest
    generator: torch.Generator | None
    out: SampleOutput = field(default_factory=SampleOutput)
    index: int = 0  # which of the request's n responses

    @property
    def done(self) -> bool:
        return self.out.finish_reason is not None

    def sequence(self) -> list[int]:
        return list(self.request.prompt_ids) + self.out.token_ids

    def remaining(self) -> int:
        return self.request.params.max_new_tokens - len(self.out.token_ids)


class ContinuousBatcher:
    """Step-driven scheduler: :meth:`submit` requests at any time, call :meth:`step` repeatedly.

    Single-threaded by design (a server runs it on one engine thread). ``max_rows`` bounds the
    rows of one forward; a request is admitted whole (all its ``n`` rows) when it fits.
    ``generator`` is used by requests without a seed; ``device`` is where the decoder's
    model lives (prompt tensors and per-request generators are made there).

    **Fair admission.** Requests are admitted by group (:attr:`GenRequest.group`, one client
    call): the waiting group that holds the fewest running rows goes first (the longest waiting
    among equals), so a group that arrives while another runs is admitted before the running
    group's next request. ``max_rows_per_group`` caps the rows one group holds while it already
    has rows running (a group with none may always start one request, however large), so one
    call of many prompts cannot fill every row: with the cap at half of ``max_rows``, a request
    of another call that fits in the other half starts at the next step. Within a group the
    order is first come, first served. When the chosen request does not fit, nothing behind it
    is admitted ahead of it (no request starves).
    """

    def __init__(
        self,
        decoder: Decoder,
        pad_token_id: int,
        *,
        max_rows: int = 64,
        generator: torch.Generator | None = None,
        device: torch.device | str = "cpu",
        max_rows_per_group: int | None = None,
    ) -> None:
        if max_rows < 1:
            raise ValueError(f"max_rows must be >= 1, got {max_rows}")
        if max_rows_per_group is not None and max_rows_per_group < 1:
            raise ValueError(f"max_rows_per_group must be >= 1 (or None: no cap), got {max_rows_per_group}")
        self.decoder = decoder
        self.device = torch.device(device)
        self.pad_token_id = int(pad_token_id)
        self.max_rows = max_rows
        self.max_rows_per_group = max_rows_per_group
        self.generator = generator
        self.stats = BatcherStats()
        self._waiting: deque[tuple[int, GenRequest]] = deque()
        self._rows: list[_Row] = []  # cache row i ↔ self._rows[i] (finished rows stay until compaction)
        self._pending: dict[int, list[_Row]] = {}  # handle → its rows, until all are done
        self._next_handle = 0

    # ---- queue -------------------------------------------------------------------------------
    def submit(self, request: GenRequest) -> int:
        """Queue a request; returns its handle (reported by :meth:`step` when it finishes)."""
        if request.params.n > self.max_rows:
            raise ValueError(f"n={request.params.n} exceeds the batch limit of {self.max_rows} rows")
        handle = self._next_handle
        self._next_handle += 1
        self._waiting.append((handle, request))
        return handle

    @property
    def idle(self) -> bool:
        """Nothing waiting and nothing running."""
        return not self._waiting and not self._pending

    @property
    def num_waiting(self) -> int:
        return len(self._waiting)

    @property
    def num_running(self) -> int:
        """Admitted requests not yet finished."""
        return len(self._pending)

    def abort_running(self) -> list[int]:
        """Forget the admitted requests (after a failed step); returns their handles.

        Waiting requests stay queued: they were not part of the forward that failed.
        """
        handles = sorted(self._pending)
        self._rows = []
        self._pending = {}
        self.decoder.release()
        return handles

    def abort_all(self) -> list[tuple[int, list[SampleOutput]]]:
        """End every request now, waiting or running: each gets its outputs with the tokens
        sampled so far (none for a waiting one) and ``finish_reason="abort"`` on the rows that
        had not finished. Returns ``(handle, outputs)`` per request; the batcher is idle after."""
        aborted: list[tuple[int, list[SampleOutput]]] = []
        for handle, request in self._waiting:
            aborted.append((handle, [SampleOutput(finish_reason=FINISH_ABORT) for _ in range(request.params.n)]))
        for handle, rows in sorted(self._pending.items()):
            for row in rows:
                if not row.done:
                    row.out.finish_reason = FINISH_ABORT
            aborted.append((handle, [row.out for row in rows]))
        self._waiting.clear()
        self._pending = {}
        self._rows = []
        self.decoder.release()
        self.stats.requests_aborted += len(aborted)
        return aborted

    def cancel(self, handle: int) -> bool:
        """Drop a waiting or running request (its client went away); False if it is not here.

        A running request's rows stop being sampled at once and leave the KV cache as soon as
        the finished rows are a quarter of it (at once, if that is already so); the other rows
        are untouched.
        """
        for index, (waiting, _) in enumerate(self._waiting):
            if waiting == handle:
                del self._waiting[index]
                self.stats.requests_cancelled += 1
                return True
        if self._drop(handle) is None:
            return False
        self.stats.requests_cancelled += 1
        self._maybe_compact()
        return True

    def _drop(self, handle: int) -> list[_Row] | None:
        """Remove a running request; its live rows become dead cache rows."""
        rows = self._pending.pop(handle, None)
        for row in rows or ():
            if not row.done:
                row.out.finish_reason = _FINISH_DROPPED
        return rows

    def _fail(self, handle: int, err: Exception) -> list[Finished]:
        if self._drop(handle) is None:
            return []  # already failed through another of its rows
        self.stats.requests_failed += 1
        return [(handle, err)]

    # ---- one step ----------------------------------------------------------------------------
    @torch.inference_mode()
    def step(self) -> list[Finished]:
        """Admit, run one forward, sample one token per live row; returns the requests that
        finished — ``(handle, outputs)`` — or failed alone — ``(handle, exception)``.

        Raises only when the forward itself fails; then every running request is lost (see
        :meth:`abort_running`).
        """
        before = self._rows
        admitted, finished = self._admit()
        if admitted and self._can_splice(before):
            logits = self._splice(before)
        elif admitted:
            logits = self._prefill(joined=any(not row.done and row.out.token_ids for row in self._rows))
        elif any(not row.done for row in self._rows):
            logits = self._decode(self._rows)
        else:
            return finished
        self._count_forward()
        finished += self._sample(logits)
        self._maybe_compact()
        return finished

    def _admit(self) -> tuple[bool, list[Finished]]:
        live = [row for row in self._rows if not row.done]
        held = Counter(_group_key(row.handle, row.request) for row in live)
        admitted = False
        failed: list[Finished] = []
        while (index := self._next_waiting(held, len(live))) is not None:
            handle, request = self._waiting[index]
            del self._waiting[index]
            held[_group_key(handle, request)] += request.params.n
            generator = self.generator
            if request.seed is not None:
                try:
                    generator = torch.Generator(device=self.device).manual_seed(request.seed)
                except (RuntimeError, OverflowError) as err:  # GenRequest checks the range; belt and braces
                    self.stats.requests_failed += 1
                    failed.append((handle, ValueError(f"seed {request.seed} is not usable: {err}")))
                    continue
            rows = [_Row(handle, request, generator, index=i) for i in range(request.params.n)]
            self._pending[handle] = rows
            live += rows
            admitted = True
        if admitted:
            self._rows = live
        return admitted, failed

    def _next_waiting(self, held: Counter, live: int) -> int | None:
        """Index in the waiting queue of the request to admit next, or None (see the class doc):
        the first request of the group holding the fewest rows, if it fits."""
        best: tuple[int, int] | None = None  # (rows its group holds, queue index)
        seen: set[tuple[str, int]] = set()
        cap = self.max_rows_per_group
        for index, (handle, request) in enumerate(self._waiting):
            key = _group_key(handle, request)
            if key in seen:
                continue  # only a group's first waiting request is a candidate: in order within a group
            seen.add(key)
            rows = held[key]
            if cap is not None and rows and rows + request.params.n > cap:
                continue  # this group has its share running; the others go first
            if best is None or (rows, index) < best:
                best = (rows, index)
        if best is None:
            return None
        index = best[1]
        if live + self._waiting[index][1].params.n > self.max_rows:
            return None  # wait for room rather than let a smaller request overtake it
        return index

    def _can_splice(self, before: list[_Row]) -> bool:
        """Whether new requests can join the running rows without recomputing them: the
        decoder splices caches (``join``), some row is running, and no new row has images."""
        running = any(not row.done for row in before)
        new = self._rows[sum(not row.done for row in before) :]
        text_only = all(row.request.prompt_positions is None for row in new)
        return running and text_only and callable(getattr(self.decoder, "join", None))

    def _splice(self, before: list[_Row]) -> torch.Tensor:
        """Decode one token for the cache rows, then prefill the new prompts into cache rows
        after theirs (``decoder.join``), each reusing the longest prefix a cache row has already
        run. Finished rows stay until compaction drops them (an agent's next turn reuses its
        last one). Logits (rows, V) in ``self._rows`` order."""
        new = self._rows[sum(not row.done for row in before) :]
        logits = self._decode(before)
        ids, mask, which, firsts = self._distinct_sequences(new)
        positions = (mask.cumsum(dim=1) - 1).clamp(min=0)
        ran = [row.sequence()[: -1 if row.done else None] for row in before]  # a finished row never fed its last token
        prefixes = [_prefix_donor(ran, row.sequence()) for row in firsts]
        # This step's token is sampled from the logits, never fed back: remaining columns suffice.
        extra = max(row.remaining() for row in new + before if not row.done)
        join = self.decoder.join  # type: ignore[attr-defined]
        new_logits, reused = join(ids, mask, positions, extra, prefixes)
        if len(firsts) != len(which):
            index = list(range(len(before))) + [len(before) + w for w in which]
            self.decoder.select_rows(torch.tensor(index, dtype=torch.long, device=self.device))
        self._rows = before + new
        self.stats.prefills += 1
        self.stats.joins += 1
        self.stats.reused_prefix_tokens += reused
        return torch.cat([logits, new_logits[torch.tensor(which, dtype=torch.long, device=self.device)]])

    def _distinct_sequences(self, rows: list[_Row]) -> tuple[torch.Tensor, torch.Tensor, list[int], list[_Row]]:
        """The distinct sequences of ``rows`` (prompt ‖ tokens so far; same images), left-padded:
        ids and mask (U, width) on the device, each row's index among them, the first row of each."""
        sequences = [row.sequence() for row in rows]
        unique: dict[tuple[Any, ...], int] = {}
        firsts: list[_Row] = []
        which = []
        for row, seq in zip(rows, sequences, strict=True):
            which.append(unique.setdefault((tuple(seq), id(row.request.images)), len(unique)))
            firsts += [row] if len(firsts) < len(unique) else []
        width = max(len(seq) for seq in sequences)
        ids = torch.full((len(unique), width), self.pad_token_id, dtype=torch.long)
        mask = torch.zeros((len(unique), width), dtype=torch.long)
        for u, (seq, _) in enumerate(unique):
            ids[u, width - len(seq) :] = torch.tensor(seq, dtype=torch.long)
            mask[u, width - len(seq) :] = 1
        return ids.to(self.device), mask.to(self.device), which, firsts

    def _prefill(self, joined: bool) -> torch.Tensor:
        """Prefill every live row's full sequence (identical ones once); logits (rows, V)."""
        ids, mask, which, firsts = self._distinct_sequences(self._rows)
        width = ids.shape[1]
        # The last sampled token is never fed back, so width + remaining − 1 columns suffice.
        max_len = width + max(row.remaining() for row in self._rows) - 1
        if any(row.request.prompt_positions is not None for row in firsts):
            logits = self._prefill_multimodal(ids, mask, firsts, max_len)
        else:
            positions = (mask.cumsum(dim=1) - 1).clamp(min=0)
            logits = self.decoder.prefill(ids, mask, positions, max_len)
        fan_out = torch.tensor(which, dtype=torch.long, device=self.device)
        if len(firsts) != len(which):
            self.decoder.select_rows(fan_out)
            logits = logits[fan_out]
        self.stats.prefills += 1
        self.stats.joins += int(joined)
        self.stats.recomputed_tokens += sum(len(row.sequence()) for row in firsts if row.out.token_ids)
        return logits

    def _prefill_multimodal(
        self, ids: torch.Tensor, mask: torch.Tensor, firsts: list[_Row], max_len: int
    ) -> torch.Tensor:
        """The vision-language prefill of the distinct sequences (``firsts``: one row each):
        per-axis positions ``(3, U, width)`` (0 on padding) and the image rows' inputs."""
        prefill = getattr(self.decoder, "prefill_multimodal", None)
        if prefill is None:
            raise ValueError(
                f"{type(self.decoder).__name__} cannot take image inputs; vision-language models are served "
                "through the HF decoder (decoder='hf' or 'auto')"
            )
        width = ids.shape[1]
        positions = torch.zeros((3, len(firsts), width), dtype=torch.long)
        for u, row in enumerate(firsts):
            row_positions = row.request.positions_3d(len(row.out.token_ids))
            positions[:, u, width - row_positions.shape[1] :] = row_positions
        images = concat_image_inputs([row.request.images for row in firsts], self.device)
        return prefill(ids, mask, positions.to(self.device), max_len, images)

    def _decode(self, rows: list[_Row]) -> torch.Tensor:
        """Feed each row's last token (finished rows feed padding until they are dropped)."""
        tokens, positions = [], []
        for row in rows:
            tokens.append(row.out.token_ids[-1] if not row.done else self.pad_token_id)
            positions.append(len(row.request.prompt_ids) + len(row.out.token_ids) - 1 + row.request.position_shift())
        return self.decoder.decode(
            torch.tensor(tokens, dtype=torch.long, device=self.device),
            torch.tensor(positions, dtype=torch.long, device=self.device),
        )

    def _count_forward(self) -> None:
        stats = self.stats
        stats.forwards += 1
        stats.forward_rows[len(self._rows)] += 1
        stats.forward_requests[len({row.handle for row in self._rows if not row.done})] += 1

    def _sample(self, logits: torch.Tensor) -> list[Finished]:
        """One token for every live row, recorded; returns the requests that completed or failed."""
        groups: dict[tuple, list[int]] = {}
        for i, row in enumerate(self._rows):
            if not row.done:
                p = row.request.params
                key = (p.greedy, p.temperature, p.top_k, p.top_p, id(row.generator))
                groups.setdefault(key, []).append(i)
        finished: list[Finished] = []
        for index in groups.values():
            try:
                picks = self._pick(logits, index)
            except Exception:  # noqa: BLE001 - find which request of the group it belongs to
                picks = {}
                by_request: dict[int, list[int]] = {}
                for i in index:
                    by_request.setdefault(self._rows[i].handle, []).append(i)
                for handle, rows in by_request.items():
                    try:
                        picks.update(self._pick(logits, rows))
                    except Exception as err:  # noqa: BLE001 - this request's own failure
                        finished += self._fail(handle, err)
            for i, (token, log_prob, top) in picks.items():
                row = self._rows[i]
                if row.done:  # its request failed through another row
                    continue
                try:
                    done = self._record(row, token, log_prob, top)
                except Exception as err:  # noqa: BLE001 - e.g. the request's stop check raised
                    finished += self._fail(row.handle, err)
                    continue
                if done:
                    finished += self._finish(row.handle)
        return finished

    def _pick(self, logits: torch.Tensor, index: list[int]) -> dict[int, tuple[int, float, list[tuple[int, float]]]]:
        """Sample the cache rows ``index`` (same settings and generator): row → (token, log-prob, top)."""
        rows = [self._rows[i] for i in index]
        params, generator = rows[0].request.params, rows[0].generator
        group_logits = logits[torch.tensor(index, device=logits.device)]
        tokens, log_probs = sample_next(group_logits, params, generator)
        tops = _top_logprobs(group_logits, params, [row.request.top_logprobs for row in rows])
        return dict(zip(index, zip(tokens.tolist(), log_probs.tolist(), tops, strict=True), strict=True))

    def _record(self, row: _Row, token: int, log_prob: float, top: list[tuple[int, float]]) -> bool:
        """Append one token; returns True when this row just finished."""
        out, request = row.out, row.request
        out.token_ids.append(token)
        out.logprobs.append(log_prob)
        out.top_logprobs.append(top)
        self.stats.tokens_generated += 1
        if request.on_token is not None:
            request.on_token(row.index, token)
        params = request.params
        if not params.ignore_eos and token in params.stop_token_ids:
            out.finish_reason = FINISH_STOP
        elif request.stop_check is not None and request.stop_check(out.token_ids):
            out.finish_reason = FINISH_STOP
        elif len(out.token_ids) >= params.max_new_tokens:
            out.finish_reason = FINISH_LENGTH
        return out.finish_reason is not None

    def _finish(self, handle: int) -> list[Finished]:
        rows = self._pending[handle]
        if not all(row.done for row in rows):
            return []
        del self._pending[handle]
        self.stats.requests_finished += 1
        return [(handle, [row.out for row in rows])]

    def _maybe_compact(self) -> None:
        dead = sum(row.done for row in self._rows)
        if dead == len(self._rows):
            self._rows = []  # the next admission prefills a fresh cache
            return
        if dead and dead * _COMPACT_FRACTION >= len(self._rows):
            keep = [i for i, row in enumerate(self._rows) if not row.done]
            self.decoder.select_rows(torch.tensor(keep, dtype=torch.long, device=self.device))
            self._rows = [self._rows[i] for i in keep]


def _prefix_donor(ran: list[list[int]], sequence: list[int]) -> tuple[int | None, int]:
    """The cache row whose run tokens (``ran``, one list per row) cover the longest prefix of
    ``sequence``, and that prefix's length; ``(None, 0)`` when none reaches
    ``_MIN_REUSED_PREFIX``. The sequence keeps at least its last token to run (its logits come
    from it)."""
    wanted = sequence[:-1]
    lengths = [len(os.path.commonprefix([wanted, tokens])) for tokens in ran]
    best = max(range(len(ran)), key=lengths.__getitem__, default=None)
    if best is None or lengths[best] < _MIN_REUSED_PREFIX:
        return None, 0
    return best, lengths[best]


def _group_key(handle: int, request: GenRequest) -> tuple[str, int]:
    """Requests of one client call share a group; a request without one is its own."""
    return ("call", request.group) if request.group is not None else ("request", handle)


def _top_logprobs(logits: torch.Tensor, params: GenerationParams, ks: list[int]) -> list[list[tuple[int, float]]]:
    """The k most likely tokens per row, with log-probs computed exactly as the sampled token's
    (:func:`token_log_probs`, temperature 1 when greedy), so the two listings agree."""
    k_max = min(max(ks), logits.shape[-1])
    if k_max == 0:
        return [[] for _ in ks]
    temperature = 1.0 if params.greedy else params.temperature
    ids = logits.topk(k_max, dim=-1).indices  # log softmax is monotone: same order as the logits
    values = token_log_probs(logits.unsqueeze(1).expand(-1, k_max, -1), ids, temperature)
    ids_list, values_list = ids.tolist(), values.tolist()
    return [list(zip(ids_list[r][:k], values_list[r][:k], strict=True)) for r, k in enumerate(ks)]
