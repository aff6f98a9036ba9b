"""DPO: direct preference optimisation on {prompt, chosen, rejected} pairs (arXiv 2305.18290).

    nanorl dpo                                   # SmolLM2-135M-Instruct on the shipped arithmetic pairs
    nanorl dpo --data prefs.jsonl --loss ipo --beta 0.5
    nanorl dpo --model tiny --epochs 1           # smoke run

The reference model is the starting model, so its log-probs are computed once, before the first
update, and cached: no second copy of the model is ever held in memory. Checkpoints keep them, so a
resumed run (--resume) still compares with the starting model. A pair's chosen and
rejected replies share one prompt forward (`data.Batch` stores each distinct prompt once).
Deviations: none of substance; IPO uses summed (not length-averaged) log-ratios like the DPO loss.
"""

from __future__ import annotations

from pathlib import Path

import torch

from nanorl import distributed
from nanorl.config import DPOConfig
from nanorl.data import chunks, collate
from nanorl.errors import ConfigError
from nanorl.logprobs import AUTO, sequence_logprobs
from nanorl.losses import dpo_loss
from nanorl.offline import describe_rows, fit, setup
from nanorl.tasks import task_from_config
from nanorl.tasks.preferences import encode_rows, read_pairs


def pair_batch(rows, pad_id, device):
    """A Batch of 2b sequences: the b chosen replies, then the b rejected ones, on b shared prompts."""
    return collate(
        [r["prompt"] for r in rows] * 2, [r["chosen"] for r in rows] + [r["rejected"] for r in rows], pad_id, device
    )


@torch.no_grad()
def pair_logprobs(model, rows, pad_id, device, micro: int, backend=AUTO) -> torch.Tensor:
    """(n, 2): summed log-probs of the chosen and the rejected reply of each row (torchrun: each rank its share)."""

    def part_logprobs(part):  # (b, 2)
        return sequence_logprobs(model, pair_batch(part, pad_id, device), backend=backend)[0].view(2, -1).T.cpu()

    return torch.cat(distributed.spread(model, chunks(rows, micro), part_logprobs))


def train(cfg: DPOConfig, data=None) -> dict:  # data: a datasets.Dataset from Python, else cfg.data
    # ------------------------------------------------------------------ setup
    train_pairs, eval_pairs = read_pairs(
        cfg.data if data is None else data, "preference", cfg.eval_fraction, cfg.seed, cfg.apply_chat_template
    )
    task = task_from_config(cfg) if cfg.task else None
    policy, tok, device, backend, logger = setup(cfg, "dpo", prompts=train_pairs)
    pad = tok.pad_token_id

    train_rows, eval_rows = encode_rows(tok, train_pairs, cfg), encode_rows(tok, eval_pairs, cfg)
    # the reference log-probs: the starting model's, computed once and cached with each row. A resumed run's
    # weights are no longer the starting model's: it reads them back from its checkpoint, in the same row order
    refs = (
        torch.load(Path(cfg.out_dir, "checkpoint", "trainer_state.pt"), weights_only=False, mmap=True)["ref"]
        if cfg.resume
        else torch.cat(
            [
                pair_logprobs(policy, rows, pad, device, cfg.micro_batch_size, backend)
                for rows in (train_rows, eval_rows)
            ]
        )
    )  # (n, 2) chosen, rejected
    if len(refs) != len(train_rows) + len(eval_rows):  # rows encode in one order from the data and the seed
        raise ConfigError(
            f"config key 'data': {len(train_rows) + len(eval_rows)} rows, the stopped run had {len(refs)}"
        )
    for r, ref in zip(train_rows + eval_rows, refs):
        r["ref"] = ref
    describe_rows(cfg, train_rows, eval_rows, "pairs")

    def micro_loss(rows):
        chosen, rejected = sequence_logprobs(policy, pair_batch(rows, pad, device), backend=backend)[0].view(2, -1)
        ref = torch.stack([r["ref"] for r in rows]).to(device)  # (b, 2)
        loss, st = dpo_loss(chosen, rejected, ref[:, 0], ref[:, 1], cfg.beta, cfg.loss, cfg.label_smoothing)
        return loss.sum(), {k: v.sum().item() for k, v in st.items()}

    def run_eval() -> dict:
        logp = pair_logprobs(policy, eval_rows, pad, device, cfg.micro_batch_size, backend)  # (n, 2)
        ref = torch.stack([r["ref"] for r in eval_rows])
        loss, st = dpo_loss(logp[:, 0], logp[:, 1], ref[:, 0], ref[:, 1], cfg.beta, cfg.loss, cfg.label_smoothing)
        return {
            "eval/loss": loss.mean().item(),
            "eval/reward_acc": st["acc"].mean().item(),
            "eval/margin": st["margin"].mean().item(),
            "eval/chosen_reward": st["chosen_reward"].mean().item(),
            "eval/rejected_reward": st["rejected_reward"].mean().item(),
            # the model's own preference, meaningful before training too (implicit rewards start at 0)
            "eval/logp_pref_acc": (logp[:, 0] > logp[:, 1]).float().mean().item(),
        }

    # ------------------------------------------------------------------ the loop (offline.fit)
    return fit(
        cfg,
        policy,
        tok,
        train_rows,
        micro_loss,
        run_eval,
        logger,
        "dpo",
        task=task,
        backend=backend,
        state={"ref": refs},
    )
