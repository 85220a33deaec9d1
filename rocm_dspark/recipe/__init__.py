"""Recipe resolution: data in, plan out.

catalog.py     recipes/ (YAML) -> validated records (one strict loader, load_yaml)
selection.py   option values -> Selection (the use case above, rocm_dspark.usecase, adds plan and verdict)
resolve.py     the pure resolver: named layers from model to verdict
plan.py        the records: Selection, Verdict, Build, Memory, Note, LaunchPlan, and the typed flag map
               (flag_for, Flags, Command) that every consumer reads instead of argv
capture.py     the graph capture size rule, max_num_seqs x (1+K) rounded up
strategies.py  multi-node strategies: every node's argv/env from one node's plan
cluster.py     option values -> one node's plan -> every node's commands
vllm_args.py   a user's --vllm-arg read as vLLM reads it, and the guard on what the plan decides
vllm_env.py    the same for --env
"""
