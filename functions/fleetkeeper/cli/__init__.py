"""The `fleetkeeper` command line: what people and CI pipelines use to drive the HTTPS API."""
