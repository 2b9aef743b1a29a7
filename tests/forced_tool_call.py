"""A token client that makes the tiny random model call a tool: it never writes a well-formed
call itself, so tests that need a tool turn force the first one."""

from __future__ import annotations

from typing import Any


class ForcedToolCall:
    """Each trajectory's first turn is ``call_text`` (then end of turn); its later turns come from
    the ``inner`` token client (the tiny model)."""

    def __init__(self, tokenizer: Any, inner: Any, call_text: str) -> None:
        self.call_ids = tokenizer.encode(call_text, add_special_tokens=False) + [tokenizer.eos_token_id]
        self.inner = inner
        self.turns: dict[str, int] = {}

    async def generate(self, request_id: str, prompt_ids: Any, sampling: Any, max_tokens: int) -> Any:
        from hybridflow.inference.protocol import TokenOutput

        turn = self.turns.get(request_id, 0)
        self.turns[request_id] = turn + 1
        if turn > 0:
            return await self.inner.generate(request_id, prompt_ids, sampling, max_tokens)
        ids = self.call_ids[:max_tokens]
        return TokenOutput(token_ids=ids, log_probs=[-0.5] * len(ids), stop_reason="completed", weight_version=0)
