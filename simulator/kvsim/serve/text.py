"""Tokens without a tokenizer: the simulator only needs counts and stable ids.

Prompt text is split into words and punctuation (close to BPE counts for English text) and each piece gets a
stable id, so identical prompt prefixes give identical block keys and block reuse works across HTTP requests.
Chat messages add the few header tokens of a Llama-3 chat template. Generated text is filler words, one per
output token.
"""

from __future__ import annotations

import re
import zlib
from typing import Any

VOCAB = 128256
_PIECES = re.compile(r"\w+|[^\w\s]")
_FILLER = ("the", "engine", "batches", "requests", "in", "flight", "and", "pages", "its", "cache", "into", "blocks",
           "so", "memory", "never", "fragments", "while", "tokens", "stream", "out")


def tokenize(text: str) -> list[int]:
    return [zlib.crc32(piece.encode()) % VOCAB for piece in _PIECES.findall(text)]


def prompt_ids(prompt: Any) -> list[int]:
    """An OpenAI ``prompt``: a string, or a list of token ids (a batch of prompts is refused upstream)."""
    if isinstance(prompt, str):
        return [1] + tokenize(prompt)  # BOS
    if isinstance(prompt, list) and prompt and all(isinstance(t, int) and not isinstance(t, bool) and 0 <= t < VOCAB
                                                   for t in prompt):
        return list(prompt)
    raise ValueError(f"prompt must be a string or a non-empty list of token ids in [0, {VOCAB})")


def message_text(content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = []
        for i, part in enumerate(content):
            if not isinstance(part, dict):
                raise ValueError(f"content part {i} must be an object, got {type(part).__name__}")
            kind = part.get("type", "text")
            if not isinstance(kind, str):
                raise ValueError(f"content part {i}: type must be a string")
            if kind == "text" or "text" in part:
                text = part.get("text")
                if not isinstance(text, str):
                    raise ValueError(f"content part {i}: text must be a string, got {type(text).__name__}")
                texts.append(text)
        return " ".join(texts)
    raise ValueError("message content must be a string or a list of content parts")


def chat_ids(messages: Any) -> list[int]:
    """Token ids of chat ``messages`` rendered with Llama-3-style headers (BOS, 4 per message, 3 for the reply)."""
    if not isinstance(messages, list) or not messages:
        raise ValueError("messages must be a non-empty list")
    ids = [1]
    for message in messages:
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise ValueError("each message must be an object with a string role")
        ids += [2, zlib.crc32(str(message["role"]).encode()) % VOCAB, 3]
        ids += tokenize(message_text(message.get("content")))
        ids.append(4)
    return ids + [2, 5, 3]


def filler(start: int, count: int) -> str:
    """Text of output tokens ``start`` .. ``start + count - 1`` (one word and a space each)."""
    return "".join(_FILLER[i % len(_FILLER)] + " " for i in range(start, start + count))
