"""`save-checkpoint`: the tiny preset as a checkpoint that transformers loads offline, with a word tokenizer whose
text prompts are exactly the intended ids (completion and chat) and generation that always runs to the limit."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

from jpwr.errors import ExitCode
from llm_inference.checkpoint import prompt_text, replace_directory
from llm_inference.cli import main
from llm_inference.presets import PRESETS

IDS = [5, 17, 3, 511, 0]


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("ckpt") / "tiny"
    assert main(["save-checkpoint", "--preset", "tiny", "--out", str(out), "--seed", "7"]) == ExitCode.OK
    return out


def test_prints_one_line_and_leaves_only_the_checkpoint(checkpoint, capsys):
    out = checkpoint.parent / "again"
    assert main(["save-checkpoint", "--preset", "tiny", "--out", str(out)]) == ExitCode.OK
    line = capsys.readouterr().out
    assert line.count("\n") == 1 and str(out) in line and "106,816 parameters" in line and "MiB on disk" in line
    assert sorted(p.name for p in checkpoint.parent.iterdir()) == ["again", "tiny"]  # no staging directory left


def test_loads_offline_and_generates_exactly_the_requested_tokens(checkpoint):
    script = ("import sys, torch; from transformers import AutoModelForCausalLM, AutoTokenizer; "
              "t = AutoTokenizer.from_pretrained(sys.argv[1]); m = AutoModelForCausalLM.from_pretrained(sys.argv[1]); "
              "ids = t('w5 w17 w3', return_tensors='pt').input_ids; "
              "print(ids.tolist(), m.generate(ids, max_new_tokens=9).shape[1])")
    done = subprocess.run([sys.executable, "-c", script, str(checkpoint)], capture_output=True, text=True,
                          env={**os.environ, "HF_HUB_OFFLINE": "1"}, timeout=120, check=True)
    assert done.stdout.split("\n")[0] == "[[5, 17, 3]] 12"


def test_tokenizer_maps_word_i_to_id_i_and_back(checkpoint):
    tokenizer = AutoTokenizer.from_pretrained(checkpoint)
    assert len(tokenizer) == PRESETS["tiny"].vocab_size
    assert prompt_text(IDS) == "w5 w17 w3 w511 w0"
    assert tokenizer(prompt_text(IDS)).input_ids == IDS  # no BOS/EOS added
    assert tokenizer.decode(IDS) == prompt_text(IDS)
    assert tokenizer("w5 hello w512").input_ids == [5, 0, 0]  # unknown words are w0
    assert tokenizer.unk_token == "w0" and tokenizer.pad_token_id == 0 and tokenizer.eos_token_id is None


def test_chat_template_is_the_contents_only(checkpoint):
    tokenizer = AutoTokenizer.from_pretrained(checkpoint)
    chat = tokenizer.apply_chat_template([{"role": "user", "content": prompt_text(IDS)}], add_generation_prompt=True,
                                         tokenize=True, return_dict=True)
    assert chat["input_ids"] == IDS
    parts = [{"role": "system", "content": "w1"},
             {"role": "user", "content": [{"type": "text", "text": "w2 w3"}, {"type": "text", "text": "w4"}]}]
    assert tokenizer.apply_chat_template(parts, add_generation_prompt=True, tokenize=False) == "w1 w2 w3 w4"


def test_no_end_of_sequence_token_anywhere(checkpoint):
    config = json.loads((checkpoint / "config.json").read_text())
    generation = json.loads((checkpoint / "generation_config.json").read_text())
    assert config["eos_token_id"] is None and generation.get("eos_token_id") is None
    assert generation["do_sample"] is False
    assert GenerationConfig.from_pretrained(checkpoint).eos_token_id is None
    model = AutoModelForCausalLM.from_pretrained(checkpoint)
    assert model.generation_config.eos_token_id is None and model.config.eos_token_id is None
    prompt = torch.tensor([IDS, IDS[::-1]])
    for new in (1, 23):
        assert model.generate(prompt, max_new_tokens=new).shape == (2, len(IDS) + new)


def test_non_empty_out_is_refused_unless_forced(tmp_path, capsys):
    out = tmp_path / "taken"
    out.mkdir()
    (out / "notes.txt").write_text("keep me")
    assert main(["save-checkpoint", "--preset", "tiny", "--out", str(out)]) == ExitCode.USAGE
    err = capsys.readouterr().err
    assert f"--out {str(out)!r} exists and is not empty" in err and "Fix:" in err and "--force" in err
    assert [p.name for p in out.iterdir()] == ["notes.txt"]
    assert main(["save-checkpoint", "--preset", "tiny", "--out", str(out), "--force"]) == ExitCode.OK
    assert not (out / "notes.txt").exists() and (out / "model.safetensors").is_file()
    assert [p.name for p in tmp_path.iterdir()] == ["taken"]


def test_a_swap_that_fails_keeps_the_old_checkpoint(tmp_path):
    """--force renames the old checkpoint aside before the new one takes its name, and back when that fails (here
    the new one has vanished)."""
    out = tmp_path / "ckpt"
    out.mkdir()
    (out / "model.safetensors").write_text("old weights")
    with pytest.raises(FileNotFoundError):
        replace_directory(tmp_path / ".ckpt.vanished", out)
    assert (out / "model.safetensors").read_text() == "old weights" and [p.name for p in tmp_path.iterdir()] == ["ckpt"]


def test_unknown_preset_is_refused(tmp_path, capsys):
    assert main(["save-checkpoint", "--preset", "llama-405b", "--out", str(tmp_path / "x")]) == ExitCode.USAGE
    assert "unknown preset --preset 'llama-405b'" in capsys.readouterr().err
    assert not (tmp_path / "x").exists()
