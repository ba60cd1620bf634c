"""Write a small Hugging Face tokenizer (tokenizer.json + tokenizer_config.json) into a folder, offline.

Why: aiperf needs a tokenizer to build prompts of a given length and to count tokens; its "builtin" tokenizer
downloads tiktoken's encoding file, and the test machines only reach package registries. This word-level
tokenizer splits on words and punctuation, as kvsim's server counts tokens, so ISL/OSL agree on both sides.
Run with the interpreter that has ``tokenizers`` (aiperf's): ``python make_word_tokenizer.py OUT_DIR [CORPUS]``.
"""

from __future__ import annotations

import json
import re
import string
import sys
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers

FILLER = "the engine batches requests in flight and pages its cache into blocks so memory never fragments while " \
         "tokens stream out"


def main(out: str, corpus: str | None = None) -> None:
    text = FILLER + " " + (Path(corpus).read_text(errors="ignore") if corpus else "")
    words = sorted(set(re.findall(r"\w+|[^\w\s]", text)) | set(string.punctuation))
    vocab = {"[UNK]": 0, "<s>": 1, "</s>": 2}
    for word in words:
        vocab.setdefault(word, len(vocab))
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.decoder = decoders.WordPiece(prefix="##")  # joins words with spaces
    target = Path(out)
    target.mkdir(parents=True, exist_ok=True)
    tok.save(str(target / "tokenizer.json"))
    (target / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "unk_token": "[UNK]", "bos_token": "<s>", "eos_token": "</s>",
        "model_max_length": 131072}))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else None)
