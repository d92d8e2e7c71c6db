"""One tensor-parallel rank's weights, built or read directly on its device: random (seeded) or from a checkpoint.

Why not transformers' model and then a slice: a 70B model does not fit one GPU, and building it once per rank in
host memory would need N × 140 GB. Here each rank asks a weight source for its part of each tensor only
(llm_inference/tensor_parallel.py says which part), in the names and layouts of a transformers checkpoint:

* a checkpoint's safetensors files are read slice by slice (`get_slice`: only the rank's rows or columns leave the
  file, memory-mapped);
* random weights are drawn in blocks of BLOCK rows or columns, each block from its own generator seeded by
  (seed, tensor name, block index) on the rank's device, and the rank keeps the part of each block it holds: a
  weight has the same values at every tensor-parallel size, so TP=N and TP=1 runs of a preset compute the same
  tokens (the tests' check, and the GPU logits check of benchmarks/tp_logits_check.py). Matrices and embeddings
  are drawn as transformers initialises them (normal, std INIT_STD), norms as ones, biases as zeros.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any, Protocol

import torch
import torch.nn.functional as F

from llm_inference.compact_model import Affine, CompactModel, Layer, check_gpt2, llama_rope
from llm_inference.engine import hf_config
from llm_inference.presets import ModelPreset
from llm_inference.tensor_parallel import TensorParallel

BLOCK = 256  # rows or columns drawn per random generator
INIT_STD = 0.02  # transformers' initializer_range for Llama and GPT-2


class WeightSource(Protocol):
    def has(self, name: str) -> bool: ...

    def part(self, name: str, shape: tuple[int, ...], init: str, dim: int = 0,
             span: tuple[int, int] | None = None) -> torch.Tensor:
        """Indices span[0]..span[1] along `dim` of the tensor `name` of `shape` (span None: all of it), on the
        model's device and dtype; `init` ("normal", "ones", "zeros") says how a random source fills it."""
        ...


class RandomWeights:
    """Seeded random weights whose values do not depend on the part asked for (see the module docstring)."""

    def __init__(self, seed: int, device: torch.device, dtype: torch.dtype) -> None:
        self.seed, self.device, self.dtype = seed, device, dtype

    def has(self, name: str) -> bool:
        return True

    def part(self, name: str, shape: tuple[int, ...], init: str, dim: int = 0,
             span: tuple[int, int] | None = None) -> torch.Tensor:
        start, stop = span or (0, shape[dim])
        out_shape = list(shape)
        out_shape[dim] = stop - start
        if init != "normal":
            fill = torch.ones if init == "ones" else torch.zeros
            return fill(out_shape, dtype=self.dtype, device=self.device)
        out = torch.empty(out_shape, dtype=self.dtype, device=self.device)
        for block in range(start // BLOCK, (stop - 1) // BLOCK + 1):
            begin, end = block * BLOCK, min(shape[dim], (block + 1) * BLOCK)
            block_shape = list(shape)
            block_shape[dim] = end - begin
            generator = torch.Generator(device=self.device).manual_seed(self._block_seed(name, block))
            drawn = torch.randn(block_shape, generator=generator, device=self.device) * INIT_STD
            low, high = max(begin, start), min(end, stop)
            out.narrow(dim, low - start, high - low).copy_(drawn.narrow(dim, low - begin, high - low))
        return out

    def _block_seed(self, name: str, block: int) -> int:
        digest = hashlib.blake2b(f"{self.seed}/{name}/{block}".encode(), digest_size=8).digest()
        return int.from_bytes(digest, "big") & (2**63 - 1)


class CheckpointWeights:
    """A local transformers checkpoint's safetensors (one file or an index of several), read part by part."""

    def __init__(self, directory: str | Path, device: torch.device, dtype: torch.dtype) -> None:
        self.directory, self.device, self.dtype = Path(directory), device, dtype
        index = self.directory / "model.safetensors.index.json"
        if index.is_file():
            self.files: dict[str, str] = json.loads(index.read_text())["weight_map"]
        elif (self.directory / "model.safetensors").is_file():
            from safetensors import safe_open

            with safe_open(self.directory / "model.safetensors", framework="pt") as handle:
                self.files = dict.fromkeys(handle.keys(), "model.safetensors")
        else:
            raise ValueError(f"{self.directory} has no model.safetensors(.index.json): the tensor-parallel loader "
                             "reads safetensors only (save the checkpoint with safe_serialization, the default)")

    def has(self, name: str) -> bool:
        return name in self.files

    def part(self, name: str, shape: tuple[int, ...], init: str, dim: int = 0,
             span: tuple[int, int] | None = None) -> torch.Tensor:
        from safetensors import safe_open

        if name not in self.files:
            raise ValueError(f"checkpoint {self.directory} has no tensor {name!r}")
        with safe_open(self.directory / self.files[name], framework="pt") as handle:
            stored = handle.get_slice(name)
            if tuple(stored.get_shape()) != shape:
                raise ValueError(f"checkpoint tensor {name!r} has shape {tuple(stored.get_shape())}, its config says "
                                 f"{shape}")
            start, stop = span or (0, shape[dim])
            index = tuple(slice(start, stop) if axis == dim else slice(None) for axis in range(len(shape)))
            return stored[index].to(self.device, self.dtype)


def _span(tp: TensorParallel | None, total: int) -> tuple[int, int]:
    return (0, total) if tp is None else tp.span(total)


def _lm_head(source: WeightSource, name: str, embed: torch.Tensor, tied: bool, tp: TensorParallel | None
             ) -> torch.Tensor:
    """The rank's rows of the LM head (the embedding's when tied), zero-padded to an equal part per rank."""
    vocab, hidden = embed.shape
    if tp is None:
        return embed if tied else source.part(name, (vocab, hidden), "normal")
    start, stop, part = tp.padded_span(vocab)
    rows = embed[start:stop] if tied else source.part(name, (vocab, hidden), "normal", 0, (start, stop))
    return F.pad(rows, (0, 0, 0, part - (stop - start)))


def _llama(config: Any, source: WeightSource, tp: TensorParallel | None, device: torch.device) -> CompactModel:
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    if getattr(config, "attention_bias", False) or getattr(config, "mlp_bias", False):
        raise ValueError("Llama projections with biases are not covered by the tensor-parallel loader")
    inv_freq, rope_scale = llama_rope(config, LlamaRotaryEmbedding(config))  # built on the host: a few numbers
    hidden, heads, kv_heads = config.hidden_size, config.num_attention_heads, config.num_key_value_heads
    head_dim = getattr(config, "head_dim", None) or hidden // heads
    ffn, vocab = config.intermediate_size, config.vocab_size
    q0, q1 = (i * head_dim for i in _span(tp, heads))
    k0, k1 = (i * head_dim for i in _span(tp, kv_heads))
    columns = _span(tp, ffn)

    def layer(i: int) -> Layer:
        prefix = f"model.layers.{i}."
        attn, mlp = prefix + "self_attn.", prefix + "mlp."
        qkv = torch.cat([source.part(attn + "q_proj.weight", (heads * head_dim, hidden), "normal", 0, (q0, q1)),
                         source.part(attn + "k_proj.weight", (kv_heads * head_dim, hidden), "normal", 0, (k0, k1)),
                         source.part(attn + "v_proj.weight", (kv_heads * head_dim, hidden), "normal", 0, (k0, k1))])
        up = torch.cat([source.part(mlp + f"{name}_proj.weight", (ffn, hidden), "normal", 0, columns)
                        for name in ("gate", "up")])
        return Layer(
            norm1=Affine(source.part(prefix + "input_layernorm.weight", (hidden,), "ones")), qkv=Affine(qkv),
            out=Affine(source.part(attn + "o_proj.weight", (hidden, heads * head_dim), "normal", 1, (q0, q1))),
            norm2=Affine(source.part(prefix + "post_attention_layernorm.weight", (hidden,), "ones")), up=Affine(up),
            down=Affine(source.part(mlp + "down_proj.weight", (hidden, ffn), "normal", 1, columns)))

    embed = source.part("model.embed_tokens.weight", (vocab, hidden), "normal")
    lm_head = _lm_head(source, "lm_head.weight", embed, bool(config.tie_word_embeddings), tp)
    layers = tuple(layer(i) for i in range(config.num_hidden_layers))
    final_norm = Affine(source.part("model.norm.weight", (hidden,), "ones"))
    return CompactModel("llama", (q1 - q0) // head_dim, (k1 - k0) // head_dim, head_dim, config.rms_norm_eps, embed,
                        None, layers, final_norm, lm_head, inv_freq.to(device), rope_scale, tp)


def _gpt2(config: Any, source: WeightSource, tp: TensorParallel | None) -> CompactModel:
    """GPT-2's Conv1D weights are stored (in, out): the rank's columns of c_attn/c_fc, rows of the c_proj's; the
    output projections' biases are added once, by rank 0."""
    check_gpt2(config)
    base = "transformer." if source.has("transformer.wte.weight") else ""
    hidden, heads, vocab = config.n_embd, config.n_head, config.vocab_size
    ffn = config.n_inner or 4 * hidden
    a, b = (i * (hidden // heads) for i in _span(tp, heads))
    columns = _span(tp, ffn)
    first = tp is None or tp.rank == 0

    def norm(name: str) -> Affine:
        return Affine(source.part(name + ".weight", (hidden,), "ones"), source.part(name + ".bias", (hidden,), "zeros"))

    def layer(i: int) -> Layer:
        p = f"{base}h.{i}."
        thirds = [(a + k * hidden, b + k * hidden) for k in range(3)]
        qkv = torch.cat([source.part(p + "attn.c_attn.weight", (hidden, 3 * hidden), "normal", 1, s) for s in thirds],
                        dim=1)
        qkv_bias = torch.cat([source.part(p + "attn.c_attn.bias", (3 * hidden,), "zeros", 0, s) for s in thirds])
        return Layer(
            norm1=norm(p + "ln_1"), qkv=Affine(qkv.t().contiguous(), qkv_bias),
            out=Affine(source.part(p + "attn.c_proj.weight", (hidden, hidden), "normal", 0, (a, b)).t().contiguous(),
                       source.part(p + "attn.c_proj.bias", (hidden,), "zeros") if first else None),
            norm2=norm(p + "ln_2"),
            up=Affine(source.part(p + "mlp.c_fc.weight", (hidden, ffn), "normal", 1, columns).t().contiguous(),
                      source.part(p + "mlp.c_fc.bias", (ffn,), "zeros", 0, columns)),
            down=Affine(source.part(p + "mlp.c_proj.weight", (ffn, hidden), "normal", 0, columns).t().contiguous(),
                        source.part(p + "mlp.c_proj.bias", (hidden,), "zeros") if first else None))

    embed = source.part(base + "wte.weight", (vocab, hidden), "normal")
    positions = source.part(base + "wpe.weight", (config.n_positions, hidden), "normal")
    lm_head = _lm_head(source, "lm_head.weight", embed, bool(config.tie_word_embeddings), tp)
    local_heads = (b - a) // (hidden // heads)
    return CompactModel("gpt2", local_heads, local_heads, hidden // heads, config.layer_norm_epsilon, embed, positions,
                        tuple(layer(i) for i in range(config.n_layer)), norm(base + "ln_f"), lm_head, None, 1.0, tp)


def sharded_model(config: Any, source: WeightSource, tp: TensorParallel | None, device: torch.device
                  ) -> CompactModel:
    """This rank's part of the model that a transformers `config` describes (tp None: the whole model)."""
    if config.model_type == "gpt2":
        return _gpt2(config, source, tp)
    if config.model_type != "llama":
        raise ValueError(f"the static engine has code for llama and gpt2 models, not {config.model_type!r}")
    return _llama(config, source, tp, device)


def rank_model(shape: ModelPreset, checkpoint: str | None, dtype: torch.dtype, device: torch.device, seed: int,
               tp: TensorParallel | None) -> CompactModel:
    """This rank's part of a preset (random, seeded per block) or of a local checkpoint, built on `device`."""
    if checkpoint is None:
        return sharded_model(hf_config(shape), RandomWeights(seed, device, dtype), tp, device)
    from transformers import AutoConfig

    return sharded_model(AutoConfig.from_pretrained(checkpoint), CheckpointWeights(checkpoint, device, dtype), tp,
                         device)
