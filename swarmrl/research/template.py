"""The commented study template (`swarmrl research --template`), also shown to the planner LLM."""

TEMPLATE = """\
# A swarmrl study: `swarmrl research THIS.toml`. Paths are relative to this file.
name = "my-study"                        # 1-40 of [A-Za-z0-9_.-]: names the study directory
question = "Does a higher learning rate make calculator learn faster?"
seeds = [1, 2, 3]                        # every arm runs once per seed (`swarmrl up --seed`)

[baseline]                               # the reference swarm; it runs as the first arm
name = "baseline"
note = "up's defaults"
# `swarmrl up` flags without the dashes (`swarmrl up --help`): config, task, model, clients,
# concurrency, num-repeat, batch-groups, lr, micro-batch-tokens, max-backlog, eval-every,
# eval-limit, eval-samples, eval-temperature, max-tokens, abort-rate, actions, trainer-arg.
# Set by research, never here: seed, minutes, steps, run-dir, nats, nats-conf, no-display.
flags = { task = "calculator", eval-limit = 32 }
# flags = { config = "../examples/cocktail.toml" }   # a swarm description instead of the short form

[arms.high-lr]                           # an arm: the baseline with these flags replaced
flags = { lr = 3e-4 }
note = "three times the default"

[arms.kl]
flags = { trainer-arg = ["--kl-coef=0.01"] }   # extra trainer flags (`swarmrl serve trainer --help`)

[metric]                                 # one number per run, from its ledger (DuckDB)
use = "final_success"                    # final_success | best_success | auc_success | final_reward
# or your own SELECT over the run's ledger views (evals, train_steps, episodes, ...; see
# `swarmrl query --help`): one row, one numeric column
# sql = "SELECT avg(success_rate) FROM evals WHERE step >= 20"
# curve = "SELECT step, avg(success_rate) FROM evals GROUP BY step ORDER BY step"   # plotted (x, y)
goal = "max"                             # max: higher is better; min: lower is better

[budget]
run_minutes = 10                         # wall clock per run (`up --minutes`)
# run_steps = 100                        # and/or trainer steps per run (`up --steps`)
total_minutes = 120                      # the whole study; runs that would pass it are skipped
attempts = 2                             # tries per run when up fails (interruptions do not count)

# Successive halving over seeds (optional): once every remaining arm has finished the first
# `after_seeds` seeds, the lower-ranked arms stop getting seeds; the baseline always goes on.
[early_stop]
after_seeds = [1]
keep = 0.5                               # share of the non-baseline arms kept (rounded up)
min_arms = 1
"""
