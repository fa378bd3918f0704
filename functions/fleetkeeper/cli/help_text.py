"""Each command's --help: its description (the first sentence is its line in `fleetkeeper --help`) and examples."""

from __future__ import annotations

COMMAND_HELP: dict[str, tuple[str, str]] = {
    "up": (
        "Create a service from a spec (a SkyPilot service YAML, plus fleetkeeper's `update:`).",
        "  fleetkeeper up service.yaml --wait\n"
        "  HF_TOKEN=... fleetkeeper up -n llm llm.yaml --env MODEL=mistral --secret HF_TOKEN --wait\n"
        "The spec's `workdir` is packed (.skyignore, else .gitignore, decides what is left out) and uploaded;\n"
        "its replicas start in it. --env and --secret without =VALUE take the value from your environment.",
    ),
    "update": (
        "Roll out a new version of a service. A spec identical to the running one (same files in its\n"
        "workdir, same secret values) changes nothing.",
        "  fleetkeeper update web web.yaml --wait\n"
        "  fleetkeeper update web web.yaml --mode blue_green --env-file prod.env",
    ),
    "status": (
        "Show one service (its replicas), or every service; --endpoint prints a service's URL alone,\n"
        "--watch refreshes until Ctrl-C.",
        "  fleetkeeper status\n  fleetkeeper status web -o json\n  curl $(fleetkeeper status web --endpoint)/\n"
        "  fleetkeeper status --watch\n  fleetkeeper status web --watch --interval 5",
    ),
    "versions": ("List a service's versions, oldest first (* marks the target).", "  fleetkeeper versions web"),
    "rollback": (
        "Go back to an earlier version (default: the newest earlier one that did not fail).",
        "  fleetkeeper rollback web --wait\n  fleetkeeper rollback web --to 3",
    ),
    "down": (
        "Delete services: every replica is terminated, then the service and its history are gone.\n"
        "--all deletes every service (it asks first; -y skips the question, and is needed without a terminal).",
        "  fleetkeeper down web --wait\n  fleetkeeper down web api\n  fleetkeeper down --all -y",
    ),
    "access": (
        "Show or change who may read or change a service, besides its owner (the role that created it)\n"
        "and the stack's administrators. A role is named by its ARN (any path: roles match by name);\n"
        "* matches any characters. Changing access needs write access to the service.",
        "  fleetkeeper access web\n"
        "  fleetkeeper access web --add arn:aws:iam::111122223333:role/team-b-ci --read-only\n"
        "  fleetkeeper access web --add 'arn:aws:iam::111122223333:role/team-b-*'\n"
        "  fleetkeeper access web --remove arn:aws:iam::111122223333:role/team-b-ci",
    ),
    "events": (
        "Show what the control plane decided and saw about a service, oldest first (newest 100 kept;\n"
        "repeats folded with a count): why it is not READY.",
        "  fleetkeeper events web\n  fleetkeeper events web --follow\n  fleetkeeper events web -o json",
    ),
    "logs": (
        "Print the replicas' logs: the service's current replicas (embedded mode: while it is not READY also\n"
        "the 3 newest it no longer has, as a failed one's log says why; --all: every one). On AWS\n"
        "they are read from the stack's CloudWatch Logs group with your own credentials (--stack NAME\n"
        "finds it; else --log-group or $FLEETKEEPER_LOG_GROUP).",
        "  fleetkeeper logs web\n  fleetkeeper logs web --replica 3 --tail 50\n  fleetkeeper logs web --follow\n"
        "  fleetkeeper logs web --stack fleetkeeper --since 10m",
    ),
    "doctor": (
        "Smoke-test a control plane as its user: create a tiny service, reach its endpoint, update it,\n"
        "scale it to zero and wake it, create one as a second owner, delete both and check nothing is\n"
        "left. Each step prints PASS, FAIL or SKIP with its time; exit 1 if any failed (what it made is\n"
        "deleted all the same). On AWS it launches a few short-lived instances of the stack's default type.",
        "  fleetkeeper doctor --stack fleetkeeper\n"
        "  fleetkeeper doctor --stack fleetkeeper --second-owner-role arn:aws:iam::111122223333:role/team-b-ci\n"
        "  fleetkeeper doctor --local",
    ),
    "dashboard": (
        "Serve a web page of your services on 127.0.0.1: status, replicas, versions, events, logs, request\n"
        "rate and replicas over time; with --allow-actions, roll back and scale from it. It calls the API as\n"
        "you (your running `fleetkeeper local`, or --stack's API signed with your AWS credentials): open the\n"
        "one-time link it prints.",
        "  fleetkeeper dashboard\n  fleetkeeper dashboard --stack fleetkeeper --port 8480\n"
        "  fleetkeeper dashboard --allow-actions",
    ),
    "local": (
        "Run the whole control plane on this machine: the API, the reconciler, the cleanup and an in-memory\n"
        "AWS. Replicas are local processes, each in a network namespace of its own where Linux allows it\n"
        "(a fixed port such as 8080 works on every replica), else each with a $PORT of its own.",
        "  fleetkeeper local\n  fleetkeeper local --port 9090 --dir /tmp/fk\n"
        "  fleetkeeper local --metrics-interval 2 -v",
    ),
}
