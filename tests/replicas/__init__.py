"""Replica identity, secrets and workdirs, boot and logs."""
