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
    assert check_corpus(str(dataset), TINY_SEQ_LENGTH) == corpus


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
        check_corpus(str(dataset), tokens)


def test_validate_exits_65_naming_a_truncated_index(dataset, tmp_path, capsys) -> None:
    prefix = _copy(dataset, tmp_path)
    Path(f"{prefix}.idx").write_bytes(Path(f"{prefix}.idx").read_bytes()[:60])
    code = main(["validate", "--model", "tiny", "--device", "cpu", "--vocab-size", "400", "--data-path", str(prefix)])
    err = capsys.readouterr().err
    assert code == ExitCode.DATA and f"{prefix}.idx is truncated" in err and "Traceback" not in err
