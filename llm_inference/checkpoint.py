"""`save-checkpoint`: a preset with seeded random weights as a local transformers checkpoint for HTTP servers.

OpenAI-compatible servers (transformers serve, vLLM) load a checkpoint directory, not a preset, and take text,
not token ids. The directory written here has the preset's weights, a config with no end-of-sequence token (so
every request runs to max_tokens, as the in-process engines do) and a word-level tokenizer whose token id i is
the word `w{i}`: a prompt of known ids is written as text (prompt_text) and the server tokenizes it back to
exactly those ids, for completions and, through a chat template that only joins the contents, for chat.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from collections.abc import Sequence
from pathlib import Path

from jpwr import ValidationError
from llm_inference.presets import PRESETS, ModelPreset

WORD_FORM = "w{}"  # token id i <-> the word WORD_FORM.format(i)
UNKNOWN_ID = 0  # an unknown word, and padding, map to this id
# The messages' contents joined by one space; nothing added for the generation prompt. Content given as parts
# (what vLLM passes when a template iterates over content) is joined the same way.
CHAT_TEMPLATE = (
    "{% for message in messages %}{% if not loop.first %} {% endif %}"
    "{% if message.content is string %}{{ message.content }}"
    "{% else %}{{ message.content | selectattr('type', 'equalto', 'text') | map(attribute='text') | join(' ') }}"
    "{% endif %}{% endfor %}"
)


def prompt_text(ids: Sequence[int]) -> str:
    """The text that the checkpoint's tokenizer turns into exactly `ids` (for completions and chat alike)."""
    return " ".join(WORD_FORM.format(i) for i in ids)


def check_out(out: Path, force: bool) -> None:
    """Refuse to overwrite anything unless asked (`--force`); an empty directory is taken as it is."""
    if not out.exists():
        return
    if not out.is_dir():
        raise ValidationError(f"--out {str(out)!r} is a file, not a directory", "pass a new or empty directory path")
    if any(out.iterdir()) and not force:
        raise ValidationError(f"--out {str(out)!r} exists and is not empty",
                              "pass a new or empty directory, or add --force to replace its contents")


def save_tokenizer(shape: ModelPreset, directory: Path) -> None:
    """tokenizer.json (WordLevel over `w0`..`w{vocab-1}`, split on whitespace, no special tokens added) and a
    tokenizer_config.json naming PreTrainedTokenizerFast, which transformers 4 and 5 (and so vLLM) both load."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    unknown = WORD_FORM.format(UNKNOWN_ID)
    vocab = {WORD_FORM.format(i): i for i in range(shape.vocab_size)}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token=unknown))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer.save(str(directory / "tokenizer.json"))
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "unk_token": unknown, "pad_token": unknown,
              "clean_up_tokenization_spaces": False, "model_max_length": shape.max_positions,
              "chat_template": CHAT_TEMPLATE}
    (directory / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")


def save_model(shape: ModelPreset, directory: Path, precision: str, seed: int) -> int:
    """Seeded random weights (safetensors) with a greedy generation config and no BOS/EOS; returns the parameters."""
    import torch
    from transformers import GenerationConfig

    from llm_inference.engine import build_model

    model = build_model(shape, None, precision, "sdpa", torch.device("cpu"), seed)
    model.config.bos_token_id = model.config.eos_token_id = None
    model.config.pad_token_id = UNKNOWN_ID
    model.generation_config = GenerationConfig(do_sample=False, pad_token_id=UNKNOWN_ID)
    model.save_pretrained(directory)
    return sum(parameter.numel() for parameter in model.parameters())


def replace_directory(new: Path, out: Path) -> None:
    """Rename `new` onto `out`; an existing `out` (--force) is renamed aside first and removed only once `new` is in
    its place, so that a failure keeps the old checkpoint. A crash between the two renames leaves it under its
    hidden name `.<out>.<random>.old` beside `out`."""
    if not out.exists():
        new.rename(out)
        return
    aside = out.parent / f"{new.name}.old"
    out.rename(aside)
    try:
        new.rename(out)
    except BaseException:
        aside.rename(out)
        raise
    shutil.rmtree(aside, ignore_errors=True)


def save_checkpoint(preset: str, out: Path, precision: str, seed: int, force: bool) -> str:
    """Write the checkpoint into a temporary sibling of `out`, then move it into place; returns the summary line."""
    if preset not in PRESETS:
        raise ValidationError(f"unknown preset --preset {preset!r}", f"use one of {', '.join(PRESETS)}")
    check_out(out, force)
    shape = PRESETS[preset]
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        parameters = save_model(shape, staging, precision, seed)
        save_tokenizer(shape, staging)
        size = sum(path.stat().st_size for path in staging.iterdir())
        for path in staging.iterdir():  # mkdtemp and the safetensors writer make them owner-only: a server run as
            path.chmod(0o644)  # another user (a container's) could not read them
        staging.chmod(0o755)
        replace_directory(staging, out)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return f"{out} {preset} ({precision}, seed {seed}): {parameters:,} parameters, {size / 2**20:.1f} MiB on disk"
