"""The service `up` leaves running, as `up`, `down`, `status`, the canary and the readiness server read it: one job
per module (docs/layout.md names them)."""
