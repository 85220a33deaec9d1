"""The throughput planner behind `rocm-dspark plan`.

One capability per module:
  roofline.py      the seed document's roofline, parameterised from recipes/ (a model, not a measurement)
  cost_table.py    a measured step-cost table (tokens -> ms) with vLLM's graph-padding rules
  calibration.py   the step model fitted to the public A/B (recipes/step_cost.yaml), and its transfer
  host_fit.py      the same model fitted to this host's runs (`plan --calibrate`)
  capture_term.py  steps past the largest captured graph: their eager term and the plan's marks
  mono_term.py     what --monokernel would change on the decode steps it takes
  scheduler.py     adaptive verification: survival, ranking, budget search, two-phase causal scheme
  acceptance.py    acceptance inputs: per-position rates, synthetic acceptance length, expected tokens
  simulator.py     Monte-Carlo steps for no-spec, fixed K and adaptive verification
  recommend.py     runs the simulator over a concurrency grid and picks a setting
  profile.py       one (model, GPU) profile and a workload to a plan
  strategies.py    what N nodes buy, per multi-node strategy (`plan --nodes`)
  payoff_table.py  recipes/adaptive_payoff.yaml, the gate's numpy-free copy of the predicted payoff
  report.py        table, JSON and PNG output
  seed/            teaching material: worked examples reproduced to the printed digit (`plan --seed-example`)

numpy is imported inside these modules; the CLI group imports none of them until `plan` runs.
"""
