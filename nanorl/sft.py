"""SFT: supervised fine-tuning on prompt/reply pairs, the warm-up many small models need before RL.

    nanorl sft                                   # SmolLM2-135M-Instruct on the shipped set's chosen replies
    nanorl sft --data rows.jsonl                 # {prompt, completion}, {messages} or {text} rows (any format)
    nanorl sft --model tiny --epochs 1           # smoke run

The loss is the mean negative log-likelihood of the reply tokens (EOS included), over all reply
tokens of the batch; prompt tokens are never trained on (they are not even scored: `token_logprobs`
computes logits only at reply positions). In a conversation ({messages}) every assistant turn is a reply
and the other turns are context (a per-token weight of 0); a {text} row trains on every token.
"""

from __future__ import annotations

import torch

from nanorl import distributed
from nanorl.config import SFTConfig
from nanorl.data import chunks, collate
from nanorl.logprobs import AUTO, token_logprobs
from nanorl.offline import describe_rows, fit, setup
from nanorl.tasks import task_from_config
from nanorl.tasks.preferences import encode_sft, read_pairs


def reply_nll(model, rows, pad_id, device, backend=AUTO):
    """Summed negative log-likelihood of the trained tokens of `rows` (weight 1), and their count."""
    b = collate(
        [r["prompt"] for r in rows],
        [r["chosen"] for r in rows],
        pad_id,
        device,
        per_token={"weight": [torch.tensor(r.get("weight", [1.0] * len(r["chosen"]))) for r in rows]},
    )
    logp, _ = token_logprobs(model, b, backend=backend)  # (b, C)
    w = b.loss_mask * b.extra["weight"]  # (b, C)
    return -(logp * w).sum(), int(w.sum())


def train(cfg: SFTConfig, data=None) -> dict:  # data: a datasets.Dataset from Python, else cfg.data
    # ------------------------------------------------------------------ setup
    train_data, eval_data = read_pairs(
        cfg.data if data is None else data, "sft", cfg.eval_fraction, cfg.seed, cfg.apply_chat_template
    )
    task = task_from_config(cfg) if cfg.task else None
    model, tok, device, backend, logger = setup(cfg, "sft", prompts=train_data)
    pad = tok.pad_token_id

    train_rows, eval_rows = encode_sft(tok, train_data, cfg), encode_sft(tok, eval_data, cfg)  # replies as "chosen"
    describe_rows(cfg, train_rows, eval_rows, "rows")

    def micro_loss(rows):
        nll, n = reply_nll(model, rows, pad, device, backend)
        return nll, {"tokens": n}

    @torch.no_grad()
    def run_eval() -> dict:
        def nll(part):  # (summed nll, tokens) of a micro-batch; torchrun: each rank its share of them
            total, n = reply_nll(model, part, pad, device, backend)
            return total.item(), n

        parts = distributed.spread(model, chunks(eval_rows, cfg.micro_batch_size), nll)
        return {"eval/nll_per_token": sum(n for n, _ in parts) / sum(c for _, c in parts)}

    # ------------------------------------------------------------------ the loop (offline.fit)
    return fit(
        cfg,
        model,
        tok,
        train_rows,
        micro_loss,
        run_eval,
        logger,
        "sft",
        normaliser=lambda batch: sum(sum(r["weight"]) for r in batch),
        task=task,
        backend=backend,
    )
