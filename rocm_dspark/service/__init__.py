"""The service `up` leaves running, as `up`, `down`, `status`, the canary and the readiness server read it.

state      the `up` state file: finished steps with a hash of their inputs, the running service, readiness
trust      when that file may be believed (docs/trust.md), and one `up` or canary per state dir (the lock)
control    the detached launcher process or systemd unit: start, attach, alive, stop
start      one model load: start a command's launcher or unit, wait until it serves, record it
readiness  whether it may take traffic: `status --ready`, GET /ready and /metrics
canary     `rocm-dspark canary`: the check of the served tokens, its record, the switch to block, its status
status     `rocm-dspark down` and `status`
"""
