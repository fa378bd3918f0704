"""Stacks sharing an account never touch each other's resources."""
