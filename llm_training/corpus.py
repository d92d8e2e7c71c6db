"""The training corpus (--data-path PREFIX: PREFIX.idx and PREFIX.bin, megatron-core's indexed dataset, as
`llm_training preprocess` writes it) read as types: its header, its counts and its sizes, by `validate` (the JUBE
login-node step) and where `train` builds the dataset.

Why: megatron-core reads the pair deep inside its dataset builder; a truncated index, a .bin cut short by a full
disk or a corpus with fewer tokens than one training sample ends there in an assertion or an IndexError. Read here,
each is an error naming the file and the fix (exit 65; in `train`, a FAILED record saying so).

Index layout (megatron.core.datasets.indexed_dataset): b"MMIDIDX\\x00\\x00", version <Q (1), dtype code <B,
sequence count <Q, document boundary count <Q (documents + 1), then int32 sequence lengths, int64 sequence
pointers, int64 document boundaries (and, for multimodal data, int8 modes). The .bin holds the tokens, each of the
dtype's size.
"""

from __future__ import annotations

import dataclasses
import struct
from pathlib import Path

import numpy

from jpwr import FormatError

INDEX_HEADER = b"MMIDIDX\x00\x00"
INDEX_VERSION = 1
# megatron's DType codes -> the tokens' numpy type (uint8, int8, int16, int32, int64, float64, float32, uint16)
DTYPES = {1: "<u1", 2: "<i1", 3: "<i2", 4: "<i4", 5: "<i8", 6: "<f8", 7: "<f4", 8: "<u2"}
DTYPE_SIZES = {code: numpy.dtype(dtype).itemsize for code, dtype in DTYPES.items()}
SCAN_TOKENS = 1 << 24  # tokens read at a time when looking for an id beyond the vocabulary (64 MiB of int32)
FIX = "rebuild the pair with `python -m llm_training preprocess --input DOCS.jsonl --output-prefix PREFIX ...`"


@dataclasses.dataclass(frozen=True)
class CorpusIndex:
    sequences: int
    documents: int
    tokens: int
    token_bytes: int
    dtype_code: int = 4


def read_corpus_index(prefix: str) -> CorpusIndex:
    """PREFIX.idx read and checked against PREFIX.bin (see the module docstring); a FormatError naming the file."""
    idx, bin_path = Path(prefix + ".idx"), Path(prefix + ".bin")
    data = idx.read_bytes()
    fixed = len(INDEX_HEADER) + 8 + 1 + 8 + 8
    if len(data) < fixed or not data.startswith(INDEX_HEADER):
        raise FormatError(f"{idx} is not a megatron indexed-dataset index (no MMIDIDX header, or truncated at "
                          f"{len(data)} bytes)", FIX)
    version, code, sequences, boundaries = struct.unpack_from("<QBQQ", data, len(INDEX_HEADER))
    if version != INDEX_VERSION or code not in DTYPE_SIZES:
        raise FormatError(f"{idx}: index version {version}, dtype code {code} (this reader knows version "
                          f"{INDEX_VERSION}, codes {sorted(DTYPE_SIZES)})", FIX)
    needed = fixed + 4 * sequences + 8 * sequences + 8 * boundaries
    if len(data) < needed:
        raise FormatError(f"{idx} is truncated: {len(data)} bytes, its {sequences} sequences and {boundaries} "
                          f"document boundaries need {needed}", FIX)
    lengths = numpy.frombuffer(data, dtype="<i4", count=sequences, offset=fixed)
    if (lengths < 0).any():
        raise FormatError(f"{idx}: a sequence has a negative length", FIX)
    tokens, item = int(lengths.sum()), DTYPE_SIZES[code]
    size = bin_path.stat().st_size
    if size != tokens * item:
        raise FormatError(f"{bin_path} holds {size} bytes, its index {idx} {tokens} tokens of {item} bytes "
                          f"({tokens * item} bytes): the pair does not belong together, or one is truncated", FIX)
    return CorpusIndex(sequences, max(boundaries - 1, 0), tokens, item, code)  # the boundaries start with 0


def check_corpus(prefix: str, seq_length: int, vocab_size: int) -> CorpusIndex:
    """The corpus read, large enough for one training sample (seq_length + 1 tokens: inputs and labels), and every
    token id inside the model's vocabulary (an id beyond it ends the run in the embedding, an IndexError)."""
    corpus = read_corpus_index(prefix)
    if corpus.tokens < seq_length + 1:
        raise FormatError(f"--data-path {prefix!r} holds {corpus.tokens} tokens in {corpus.documents} documents, "
                          f"fewer than one training sample of --seq-length {seq_length} + 1",
                          f"preprocess more text into the corpus, or train with a shorter --seq-length (below "
                          f"{max(corpus.tokens, 1)})")
    beyond = first_token_beyond(prefix, corpus, vocab_size)
    if beyond is not None:
        position, token = beyond
        raise FormatError(f"{prefix}.bin: token id {token:g} (token {position}, in document "
                          f"{document_of(prefix, corpus, position) + 1} of {corpus.documents}) is beyond the model's "
                          f"vocabulary of {vocab_size} (ids 0 to {vocab_size - 1})",
                          "preprocess the corpus with the model's tokenizer, or pass the tokenizer's --vocab-size")
    return corpus


def first_token_beyond(prefix: str, corpus: CorpusIndex, vocab_size: int) -> tuple[int, float] | None:
    """(position, id) of the corpus's first token outside 0 .. vocab_size - 1 (or not whole), read in chunks; None
    when every token is inside."""
    tokens = numpy.memmap(prefix + ".bin", dtype=DTYPES[corpus.dtype_code], mode="r", shape=(corpus.tokens,))
    for start in range(0, corpus.tokens, SCAN_TOKENS):
        chunk = numpy.asarray(tokens[start:start + SCAN_TOKENS])
        bad = (chunk < 0) | (chunk >= vocab_size) | (chunk != numpy.floor(chunk))
        if bad.any():
            offset = int(numpy.argmax(bad))
            return start + offset, float(chunk[offset])
    return None


def document_of(prefix: str, corpus: CorpusIndex, position: int) -> int:
    """The document (0-based, in the order preprocess wrote them) that holds the corpus's token `position`."""
    data = Path(prefix + ".idx").read_bytes()
    fixed = len(INDEX_HEADER) + 8 + 1 + 8 + 8
    lengths = numpy.frombuffer(data, dtype="<i4", count=corpus.sequences, offset=fixed)
    boundaries = numpy.frombuffer(data, dtype="<i8", count=corpus.documents + 1,
                                  offset=fixed + 12 * corpus.sequences)  # after the lengths and the pointers
    sequence = int(numpy.searchsorted(numpy.cumsum(lengths, dtype=numpy.int64), position, side="right"))
    return int(numpy.searchsorted(boundaries, sequence, side="right")) - 1
