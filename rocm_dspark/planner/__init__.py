"""The throughput planner behind `rocm-dspark plan`.

One capability per module:
  roofline.py     the seed document's roofline, parameterised from recipes/ (a model, not a measurement)
  cost_table.py   a measured step-cost table (tokens -> ms) with vLLM's graph-padding rules
  scheduler.py    adaptive verification: survival, ranking, budget search, two-phase causal scheme
  acceptance.py   acceptance inputs: per-position rates, synthetic acceptance length, expected tokens
  simulator.py    Monte-Carlo steps for no-spec, fixed K, per-batch-size K and adaptive verification
  recommend.py    runs the simulator over a concurrency grid and picks a setting
  report.py       table, JSON and PNG output
  seed/           teaching material: worked examples reproduced to the printed digit (`plan --seed-example`)

numpy is imported inside these modules; the CLI group imports none of them until `plan` runs.
"""
