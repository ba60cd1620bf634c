"""Requests going into the engine and the records coming out.

``Request`` is what a client asks for; ``RequestRecord`` is what the engine measured. The engine keeps its
per-request bookkeeping on a subclass of the record (``sequence.Seq``) so finishing a request costs no copy.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass


class RequestRejected(ValueError):
    """The engine refuses a request at submission (prompt too long, does not fit the pool, ...)."""


@dataclass(slots=True)
class Request:
    """One generation request.

    prompt_tokens: context length. output_tokens: tokens it will actually generate (its EOS point).
    max_tokens: the max_new_tokens it asks for (what GUARANTEED_NO_EVICT reserves); default output_tokens.
    prefix_id / prefix_tokens: requests with the same ``prefix_id`` share their first ``prefix_tokens``
    prompt tokens (a system prompt, a conversation history), which block reuse can exploit.
    prompt_token_ids: alternatively the prompt's token ids (the HTTP server passes them); full blocks of
    equal ids are matched for reuse.
    """

    prompt_tokens: int
    output_tokens: int
    max_tokens: int | None = None
    arrival_s: float = 0.0
    request_id: Hashable | None = None
    prefix_id: Hashable | None = None
    prefix_tokens: int = 0
    prompt_token_ids: Sequence[int] | None = None

    def block_keys(self, tokens_per_block: int) -> list[Hashable]:
        """Content keys of the prompt's full blocks that could be shared (chained, like a radix-tree path)."""
        keys: list[Hashable] = []
        if self.prompt_token_ids is not None:
            ids = self.prompt_token_ids
            parent: Hashable = None
            for start in range(0, len(ids) - tokens_per_block + 1, tokens_per_block):
                parent = hash((parent, tuple(ids[start : start + tokens_per_block])))
                keys.append(parent)
        elif self.prefix_id is not None and self.prefix_tokens > 0:
            shared = min(self.prefix_tokens, self.prompt_tokens)
            keys = [(self.prefix_id, tokens_per_block, i) for i in range(shared // tokens_per_block)]
        return keys


def measured(value: float | None, what: str) -> float:
    """A time a finished record always has (``finished`` holds); None there would be an engine bookkeeping bug."""
    if value is None:
        raise ValueError(f"a finished request record has no {what}")
    return value


@dataclass(slots=True, eq=False)
class RequestRecord:
    """What happened to one request (times are simulated seconds)."""

    request_id: Hashable
    arrival_s: float
    prompt_tokens: int
    max_tokens: int
    target_output_tokens: int
    output_tokens: int = 0
    start_s: float | None = None  # first scheduled
    first_token_s: float | None = None
    finish_s: float | None = None
    num_pauses: int = 0
    reused_blocks: int = 0
    error: str | None = None

    @property
    def finished(self) -> bool:
        return self.finish_s is not None and self.error is None

    @property
    def ttft_s(self) -> float | None:
        return None if self.first_token_s is None else self.first_token_s - self.arrival_s

    @property
    def e2e_s(self) -> float | None:
        return None if self.finish_s is None else self.finish_s - self.arrival_s

    @property
    def tpot_s(self) -> float | None:
        """Mean time between output tokens after the first (0 for single-token outputs)."""
        if self.finish_s is None or self.first_token_s is None:
            return None
        if self.output_tokens <= 1:
            return 0.0
        return (self.finish_s - self.first_token_s) / (self.output_tokens - 1)

    def as_dict(self) -> dict:
        return {
            "requestId": self.request_id,
            "arrivalS": self.arrival_s,
            "promptTokens": self.prompt_tokens,
            "maxTokens": self.max_tokens,
            "outputTokens": self.output_tokens,
            "startS": self.start_s,
            "firstTokenS": self.first_token_s,
            "finishS": self.finish_s,
            "ttftS": self.ttft_s,
            "tpotS": self.tpot_s,
            "e2eS": self.e2e_s,
            "numPauses": self.num_pauses,
            "reusedBlocks": self.reused_blocks,
            "error": self.error,
        }
