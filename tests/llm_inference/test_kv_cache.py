"""The KV cache object of both engines (llm_inference/kv_cache.py): its rows' writes, views, moves and releases on
the CPU, and that it is the only writer of keys and values. The engines' tokens through it are checked in
test_static_engine.py and test_continuous.py (every request's tokens equal those it gets alone)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import torch

from llm_inference.compact_model import CompactModel
from llm_inference.engine import build_model
from llm_inference.kv_cache import KVCache
from llm_inference.presets import PRESETS

PACKAGE = Path(__file__).resolve().parents[2] / "llm_inference"
CPU = torch.device("cpu")


@pytest.fixture(scope="module")
def model() -> CompactModel:
    return CompactModel.from_transformers(build_model(PRESETS["tiny"], None, "fp32", "sdpa", CPU, 1))


def _kv(model: CompactModel, rows: int, width: int, value: float) -> torch.Tensor:
    """K/V as attention_inputs gives them (rows, width, 2, KV heads, head dim), every entry `value` + its row."""
    kv = torch.full((rows, width, 2, model.kv_heads, model.head_dim), value)
    return kv + torch.arange(rows, dtype=kv.dtype)[:, None, None, None, None]


def test_independent_rows_write_at_their_own_lengths_move_down_and_release(model):
    cache = KVCache.independent(model, 4, 64, CPU)
    cache.write_prompt(0, torch.tensor([1, 3]), 0, _kv(model, 2, 5, 10.0))  # rows 1 and 3: 5 prompt positions
    cache.occupy(torch.tensor([1, 3]), torch.tensor([5, 2]))  # row 3's prompt was 2 long (the rest is padding)
    assert cache.length.tolist() == [0, 5, 0, 2] and cache.active.tolist() == [0, 1, 0, 1]
    head = cache.head(4)
    head.write_token(0, _kv(model, 4, 1, 100.0))  # one token per row, each at its own length
    assert cache.keys(0)[1, :, 5].eq(101.0).all() and cache.values(0)[3, :, 2].eq(103.0).all()
    assert cache.keys(0)[3, :, 1].eq(11.0).all()  # row 3's prompt stays below its length
    head.advance()
    assert cache.length.tolist() == [0, 6, 0, 3]  # inactive rows stay put
    assert head.token_positions().data_ptr() == cache.length.data_ptr()  # from position 0: the lengths themselves
    cache.move(torch.tensor([3]), torch.tensor([0]), 3)
    assert cache.length.tolist() == [3, 6, 0, 0] and cache.active.tolist() == [1, 1, 0, 0]  # the source emptied
    assert torch.equal(cache.keys(0)[0, :, :3], cache.keys(0)[3, :, :3])
    cache.release(torch.tensor([1]))
    assert cache.active.tolist() == [1, 0, 0, 0] and cache.length.tolist() == [3, 0, 0, 0]  # attends to 1 position
    assert cache.head(2).data.data_ptr() == cache.data.data_ptr()  # a row bucket is a view, no copy
    cache.clear()
    assert not cache.length.any() and not cache.active.any()


def test_a_lockstep_set_writes_one_shared_position_from_each_row_s_start(model):
    cache = KVCache.lockstep(model, 3, 64, CPU)
    cache.write_prompt(1, torch.tensor([0, 1, 2]), 0, _kv(model, 3, 6, 1.0))
    cache.begin(torch.tensor([0, 2, 5]), 6)  # left padding: rows begin at 0, 2 and 5
    assert cache.token_positions().tolist() == [6, 4, 1]
    cache.write_token(1, _kv(model, 3, 1, 50.0))
    assert cache.values(1)[:, :, 6].flatten(1).amin(1).tolist() == [50.0, 51.0, 52.0]
    cache.advance()
    assert cache.length.tolist() == [7]
    for refused in (lambda: cache.head(2), lambda: cache.release(torch.tensor([0])),
                    lambda: cache.move(torch.tensor([2]), torch.tensor([0]), 6)):
        with pytest.raises((ValueError, AssertionError)):
            refused()


def test_the_cache_is_the_only_writer_of_keys_and_values():
    """No engine keeps a K/V write of its own (a `write` closure, an indexed copy into a cache tensor)."""
    for path in sorted(PACKAGE.glob("*.py")):
        if path.name == "kv_cache.py":
            continue
        tree = ast.parse(path.read_text())
        closures = [node.name for node in ast.walk(tree) if isinstance(node, ast.FunctionDef) and node.name == "write"]
        writes = [ast.unparse(node) for node in ast.walk(tree) if isinstance(node, ast.Call)
                  and isinstance(node.func, ast.Attribute) and node.func.attr in ("index_copy_", "index_put_", "copy_")
                  and "cache" in ast.unparse(node.func.value)]
        assert not closures and not writes, (path.name, closures, writes)
