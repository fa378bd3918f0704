"""Principals and access rules."""
