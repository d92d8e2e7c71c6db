"""Issue 47 item 3, corpora: a --data-path pair is read as types (llm_training.corpus) before megatron-core reads it;
a truncated or mismatched pair, or one too small for a sample, is an error naming the file (exit 65)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from jpwr.errors import ExitCode, FormatError
from llm_training.cli import main
from llm_training.corpus import check_corpus, read_corpus_index
from tests.llm_training.test_preprocess import DOCUMENTS, _read_back, preprocessed_dataset

TINY_SEQ_LENGTH = 64  # the tiny preset's sequence length (llm_training.presets)


@pytest.fixture(scope="module")
def dataset(tmp_path_factory) -> Path:
    return preprocessed_dataset(tmp_path_factory.mktemp("corpus"))


def _copy(prefix: Path, target: Path) -> Path:
    target.mkdir(parents=True, exist_ok=True)
    for suffix in (".bin", ".idx"):
        shutil.copyfile(f"{prefix}{suffix}", target / f"c{suffix}")
    return target / "c"


def test_a_preprocessed_corpus_reads_as_megatron_reads_it(dataset) -> None:
    corpus = read_corpus_index(str(dataset))
    documents = _read_back(dataset)
    assert corpus.sequences == corpus.documents == len(documents) == len(DOCUMENTS) * 10
    assert corpus.tokens == sum(len(d) for d in documents) and corpus.token_bytes == 2  # uint16: vocab 400
    assert check_corpus(str(dataset), TINY_SEQ_LENGTH, 400) == corpus


@pytest.mark.parametrize(("damage", "named"), [
    (lambda p: Path(f"{p}.idx").write_bytes(Path(f"{p}.idx").read_bytes()[:60]), ".idx is truncated: 60 bytes"),
    (lambda p: Path(f"{p}.idx").write_bytes(b"not a megatron index"), ".idx is not a megatron indexed-dataset index"),
    (lambda p: Path(f"{p}.bin").write_bytes(Path(f"{p}.bin").read_bytes()[:-2]), "the pair does not belong together"),
])
def test_a_damaged_pair_is_refused_naming_the_file(dataset, tmp_path, damage, named) -> None:
    prefix = _copy(dataset, tmp_path)
    damage(prefix)
    with pytest.raises(FormatError, match=named) as refused:
        read_corpus_index(str(prefix))
    assert str(prefix) in refused.value.problem


def test_a_corpus_smaller_than_one_sample_is_refused(dataset) -> None:
    tokens = read_corpus_index(str(dataset)).tokens
    with pytest.raises(FormatError, match=f"holds {tokens} tokens in .* fewer than one training sample of "
                                          f"--seq-length {tokens}"):
        check_corpus(str(dataset), tokens, 400)


def test_validate_exits_65_naming_a_truncated_index(dataset, tmp_path, capsys) -> None:
    prefix = _copy(dataset, tmp_path)
    Path(f"{prefix}.idx").write_bytes(Path(f"{prefix}.idx").read_bytes()[:60])
    code = main(["validate", "--model", "tiny", "--device", "cpu", "--vocab-size", "400", "--data-path", str(prefix)])
    err = capsys.readouterr().err
    assert code == ExitCode.DATA and f"{prefix}.idx is truncated" in err and "Traceback" not in err


def test_validate_refuses_a_token_id_beyond_the_vocabulary_naming_file_document_and_size(dataset, capsys) -> None:
    """Issue 61: a corpus written with a larger vocabulary than the model's validated OK, then the run ended FAILED
    with an IndexError in the embedding. The first such token's document is named (1-based, in the order
    preprocess wrote them), and the vocabulary's size."""
    documents = _read_back(dataset)
    largest = max(max(d) for d in documents)
    flat = [token for document in documents for token in document]
    position = flat.index(largest)
    document = next(i for i, d in enumerate(documents) if largest in d) + 1
    code = main(["validate", "--model", "tiny", "--device", "cpu", "--vocab-size", str(largest),
                 "--data-path", str(dataset)])
    err = capsys.readouterr().err
    assert code == ExitCode.DATA and "Traceback" not in err, err
    assert (f"{dataset}.bin: token id {largest} (token {position}, in document {document} of {len(documents)}) is "
            f"beyond the model's vocabulary of {largest} (ids 0 to {largest - 1})") in err
    assert "Fix: preprocess the corpus with the model's tokenizer" in err
    assert main(["validate", "--model", "tiny", "--device", "cpu", "--vocab-size", str(largest + 1),
                 "--data-path", str(dataset)]) == ExitCode.OK
