"""Embedded mode: the whole control plane in one local process (`fleetkeeper local`, `make local`).

It runs the same api, reconciler and cleanup handlers that Lambda runs, against an in-memory AWS
(moto's server on 127.0.0.1), with replicas as local process groups (`process_driver`).
"""
