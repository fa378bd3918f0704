"""The cleanup function."""
