"""Reward models: a scalar head on a causal LM backbone, trained as Bradley-Terry on preference pairs.

    nanorl rm                                    # SmolLM2-135M-Instruct backbone, the shipped arithmetic pairs
    nanorl rm --model runs/sft/model --data prefs.jsonl
    nanorl train --reward-model runs/rm/model    # then use it as the reward of GRPO or PPO

Loss: -log sigmoid(r(x, y_w) - r(x, y_l)) (Ouyang et al. 2022, arXiv 2203.02155, eq. 1). The model is
saved as a Hugging Face `AutoModelForSequenceClassification` (num_labels = 1), so any such model from
the hub can be a reward too. Scores are read at the last real token, found from the sequence lengths
(sequences are left-padded), never by searching for the pad id, which may equal EOS.
The same class is PPO's critic: `token_values` reads the head at every reply position.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from nanorl import distributed
from nanorl.backends import Backend
from nanorl.config import RMConfig
from nanorl.data import chunks, encode_reply, left_pad
from nanorl.hub import is_sequence_classifier
from nanorl.logprobs import AUTO
from nanorl.models import check_tokenizer, is_adapter, load_model
from nanorl.offline import describe_rows, fit, setup
from nanorl.tasks.preferences import encode_rows, read_pairs


def load_reward_model(name: str, device, dtype=torch.float32):
    """A sequence-classification model (ours, or a decoder-style one from the hub with a `score` head:
    Llama, Qwen2, Mistral, Gemma, ...), or a fresh scalar head on the backbone of a causal LM
    (alias, folder, hub id, .gguf), -> (model, tokenizer)."""
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    if is_adapter(name, "SEQ_CLS"):  # trained with LoRA: its base (a scalar head on a backbone) with the adapter on top
        from nanorl.integrations.lora import load_adapter

        return load_adapter(name, device, dtype, load_base=load_reward_model)
    if is_sequence_classifier(name):
        model = AutoModelForSequenceClassification.from_pretrained(name, dtype=dtype).to(device)
        tok = check_tokenizer(AutoTokenizer.from_pretrained(name), name)  # a pad token: the EOS one if none
        if not hasattr(model, "score"):
            raise ValueError(
                f"reward model {name}: expected a decoder-style classifier with a `score` head "
                f"(e.g. LlamaForSequenceClassification), got {type(model).__name__}"
            )
        return model, tok
    lm, tok = load_model(name, device, dtype)
    if hasattr(lm, "peft_config"):  # a causal LM's adapter folder: its weights with the adapter folded in
        lm = lm.merge_and_unload()
    config = lm.config
    config.num_labels, config.pad_token_id = 1, tok.pad_token_id
    model = AutoModelForSequenceClassification.from_config(config, dtype=dtype)
    model.base_model.load_state_dict(lm.base_model.state_dict())  # the backbone
    # The head starts at 0: a fresh critic predicts V = 0, so PPO's first advantages come from the rewards,
    # not from a random head's noise (with a random head a real-model PPO run collapsed; notes/LOG.md).
    torch.nn.init.zeros_(model.score.weight)
    del lm  # the language-model head is not needed: no second copy stays in memory
    return model.to(device), tok


def _hidden(model, prompts, replies, pad_id, device, backend: Backend = AUTO):
    """Last hidden states of left-padded [prompt | reply] rows: (b, L, H) in fp32 (the scalar head runs in
    fp32 also under mixed precision), and reply lengths."""
    ids, mask = left_pad([p + r for p, r in zip(prompts, replies)], pad_id, device)  # (b, L)
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    with backend.forward(model), backend.recompute(model):  # peft's adapters sit inside the backbone it wraps
        h = (
            _inner(model)
            .base_model(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=False)
            .last_hidden_state
        )  # (b, L, H); no KV cache: nothing decodes
    return h.float(), [len(r) for r in replies]


def _inner(model):
    """The transformers model itself (under a peft wrapper, with the adapters inside it)."""
    return model.get_base_model() if hasattr(model, "get_base_model") else model


def rm_scores(model, prompts, replies, pad_id, device, backend: Backend = AUTO) -> torch.Tensor:
    """Reward of each (prompt, reply): the head at the last token (b,)."""
    h, _ = _hidden(model, prompts, replies, pad_id, device, backend)
    return _inner(model).score(h[:, -1]).squeeze(-1).float()


@torch.no_grad()
def rm_score(model, rm_tok, examples, texts, cfg, device, backend: Backend = AUTO) -> torch.Tensor:
    """The reward model's scores, re-tokenised with its own tokenizer (it may differ from the policy's)."""
    group_size, out = cfg.samples_per_prompt, []
    rows = [
        encode_reply(rm_tok, examples[i // group_size].prompt, t, cfg.system_prompt, 4096)[:2]
        for i, t in enumerate(texts)
    ]
    for part in chunks(rows, cfg.micro_batch_size):
        out.append(
            rm_scores(model, [p for p, _ in part], [r for _, r in part], rm_tok.pad_token_id, device, backend).cpu()
        )
    return torch.cat(out)


def token_values(model, prompts, replies, pad_id, device, backend: Backend = AUTO) -> torch.Tensor:
    """Value of the state before each reply token, V(prompt + reply[:t]) (b, C), 0 on padding."""
    h, lengths = _hidden(model, prompts, replies, pad_id, device, backend)
    v = _inner(model).score(h).squeeze(-1).float()  # (b, L)
    L, C = v.shape[1], max(max(lengths), 1)
    out = torch.zeros(len(lengths), C, device=v.device, dtype=v.dtype)
    for i, n in enumerate(lengths):  # the reply occupies the last n positions; t is predicted from t - 1
        out[i, :n] = v[i, L - n - 1 : L - 1]
    return out


def train(cfg: RMConfig, data=None) -> dict:  # data: a datasets.Dataset from Python, else cfg.data
    # ------------------------------------------------------------------ setup
    train_pairs, eval_pairs = read_pairs(
        cfg.data if data is None else data, "preference", cfg.eval_fraction, cfg.seed, cfg.apply_chat_template
    )
    model, tok, device, backend, logger = setup(cfg, "rm", prompts=train_pairs, load=load_reward_model)
    pad = tok.pad_token_id

    train_rows, eval_rows = encode_rows(tok, train_pairs, cfg), encode_rows(tok, eval_pairs, cfg)
    describe_rows(cfg, train_rows, eval_rows, "pairs")

    def margins(rows):  # (b,) reward of the chosen reply minus that of the rejected one
        r = rm_scores(
            model,
            [x["prompt"] for x in rows] * 2,
            [x["chosen"] for x in rows] + [x["rejected"] for x in rows],
            pad,
            device,
            backend,
        )
        return r[: len(rows)] - r[len(rows) :]

    def micro_loss(rows):
        margin = margins(rows)
        return -F.logsigmoid(margin).sum(), {"acc": (margin > 0).sum().item(), "margin": margin.sum().item()}

    @torch.no_grad()
    def run_eval() -> dict:
        margin = torch.cat(
            distributed.spread(
                model,
                chunks(eval_rows, cfg.micro_batch_size),  # a share per rank
                lambda part: margins(part).cpu(),
            )
        )
        return {
            "eval/loss": -F.logsigmoid(margin).mean().item(),
            "eval/pref_acc": (margin > 0).float().mean().item(),
            "eval/margin": margin.mean().item(),
        }

    # ------------------------------------------------------------------ the loop (offline.fit)
    return fit(cfg, model, tok, train_rows, micro_loss, run_eval, logger, "rm", load=load_reward_model)
