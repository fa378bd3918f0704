"""A seeded, deterministic simulation of the whole control plane (FoundationDB style).

One seed drives API calls through the real api handler, reconciler runs (scheduled and kicked,
crashed, timed out, two interleaved), cleanup deliveries from the table's stream through the
template's filter, probe verdicts from the simulation's own model, every fault of the strict-AWS
layer and clock jumps; the invariants (docs/architecture/invariants.md) are checked after every step. See
docs/architecture/simulation.md; the engine is `tests/simulation/sim.py`, the seeds
`tests/simulation/test_simulation.py`.
"""
