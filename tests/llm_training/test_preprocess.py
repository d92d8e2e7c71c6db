"""`preprocess`: JSONL -> .bin/.idx with a user tokenizer, read back with megatron's IndexedDataset."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from jpwr.errors import ExitCode
from llm_training.cli import main

DOCUMENTS = [
    "Energy per token is the figure of merit.",
    "Megatron writes tokens to a binary file and an index.",
    "Short.",
    "Über-long words, numbers 12345 and punctuation!?",
]


def _train_tokenizer(directory: Path):
    """A small byte-level BPE (GPT-2 style) trained here, saved as tokenizer.json and as vocab/merges."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=["<|endoftext|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tokenizer.train_from_iterator(DOCUMENTS * 20, trainer)
    tokenizer.save(str(directory / "tokenizer.json"))
    tokenizer.model.save(str(directory))  # vocab.json + merges.txt
    return tokenizer


def preprocessed_dataset(directory: Path) -> Path:
    """A real Megatron dataset (PREFIX.bin/.idx, vocab 400) written by the CLI from the documents; returns PREFIX."""
    from llm_training.cli import main

    _train_tokenizer(directory)
    corpus = directory / "corpus.jsonl"
    corpus.write_text("".join(json.dumps({"text": doc}) + "\n" for doc in DOCUMENTS * 10))
    prefix = directory / "data" / "corpus_text_document"
    assert main(["preprocess", "--input", str(corpus), "--output-prefix", str(prefix),
                 "--tokenizer-json", str(directory / "tokenizer.json")]) == 0
    return prefix


@pytest.fixture
def corpus(tmp_path: Path) -> Path:
    path = tmp_path / "corpus.jsonl"
    path.write_text("".join(json.dumps({"text": doc, "id": i}) + "\n" for i, doc in enumerate(DOCUMENTS)))
    return path


def _read_back(prefix: Path) -> list[list[int]]:
    from megatron.core.datasets.indexed_dataset import IndexedDataset

    dataset = IndexedDataset(str(prefix))
    return [dataset[i].tolist() for i in range(len(dataset))]


def test_round_trip_gives_the_tokenizer_ids_plus_end_of_document(tmp_path, corpus, capsys):
    tokenizer = _train_tokenizer(tmp_path)
    eod = tokenizer.token_to_id("<|endoftext|>")
    prefix = tmp_path / "out" / "corpus_text_document"
    code = main(["preprocess", "--input", str(corpus), "--output-prefix", str(prefix),
                 "--tokenizer-json", str(tmp_path / "tokenizer.json")])
    assert code == ExitCode.OK
    assert f"{len(DOCUMENTS)} documents" in capsys.readouterr().out
    expected = [[*tokenizer.encode(doc).ids, eod] for doc in DOCUMENTS]
    assert _read_back(prefix) == expected
    assert [tokenizer.decode(ids[:-1]) for ids in _read_back(prefix)] == DOCUMENTS


def test_gpt2_style_vocab_and_merges_give_the_same_ids(tmp_path, corpus):
    _train_tokenizer(tmp_path)
    json_prefix, bpe_prefix = tmp_path / "a", tmp_path / "b"
    assert main(["preprocess", "--input", str(corpus), "--output-prefix", str(json_prefix),
                 "--tokenizer-json", str(tmp_path / "tokenizer.json")]) == ExitCode.OK
    assert main(["preprocess", "--input", str(corpus), "--output-prefix", str(bpe_prefix),
                 "--vocab-file", str(tmp_path / "vocab.json"), "--merges-file", str(tmp_path / "merges.txt")]) == 0
    assert _read_back(bpe_prefix) == _read_back(json_prefix)


def test_preprocess_errors_name_the_problem(tmp_path, corpus, capsys):
    _train_tokenizer(tmp_path)
    cases = [
        (["--tokenizer-json", str(tmp_path / "missing.json")], "--tokenizer-json"),
        ([], "no tokenizer given"),
        (["--tokenizer-json", str(tmp_path / "tokenizer.json"), "--json-key", "content"], "has no key 'content'"),
        (["--tokenizer-json", str(tmp_path / "tokenizer.json"), "--eod-token", "<eos>"], "no end-of-document token"),
    ]
    for extra, message in cases:
        code = main(["preprocess", "--input", str(corpus), "--output-prefix", str(tmp_path / "x"), *extra])
        assert code == ExitCode.USAGE
        err = capsys.readouterr().err
        assert message in err and "Fix:" in err
    # the unknown key fails at the first line, when both temporary files exist already: none is left behind
    assert not [path.name for path in tmp_path.iterdir() if path.name.lstrip(".").startswith("x")]


@pytest.mark.parametrize(("content", "named"), [
    (b'{"text": "fine"}\n{"text": "cut off\n', "line 2 is not JSON"),
    (b'{"text": "fine"}\n\n["a", "list"]\n', "line 3 is a JSON array, not an object"),
    (b'{"text": 42}\n', "line 1: 'text' is a JSON number (42), not a string"),
    (b'{"text": "fine"}\n{"text": null}\n', "line 2: 'text' is a JSON null (null), not a string"),
    (b'{"text": ["a", "b"]}\n', "line 1: 'text' is a JSON array ([\"a\", \"b\"]), not a string"),
    (b'{"text": "fine"}\n{"text": "caf\xe9"}\n', "line 2 is not UTF-8 text"),
    (b"\n  \n", "holds no document"),
])
def test_malformed_jsonl_exits_65_naming_the_file_and_line(tmp_path, capsys, content, named):
    _train_tokenizer(tmp_path)
    bad = tmp_path / "bad.jsonl"
    bad.write_bytes(content)
    code = main(["preprocess", "--input", str(bad), "--output-prefix", str(tmp_path / "x"),
                 "--tokenizer-json", str(tmp_path / "tokenizer.json")])
    err = capsys.readouterr().err
    assert code == ExitCode.DATA, err
    assert str(bad) in err and named in err and "Fix:" in err and "internal error" not in err
    assert not [path.name for path in tmp_path.iterdir() if path.name.lstrip(".").startswith("x")]


@pytest.mark.parametrize("options", [["--tokenizer-json", "{corpus}"], ["--vocab-file", "{corpus}", "--merges-file",
                                                                         "{corpus}"]])
def test_a_file_that_is_not_a_tokenizer_exits_65_naming_it(tmp_path, corpus, capsys, options):
    given = [option.format(corpus=corpus) for option in options]
    code = main(["preprocess", "--input", str(corpus), "--output-prefix", str(tmp_path / "x"), *given])
    err = capsys.readouterr().err
    assert code == ExitCode.DATA, err
    assert f"{options[0]} {str(corpus)!r}" in err and "Fix:" in err and "tokenizer.json" in err
