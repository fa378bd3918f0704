"""The reconciler function: the shell against moto, fan-out, follow-ups, probes, spot."""
