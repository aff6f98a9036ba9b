#!/usr/bin/env bash
# The guessing game (`--task guess`, a multi-turn environment: higher/lower answers, 6 guesses, 1..32) on the
# default model (issue 35): an SFT warm-up on transcripts of a player who guesses at random among the numbers still
# possible, then GRPO on whole episodes, the reward solved (1) + GuessNumber's get_reward ((6 - guesses) / 6).
# Results (2-core AMD EPYC, each run beside other jobs): the SFT warm-up, 10 steps on 183 transcripts, 19.3 min,
# held-out nll 0.466 -> 0.127 (results/guess_5856f08); greedy episodes then solve 11 of 32 held-out numbers (5.9
# calls each). GRPO from it (STEPS=12 --prompts-per-step 4 --samples-per-prompt 8 --eval-every 6 --eval-size 32,
# results/guess_grpo_b3191dd): sampled reward 0.07-0.39 with no trend, held-out 34% -> 38% (step 6) -> 16% (step
# 12), calls per episode up from 5.9 to 6.7: not learned at this lr and length (later turns re-read only what the
# last turn added since b3191dd: 135 s a rollout of 32 episodes instead of 831 s, benchmarks/episodes.py).
# Since 5ace5f3 the answers name the range still possible: the same warm-up then solves 14% greedy (50 held out),
# and 8 GRPO steps at lr 1e-5 (results/guess_grpo_5ace5f3, stopped for time) left the sampled solve rate at 12-31%
# with no clear trend; the sampled guesses stay next to the previous one.
# With the settings below (results/guess_a7b41dd, AMD EPYC; its GRPO was started with --steps 20 and resumed after
# step 2 with --steps 12 --eval-every 6): SFT on 470 transcripts, 59 steps, 50.8 min beside other jobs, nll 0.437 ->
# 0.083; greedy solves 80% of 50 held-out numbers (3.95 guesses each when solved); GRPO 12 steps, 35.8 min: held-out
# 80% -> 90% (step 6) -> 88% (step 12), sampled solve rate 50% 69% 88% 78% 62% 66% 62% 75% 66% 78% 75% 97%; the
# guesses per solved episode did not fall (greedy 3.95 -> 4.32).
set -euo pipefail
out=${1:-runs/guess}
n_sft=${N_SFT:-700}
mkdir -p "$out"
python - "$out/sft.jsonl" "$n_sft" <<'PY'
import json, random, sys
from nanorl.agents.tools import environment_tools, fallback_system_prompt
from nanorl.tasks.guess import GuessNumber, guess_task

task, rng = guess_task(eval_size=200, seed=0), random.Random(1)
system = fallback_system_prompt(environment_tools(GuessNumber()))
with open(sys.argv[1], "w") as f:
    for ex in task.train[: int(sys.argv[2])]:  # training rows only
        env = GuessNumber()
        env.reset(**ex.fields)
        messages = [{"role": "system", "content": system}, {"role": "user", "content": ex.prompt}]
        while not env.solved and env.guesses < 6:  # a random guess among the numbers still possible
            number = rng.randint(env.low, env.high)
            call = json.dumps({"name": "guess", "arguments": {"number": number}})
            answer = env.guess(number)
            messages += [{"role": "assistant", "content": f"<tool_call>{call}</tool_call>"},
                         {"role": "tool", "content": answer}]
        if env.solved:  # the transcripts that found it
            messages.append({"role": "assistant", "content": f"The number is {ex.fields['secret']}."})
            f.write(json.dumps({"messages": messages}) + "\n")
PY
wc -l "$out/sft.jsonl"
nanorl sft --data "$out/sft.jsonl" --task '' --max-length 640 --epochs 1 --batch-size 8 --lr 5e-5 --warmup-steps 5 \
  --eval-fraction 0.05 --eval-every 1000 --out-dir "$out/sft"
[ "${STEPS:-12}" = 0 ] && exit 0  # the warm-up only
nanorl train --model "$out/sft/model" --task guess --steps ${STEPS:-12} --prompts-per-step 4 --samples-per-prompt 8 \
  --lr 2e-5 --eval-every 6 --eval-size 50 --max-new-tokens 256 --out-dir "$out/grpo"  # step 0: the warm-up model
