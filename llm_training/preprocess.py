"""JSONL text -> Megatron .bin/.idx with a tokenizer the user provides (no downloads).

Like Megatron-LM's tools/preprocess_data.py with --append-eod: one document per JSON line, the
end-of-document token appended, written with megatron-core's IndexedDatasetBuilder. Tokenizers:
a `tokenizers` JSON file, or GPT-2 vocab.json + merges.txt (byte-level BPE, as GPT2BPETokenizer).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

import numpy
from megatron.core.datasets.indexed_dataset import IndexedDatasetBuilder, get_bin_path, get_idx_path

from jpwr import ValidationError
from jpwr.output import atomic_paths

if TYPE_CHECKING:
    from tokenizers import Tokenizer

EOD_CANDIDATES = ("<|endoftext|>", "</s>", "<eos>", "[SEP]")


def load_tokenizer(tokenizer_json: str | None, vocab_file: str | None, merges_file: str | None) -> Tokenizer:
    """A `tokenizers.Tokenizer` from a JSON file, or GPT-2 byte-level BPE from vocab + merges."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    if tokenizer_json:
        _require_file(tokenizer_json, "--tokenizer-json")
        return Tokenizer.from_file(tokenizer_json)
    if not (vocab_file and merges_file):
        raise ValidationError(
            "no tokenizer given", "pass --tokenizer-json FILE, or both --vocab-file and --merges-file (GPT-2 BPE)"
        )
    _require_file(vocab_file, "--vocab-file")
    _require_file(merges_file, "--merges-file")
    tokenizer = Tokenizer(models.BPE.from_file(vocab_file, merges_file))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    return tokenizer


def _require_file(path: str, option: str) -> None:
    if not Path(path).is_file():
        raise ValidationError(f"{option} {path!r} does not exist", f"give the path of an existing {option[2:]}")


def eod_token_id(tokenizer: Tokenizer, eod_token: str | None) -> int:
    """The id of the end-of-document token: the one named, else the first of EOD_CANDIDATES present."""
    names = (eod_token,) if eod_token else EOD_CANDIDATES
    for name in names:
        token_id = tokenizer.token_to_id(name)
        if token_id is not None:
            return int(token_id)
    raise ValidationError(
        f"the tokenizer has no end-of-document token {' / '.join(names)}",
        "pass --eod-token with a token the tokenizer knows",
    )


def preprocess(input_path: str, output_prefix: str, tokenizer: Tokenizer, json_key: str = "text",
               eod_token: str | None = None) -> dict[str, int]:
    """Tokenise every line's `json_key` and write PREFIX.bin/.idx; returns document and token counts.

    Both files are written under temporary names, flushed, then renamed, the index last: a failure (a bad line, a
    full disk) leaves no half-written pair, and an earlier pair under the same prefix stays as it was; only a crash
    between the two renames leaves a new .bin beside the old .idx (or beside none)."""
    _require_file(input_path, "--input")
    eod = eod_token_id(tokenizer, eod_token)
    vocab = tokenizer.get_vocab_size()
    dtype = numpy.uint16 if vocab < 65500 else numpy.int32  # Megatron's optimal index dtype
    documents = tokens = 0
    with atomic_paths(get_bin_path(output_prefix), get_idx_path(output_prefix)) as (bin_path, idx):
        builder = IndexedDatasetBuilder(str(bin_path), dtype=dtype)
        with builder.data_file, open(input_path, encoding="utf-8") as handle:  # closed on a failure too
            for line_number, line in enumerate(handle, start=1):
                if not line.strip():
                    continue
                record = json.loads(line)
                if json_key not in record:
                    raise ValidationError(
                        f"{input_path} line {line_number} has no key {json_key!r} (keys: {', '.join(record)})",
                        "pass --json-key with the field that holds the text",
                    )
                ids = [*tokenizer.encode(record[json_key]).ids, eod]
                builder.add_document(ids, [len(ids)])
                documents += 1
                tokens += len(ids)
        builder.finalize(str(idx))
    return {"documents": documents, "tokens": tokens, "vocab_size": vocab, "eod_token": eod}
