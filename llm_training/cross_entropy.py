"""Language-model cross-entropy over (vocab-parallel) logits in two memory passes, by torch.compile.

megatron's cross-entropy, unfused or its native fused variant, turns the half-precision logits
into an fp32 softmax (s·b·V·4 bytes: 3.3 GB per GPT-800M micro-batch of 8), normalises it in
place and keeps it for backward, about ten passes over logit-sized tensors per micro-batch. Here
the forward reads the logits once (online log-sum-exp and the target logit in one compiled
kernel) and the backward reads them once more and writes the gradient in the logits' dtype. The
arithmetic is megatron's: fp32 inside, loss = log Σ exp(logits) − logit[target] per token, and
with tensor parallelism the per-rank statistics are combined over the TP group.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from megatron.core.tensor_parallel.utils import VocabUtility
from torch import Tensor


@torch.compile(dynamic=False)
def _local_statistics(logits: Tensor, target: Tensor, vocab_start: int) -> tuple[Tensor, Tensor]:
    """log Σ exp over this rank's vocabulary slice, and the target's logit (0 where another rank holds it)."""
    x = logits.float()
    local = target - vocab_start
    in_slice = (local >= 0) & (local < x.size(-1))
    picked = torch.gather(x, -1, local.clamp(0, x.size(-1) - 1).unsqueeze(-1)).squeeze(-1)
    return torch.logsumexp(x, dim=-1), torch.where(in_slice, picked, 0.0)


@torch.compile(dynamic=False)
def _logit_gradient(logits: Tensor, log_sum_exp: Tensor, target: Tensor, vocab_start: int,
                    grad_loss: Tensor) -> Tensor:
    """(softmax − one-hot(target)) · dL/dloss, recomputed from the saved logits, in the logits' dtype."""
    softmax = torch.exp(logits.float() - log_sum_exp.unsqueeze(-1))
    columns = torch.arange(logits.size(-1), device=logits.device)
    one_hot = (columns == (target - vocab_start).unsqueeze(-1)).float()
    return ((softmax - one_hot) * grad_loss.unsqueeze(-1)).to(logits.dtype)


class _VocabParallelCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits: Tensor, target: Tensor, group: dist.ProcessGroup) -> Tensor:
        vocab_start, _ = VocabUtility.vocab_range_from_per_partition_vocab_size(
            logits.size(-1), dist.get_rank(group), dist.get_world_size(group))
        log_sum_exp, target_logit = _local_statistics(logits, target, vocab_start)
        if dist.get_world_size(group) > 1:
            # log Σ over all slices = M + log Σ_r exp(lse_r − M), M the largest slice value.
            largest = log_sum_exp.clone()
            dist.all_reduce(largest, op=dist.ReduceOp.MAX, group=group)
            sums = torch.stack([torch.exp(log_sum_exp - largest), target_logit])
            dist.all_reduce(sums, group=group)
            log_sum_exp, target_logit = largest + torch.log(sums[0]), sums[1]
        ctx.save_for_backward(logits, target, log_sum_exp)
        ctx.vocab_start = vocab_start
        return log_sum_exp - target_logit

    @staticmethod
    def backward(ctx, grad_loss: Tensor) -> tuple[Tensor, None, None]:
        logits, target, log_sum_exp = ctx.saved_tensors
        return _logit_gradient(logits, log_sum_exp, target, ctx.vocab_start, grad_loss.contiguous()), None, None


def vocab_parallel_cross_entropy(logits: Tensor, target: Tensor, group: dist.ProcessGroup) -> Tensor:
    """Per-token loss [s, b] (fp32) from logits [s, b, V/TP] of this TP rank and global target ids [s, b]."""
    return _VocabParallelCrossEntropy.apply(logits, target, group)
