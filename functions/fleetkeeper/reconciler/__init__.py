"""The reconciler function: observe, plan, apply, record."""
