"""fleetkeeper: a serverless control plane for long-running services on replica instances."""
