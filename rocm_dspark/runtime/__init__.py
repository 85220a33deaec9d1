"""What runs on a host, next to a vLLM server: one job per module.

process.py      the one vLLM process manager: start a command in its own process group, wait until it
                serves, stop the whole group
refusal.py      vLLM's refusal line from its log (the launcher gets the same patterns)
client.py       HTTP to a running server: /health, /v1/models, completions, chat, /metrics
metrics.py      Prometheus text from /metrics -> speculative-decoding counters and their deltas
server_spec.py  the `--server-json FILE` format: a server command run instead of the recipe's plan
gpus.py         which AMD GPUs the host has (amd-smi JSON, then rocminfo), matched to the catalog
inventory.py    GPU health for validation: HBM, ECC, temperatures, power
mono_log.py     which mono decode path (--monokernel) a vLLM 0.33.0 server runs, from its log
partition.py    a GPU's compute partition (amd-smi static --partition; the launcher gets the same rule)
procfs.py       /proc: who holds a listening port, a process's argv, environment, owner, parent, start time
progress.py     the live progress display of up, validate --launch and probe (rich on a terminal)
actions.py      typed actions (run, write, wait, say): executed, or printed as --dry-run's bash script
server_phases.py  vLLM's start-up phases read from its log, each pattern with its source line
"""
