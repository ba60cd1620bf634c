"""What an engine refuses at submission: TensorRT-LLM's request checks against the engine's limits.

Why a module of its own: the checks are pure (a request's lengths against fixed limits) and carry
TensorRT-LLM's exact wording, which the server returns to clients; the engine only asks ``check``.
"""

from __future__ import annotations

from dataclasses import dataclass

from .config import EngineConfig
from .request import RequestRejected
from .sequence import ceil_div


@dataclass(frozen=True, slots=True)
class RequestLimits:
    """The limits a request is checked against, from a resolved config and the KV pool's size."""

    max_seq_len: int
    max_input_len: int
    max_num_tokens: int
    chunked: bool
    tokens_per_block: int
    num_blocks: int
    contiguous_blocks: int | None  # blocks every request reserves with a contiguous cache; None when paged

    def check(self, prompt: int, max_tokens: int) -> None:
        """RequestRejected with TensorRT-LLM's reason when the engine could never serve the request."""
        if prompt < 1 or max_tokens < 1:
            raise RequestRejected(f"prompt length ({prompt}) and max_tokens ({max_tokens}) must be >= 1")
        if prompt > self.max_input_len:
            raise RequestRejected(f"Prompt length ({prompt}) exceeds maximum input length ({self.max_input_len}).")
        if prompt + max_tokens > self.max_seq_len:
            raise RequestRejected(f"The sum of prompt length ({prompt}) and max_tokens ({max_tokens}) should not "
                                  f"exceed max_seq_len ({self.max_seq_len})")
        if not self.chunked and prompt > self.max_num_tokens:
            raise RequestRejected(f"Without enabling chunked context, the max context length ({prompt}) needs to be "
                                  f"less than or equal to the max number of tokens ({self.max_num_tokens}).")
        need = self.contiguous_blocks or ceil_div(prompt + max_tokens, self.tokens_per_block)
        if need > self.num_blocks:
            raise RequestRejected(f"request needs {need} KV blocks (prompt {prompt} + max_tokens {max_tokens}) but "
                                  f"the KV pool has {self.num_blocks}")


def resolved_limits(cfg: EngineConfig) -> tuple[int, int, int, int]:
    """max_seq_len, max_input_len, max_batch_size and max_num_tokens of a config ``resolved()`` filled in."""
    if cfg.max_seq_len is None or cfg.max_input_len is None or cfg.max_batch_size is None or cfg.max_num_tokens is None:
        raise ValueError("EngineConfig: the engine needs a resolved() config (every limit filled in)")
    return cfg.max_seq_len, cfg.max_input_len, cfg.max_batch_size, cfg.max_num_tokens
