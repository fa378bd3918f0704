"""The embedded mode."""
