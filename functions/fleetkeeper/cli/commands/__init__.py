"""The CLI's commands, one module per kind; each command is a function of the invocation
(fleetkeeper.cli.invocation.Cli) that returns the exit code."""
