"""Teaching material: worked examples that the planner reproduces to the printed digit.

  example.py      the worked examples' roofline (an 8B model on one H100), best-K, adaptive-verification
                  and Markov tables, and the expected-tokens lesson, recomputed with the planner's code
  torch_draws.py  torch's CPU random draws replayed with numpy, so the examples' draws need no torch

`rocm-dspark plan --seed-example` prints them; tests/test_planner_seed_goldens.py holds the printed
tables as goldens. docs/seed-examples.md explains what they teach. Nothing here describes an AMD GPU.
"""
