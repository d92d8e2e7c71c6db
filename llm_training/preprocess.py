"""JSONL text -> Megatron .bin/.idx with a tokenizer the user provides (no downloads).

Like Megatron-LM's tools/preprocess_data.py with --append-eod: one document per JSON line, the
end-of-document token appended, written with megatron-core's IndexedDatasetBuilder. Tokenizers:
a `tokenizers` JSON file, or GPT-2 vocab.json + merges.txt (byte-level BPE, as GPT2BPETokenizer).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import numpy
from megatron.core.datasets.indexed_dataset import IndexedDatasetBuilder, get_bin_path, get_idx_path

from jpwr import FormatError, ValidationError
from jpwr.output import atomic_paths

if TYPE_CHECKING:
    from tokenizers import Tokenizer

EOD_CANDIDATES = ("<|endoftext|>", "</s>", "<eos>", "[SEP]")
JSONL_FIX = 'write one JSON object per line with the text as a string, e.g. {"text": "..."}'
TOKENIZER_FIX = ("give a tokenizer.json saved by the tokenizers library (Tokenizer.save), or the vocab.json and "
                 "merges.txt of a GPT-2 byte-level BPE (--vocab-file, --merges-file)")


def load_tokenizer(tokenizer_json: str | None, vocab_file: str | None, merges_file: str | None) -> Tokenizer:
    """A `tokenizers.Tokenizer` from a JSON file, or GPT-2 byte-level BPE from vocab + merges."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    if tokenizer_json:
        _require_file(tokenizer_json, "--tokenizer-json")
        try:
            return Tokenizer.from_file(tokenizer_json)
        except Exception as exc:  # the tokenizers library raises a bare Exception for a file it cannot read
            raise FormatError(f"--tokenizer-json {tokenizer_json!r} is not a tokenizer ({exc})",
                              TOKENIZER_FIX) from None
    if not (vocab_file and merges_file):
        raise ValidationError(
            "no tokenizer given", "pass --tokenizer-json FILE, or both --vocab-file and --merges-file (GPT-2 BPE)"
        )
    _require_file(vocab_file, "--vocab-file")
    _require_file(merges_file, "--merges-file")
    try:
        bpe = models.BPE.from_file(vocab_file, merges_file)
    except Exception as exc:  # as above
        raise FormatError(f"--vocab-file {vocab_file!r} and --merges-file {merges_file!r} are not a GPT-2 BPE "
                          f"vocabulary and its merges ({exc})", TOKENIZER_FIX) from None
    tokenizer = Tokenizer(bpe)
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


def documents(input_path: str, json_key: str) -> Iterator[str]:
    """The text of each non-blank JSONL line, read as types: a line that is not UTF-8 or not a JSON object, or whose
    `json_key` is missing or not a string, is an error naming the file and line. A file without any document is
    one too (an empty dataset fails training later, far from its cause)."""
    found = False
    with open(input_path, "rb") as handle:
        for number, raw in enumerate(handle, start=1):
            where = f"{input_path} line {number}"
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise FormatError(f"{where} is not UTF-8 text ({exc.reason} at byte {exc.start})",
                                  "save the file as UTF-8") from None
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as exc:
                raise FormatError(f"{where} is not JSON ({exc.msg} at column {exc.colno})", JSONL_FIX) from None
            if not isinstance(record, dict):
                raise FormatError(f"{where} is a JSON {_json_type(record)}, not an object", JSONL_FIX)
            if json_key not in record:
                raise ValidationError(f"{where} has no key {json_key!r} (keys: {', '.join(record)})",
                                      "pass --json-key with the field that holds the text")
            text = record[json_key]
            if not isinstance(text, str):
                raise FormatError(f"{where}: {json_key!r} is a JSON {_json_type(text)} ({json.dumps(text)[:40]}), "
                                  "not a string", JSONL_FIX)
            found = True
            yield text
    if not found:
        raise FormatError(f"--input {input_path!r} holds no document (only blank lines, or none)", JSONL_FIX)


def _json_type(value: object) -> str:
    """A parsed JSON value's type as JSON names it."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    return {int: "number", float: "number", str: "string", list: "array", dict: "object"}[type(value)]


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
    count = tokens = 0
    with atomic_paths(get_bin_path(output_prefix), get_idx_path(output_prefix)) as (bin_path, idx):
        builder = IndexedDatasetBuilder(str(bin_path), dtype=dtype)
        with builder.data_file:  # closed on a failure too
            for text in documents(input_path, json_key):
                ids = [*tokenizer.encode(text).ids, eod]
                builder.add_document(ids, [len(ids)])
                count += 1
                tokens += len(ids)
        builder.finalize(str(idx))
    return {"documents": count, "tokens": tokens, "vocab_size": vocab, "eod_token": eod}
