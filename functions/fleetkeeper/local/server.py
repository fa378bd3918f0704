"""`fleetkeeper local`: the whole control plane in one process, on 127.0.0.1 only.

    in-memory AWS     moto's server app on a free port, behind this run's access key (InMemoryAws);
                      the table built from template.yaml
    api               ApiBridge: real HTTP on --port -> API Gateway events -> the api handler; every
                      request needs this run's credential (fleetkeeper.local.auth, published in
                      <--dir>/local-api.json, 0600, where the CLI finds it on its own)
    reconciler        ReconcileLoop: the dispatcher every --tick seconds, its shards through the
                      in-memory reconcile queue to the worker handler, and the worker on each kick
    cleanup           StreamPump: the table's stream -> template's filter -> the cleanup handler
    replicas          ProcessDriver: local process groups (FLEETKEEPER_DRIVER=process), each in a
                      network namespace of its own where Linux allows it (--isolation)
    endpoints         LocalBalancer: one port per service on 127.0.0.1 (FLEETKEEPER_LOAD_BALANCER=local)

The handlers are the ones Lambda runs, imported as they are.
"""

from __future__ import annotations

import argparse
import logging
import math
import os
import signal
import sys
import threading
import warnings
from typing import TYPE_CHECKING, Any, NamedTuple

from fleetkeeper import aws
from fleetkeeper.local import auth, moto_memory
from fleetkeeper.local.balancer import LocalBalancer
from fleetkeeper.local.context import LocalContext
from fleetkeeper.local.http_bridge import KICK_PATH, ApiBridge, local_principal
from fleetkeeper.local.in_memory_aws import InMemoryAws
from fleetkeeper.local.options import MAX_TICK, Options, add_arguments, options_from
from fleetkeeper.local.process_driver import (
    ISOLATION_ENV,
    LOCAL_DIR_ENV,
    LOOPBACK,
    NETNS,
    ProcessDriver,
    namespaces_available,
)
from fleetkeeper.local.reconcile_loop import ReconcileLoop
from fleetkeeper.local.retention import prune_earlier_runs
from fleetkeeper.local.stream_pump import StreamPump, StreamSource
from fleetkeeper.local.template import create_queue, create_table, load_template
from fleetkeeper.reconciler.balancers import EMBEDDED_BALANCER, register_balancer
from fleetkeeper.reconciler.drivers import EMBEDDED_DRIVER, register_driver
from fleetkeeper.replicas.workdirs import LocalWorkdirStore
from fleetkeeper.settings import (
    ADMIN_PRINCIPALS_ENV,
    BALANCER_ENV,
    DRIVER_ENV,
    KICK_TOKEN_ENV,
    LOCAL_STACK_ID,
    METRIC_LAG_ENV,
    METRIC_WINDOW_ENV,
    RECONCILE_QUEUE_URL_ENV,
    STACK_ID_ENV,
    WORKDIR_DIR_ENV,
    WORKDIR_UPLOAD_URL_ENV,
)

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence
    from pathlib import Path

logger = logging.getLogger("local.server")


Handler = Any  # a Lambda handler: (event, context) -> response


def configure_environment(options: Options, aws_access_key_id: str = "local") -> None:
    """The settings the handlers read, pointed at this process's in-memory AWS and nothing else."""
    os.environ.update(
        {
            # Credentials of this run only: embedded mode must never sign anything with a real
            # identity, and its in-memory AWS serves requests signed with this key id only.
            "AWS_ACCESS_KEY_ID": aws_access_key_id,
            "AWS_SECRET_ACCESS_KEY": "local",
            "AWS_SESSION_TOKEN": "local",
            "AWS_REGION": "us-east-1",
            "AWS_DEFAULT_REGION": "us-east-1",
            "AWS_ACCOUNT_ID_ENDPOINT_MODE": "disabled",  # moto's stream reads need it
            "AWS_EC2_METADATA_DISABLED": "true",
            "TABLE_NAME": options.table,
            # Its own stack id: what it creates carries it, as a deployed stack's does.
            STACK_ID_ENV: LOCAL_STACK_ID,
            DRIVER_ENV: EMBEDDED_DRIVER,
            BALANCER_ENV: EMBEDDED_BALANCER,
            LOCAL_DIR_ENV: str(options.local_dir),
            ISOLATION_ENV: options.isolation,
            # The workdir store: a directory (replicas unpack from it; uploads arrive through the bridge).
            WORKDIR_DIR_ENV: str(options.local_dir / "workdirs"),
            "POWERTOOLS_SERVICE_NAME": "fleetkeeper",
            "POWERTOOLS_METRICS_NAMESPACE": "fleetkeeper",
            # EMF lines are for CloudWatch, not a terminal (and see _without_metrics).
            "POWERTOOLS_METRICS_DISABLED": "true",
            "POWERTOOLS_TRACE_DISABLED": "true",
            # The autoscaler reads the local balancer's RequestCount as it reads the ALB's: a window
            # of one publication interval (aligned, as the balancer's datapoints are), ending one
            # interval back, by when that interval's datapoint has been published.
            METRIC_WINDOW_ENV: str(max(1, math.ceil(options.metrics_interval))),
            METRIC_LAG_ENV: str(max(1, math.ceil(options.metrics_interval))),
            # The embedded mode's one user (the identity the HTTP bridge gives every request) is the
            # control plane's administrator: it sees and changes every service.
            ADMIN_PRINCIPALS_ENV: local_principal(),
        }
    )
    # The reconciler's drivers know `ec2` only: the deployed code never imports this package.
    register_driver(EMBEDDED_DRIVER, ProcessDriver.shared)
    # And its load balancers `alb` only: the embedded mode's own is a real one on 127.0.0.1.
    LocalBalancer.idle_timeout_default = options.idle_timeout
    LocalBalancer.metrics_interval_default = options.metrics_interval
    register_balancer(EMBEDDED_BALANCER, LocalBalancer.shared)
    for variable in ("AWS_PROFILE", "FLEETKEEPER_KICK_QUEUE_URL", "FLEETKEEPER_KICK_URL", "WORKDIR_BUCKET"):
        os.environ.pop(variable, None)
    quiet_library_warnings()


def quiet_library_warnings() -> None:
    """Powertools warns at the end of an invocation that added no metric; in Lambda that goes to the
    function's log, here it would go to the terminal on the first quiet tick."""
    warnings.filterwarnings("ignore", message="No application metrics to publish", category=UserWarning)


class _Handlers(NamedTuple):
    """The control plane's Lambda handlers, as the embedded mode calls them."""

    api: Handler
    reconciler: Handler
    dispatch: Handler
    cleanup: Handler


def _without_metrics(handler: Handler) -> Handler:
    """A handler whose Powertools metrics are dropped after each invocation.

    With POWERTOOLS_METRICS_DISABLED, Powertools (3.x) skips printing at the end of an invocation but
    also keeps the metrics it did not print, so the values pile up across invocations until one
    metric holds 100 of them, and then add_metric prints the raw EMF blob anyway (its own flush,
    which does not check the setting): after about 100 reconciler runs of `make local`. Embedded
    mode has no CloudWatch to send them to, so they go once each invocation is over.
    """

    def invoke(event: dict[str, Any], context: Any) -> Any:
        try:
            return handler(event, context)
        finally:
            from aws_lambda_powertools import Metrics

            Metrics().clear_metrics()  # the set is shared by every Metrics instance of the process

    return invoke


class EmbeddedControlPlane:
    """Start and stop everything `fleetkeeper local` runs (tests and the demo use it in-process)."""

    def __init__(self, options: Options, *, log_level: int | None = None, routine_logs: bool = True) -> None:
        # log_level: print the handlers' logs readably at this level (None: leave logging alone);
        # routine_logs: with the reconciler's summary of every run (-v), else its changes only.
        self.log_level = log_level
        self.routine_logs = routine_logs
        self.options = Options(
            port=options.port,
            tick=options.tick,
            local_dir=options.local_dir.resolve(),
            table=options.table,
            idle_timeout=options.idle_timeout,
            metrics_interval=options.metrics_interval,
            isolation=options.isolation,
            dashboard_port=options.dashboard_port,
            allow_actions=options.allow_actions,
        )
        self.aws_endpoint = ""
        self.dashboard: Any = None  # fleetkeeper.dashboard.server.Running, once started
        self.dashboard_problem: str | None = None
        # This run's credentials: the API's bearer token, and the in-memory AWS's access key id.
        self.token = auth.new_token()
        self.aws_access_key_id = auth.new_access_key_id()
        self.published: auth.Published | None = None
        self._serving = False  # whether the bridge's serve_forever runs (shutdown() waits for it)
        self._moto: InMemoryAws | None = None
        self._bridge: ApiBridge | None = None
        self._loop: ReconcileLoop | None = None
        self._pump: StreamPump | None = None
        self._reconciler_handler: Callable[[dict[str, Any], Any], dict[str, Any]] | None = None
        self._stop_pump = threading.Event()
        self._threads: list[threading.Thread] = []

    @property
    def api_url(self) -> str:
        if self._bridge is None:
            raise RuntimeError("the control plane is not started")
        return self._bridge.url

    @property
    def logs_dir(self) -> Path:
        return self.options.local_dir / "logs"

    @property
    def isolation(self) -> str:
        """What replicas get, for the banner: a network namespace each, or a port each."""
        driver = ProcessDriver.shared()
        if driver.isolation == NETNS:
            return "each in a network namespace of its own: PORT is the spec's port, as on EC2"
        return f"sharing this machine's loopback ({driver.isolation_note}): each gets a free PORT"

    @property
    def limits(self) -> str:
        """What a replica here cannot do that an EC2 one can, for the banner."""
        network = (
            "no outbound network (their namespace has loopback only)"
            if ProcessDriver.shared().isolation == NETNS
            else "this machine's network"
        )
        return f"{network}; GPUs simulated (none is used)"

    def start(self) -> None:
        """The in-memory AWS, the handlers and the threads that call them: the api's HTTP front, the
        reconcile loop, the table stream's pump and the dashboard."""
        if self.options.isolation == NETNS:
            ok, note = namespaces_available()
            if not ok:
                raise IsolationUnavailable(f"--isolation netns: {note}; use --isolation shared (or auto)")
        # The state dir holds the credential, the workdirs and the replicas' logs: its user's only
        # (0700; a dir of another user's is refused: auth.CredentialProblem).
        auth.private_dir(self.options.local_dir)
        configure_environment(self.options, self.aws_access_key_id)
        if not _used_by_another_run(self.options.local_dir):
            prune_earlier_runs(self.options.local_dir)  # their services died with their in-memory AWS
        self.logs_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        template = load_template()
        queue_url = self._start_aws(template)
        handlers = self._load_handlers()
        self._loop = ReconcileLoop(
            handlers.reconciler, tick=self.options.tick, dispatcher=handlers.dispatch, queue_url=queue_url
        )
        self._pump = self._stream_pump(template, handlers.cleanup)
        self._reconciler_handler = handlers.reconciler
        bridge = self._start_bridge(handlers.api)
        self._spawn("api-server", bridge.serve_forever)
        self._serving = True
        self._start_dashboard()
        if self._loop is not None:
            self._loop.start()
        if self._pump is not None:
            pump = self._pump
            # Named after the function: readable logs tell the handlers apart by thread.
            self._spawn(pump.source.function_name, lambda: pump.run(self._stop_pump, interval=0.25))

    def _start_aws(self, template: dict[str, Any]) -> str:
        """The in-memory AWS, its table and reconcile queue (as the template declares them); the
        queue's URL."""
        logging.getLogger("werkzeug").setLevel(logging.WARNING)  # moto's server logs every AWS call
        self._moto = InMemoryAws(LOOPBACK, self.aws_access_key_id)
        self.aws_endpoint = self._moto.start()
        os.environ["FLEETKEEPER_AWS_ENDPOINT_URL"] = self.aws_endpoint
        aws.reset_clients()
        create_table(aws.dynamodb(), self.options.table, template)
        queue_url = create_queue(aws.sqs(), f"{self.options.table}-reconcile", "ReconcileQueue", template)
        os.environ[RECONCILE_QUEUE_URL_ENV] = queue_url
        return queue_url

    def _load_handlers(self) -> _Handlers:
        """The four handlers, imported once the environment points them at the in-memory AWS."""
        # Imported only now: the handlers read their settings (pointed at moto above) on first use.
        from fleetkeeper.api.handler import lambda_handler as api_handler
        from fleetkeeper.cleanup.handler import lambda_handler as cleanup_handler
        from fleetkeeper.reconciler.handler import dispatch_handler
        from fleetkeeper.reconciler.handler import lambda_handler as reconciler_handler

        if self.log_level is not None:  # after the imports: the handlers' loggers exist from then on
            from fleetkeeper.local.readable_logs import make_logs_readable

            make_logs_readable(self.log_level, routine=self.routine_logs)
        api_handler = _without_metrics(api_handler)
        cleanup_handler = _without_metrics(cleanup_handler)
        reconciler_handler = _without_metrics(reconciler_handler)
        dispatch_handler = _without_metrics(dispatch_handler)
        return _Handlers(api_handler, reconciler_handler, dispatch_handler, cleanup_handler)

    def _stream_pump(self, template: dict[str, Any], cleanup_handler: Handler) -> StreamPump:
        """The table stream's one reader, feeding the cleanup handler as Lambda's event source would."""
        source = StreamSource.from_template(template)
        if source is None:
            raise RuntimeError("template.yaml declares no DynamoDB event for CleanupFunction")
        stream_arn = aws.dynamodb().describe_table(TableName=self.options.table)["Table"]["LatestStreamArn"]
        table = self.options.table
        return StreamPump(
            _streams_client(self.aws_endpoint),
            stream_arn,
            source,
            _and_local_files(cleanup_handler),
            # The pump is the stream's one reader: what it is done with need not be kept.
            on_checkpoint=lambda shard_id, sequence: moto_memory.trim_stream(table, shard_id, sequence),
        )

    def _start_bridge(self, api_handler: Handler) -> ApiBridge:
        """The HTTP front of the api handler, and the credential the CLI and dashboard find it by."""
        self._bridge = bridge = ApiBridge(
            (LOOPBACK, self.options.port),
            api_handler,
            token=self.token,
            on_kick=self._kick,
            on_delayed_kick=self._kick_later,
            on_interrupt=self._interrupt,
            logs_dir=self.logs_dir,
            info={
                "aws_endpoint": self.aws_endpoint,
                "table": self.options.table,
                "tick": self.options.tick,
                # Service name -> endpoint URL, as the local load balancer has them now.
                "endpoints": lambda: LocalBalancer.shared().endpoints(),
            },
            workdirs=LocalWorkdirStore(self.options.local_dir / "workdirs", ""),
        )
        os.environ["FLEETKEEPER_KICK_URL"] = self._bridge.url + KICK_PATH
        os.environ[KICK_TOKEN_ENV] = self.token
        os.environ[WORKDIR_UPLOAD_URL_ENV] = self._bridge.url + "/_local/workdirs"
        credential = auth.LocalCredential(
            self._bridge.url, self.token, os.getpid(), self.aws_endpoint, self.aws_access_key_id
        )
        self.published = auth.publish(credential, self.options.local_dir)
        return bridge

    def _start_dashboard(self) -> None:
        """The dashboard, calling this run's API with its credential as the CLI does. A port that is
        taken costs the dashboard only: the control plane runs on (the banner says why)."""
        port = self.options.dashboard_port_to_bind
        if port is None or self._bridge is None:
            return
        from fleetkeeper.cli.http import ApiClient
        from fleetkeeper.dashboard.backend import Backend
        from fleetkeeper.dashboard.command import EMBEDDED_REFRESH
        from fleetkeeper.dashboard.server import start_in_thread

        backend = Backend(ApiClient(self._bridge.url, token=self.token))
        try:
            self.dashboard = start_in_thread(
                backend,
                port,
                target=f"embedded mode ({self._bridge.url})",
                allow_actions=self.options.allow_actions,
                refresh_seconds=EMBEDDED_REFRESH,
            )
        except OSError as exc:
            self.dashboard_problem = f"not served: 127.0.0.1:{port}: {exc.strerror or exc} (--dashboard-port)"

    def stop(self) -> None:
        """Stop taking requests, stop the loops, then stop every replica and the in-memory AWS."""
        if self.dashboard is not None:
            self.dashboard.stop()
            self.dashboard = None
        if self.published is not None:
            auth.withdraw(self.published)
            self.published = None
        if self._bridge is not None:
            if self._serving:
                self._bridge.shutdown()
            self._bridge.server_close()
        if self._loop is not None:
            self._loop.stop()
        self._stop_pump.set()
        for thread in self._threads:
            thread.join(timeout=10)
        LocalBalancer.reset_shared()  # closes every endpoint's port, publishes its last counts
        ProcessDriver.reset_shared()
        if self._moto is not None:
            self._moto.stop()
            self._moto = None
        os.environ.pop("FLEETKEEPER_KICK_URL", None)
        os.environ.pop(KICK_TOKEN_ENV, None)
        os.environ.pop(RECONCILE_QUEUE_URL_ENV, None)
        os.environ.pop(WORKDIR_UPLOAD_URL_ENV, None)
        os.environ.pop("FLEETKEEPER_AWS_ENDPOINT_URL", None)
        aws.reset_clients()

    def _kick(self, service: str) -> None:
        if self._loop is not None:
            self._loop.kick(service)

    def _kick_later(self, service: str, delay: int, followup: int | None) -> None:
        """A delayed kick or a follow-up: kept by the reconcile loop until due (SQS's DelaySeconds)."""
        if self._loop is not None:
            self._loop.kick(service, delay, followup)

    def _interrupt(self, service: str, replica_id: int, kind: str, notice_seconds: float) -> tuple[int, dict[str, Any]]:
        """Simulate EC2's warning about a spot replica: the event the stack's InterruptionRule would
        deliver goes to the reconciler handler, as on AWS; an interruption warning also has the replica
        reclaimed (`Server.SpotInstanceTermination`) `notice_seconds` later, as AWS does two minutes
        after its warning."""
        from fleetkeeper.model import Interruption, InterruptionKind, to_iso, utcnow
        from fleetkeeper.reconciler.driver import InstanceState
        from fleetkeeper.reconciler.interruptions import warning_event

        driver = ProcessDriver.shared()
        running = [
            i
            for i in driver.list_instances()
            if i.service == service and i.replica_id == replica_id and i.state is InstanceState.RUNNING
        ]
        if not running:
            return 404, _problem("not_found", f"service {service!r} has no running replica {replica_id}")
        instance = running[0]
        if not instance.spot:
            return 409, _problem(
                "conflict",
                f"replica {replica_id} of {service!r} is on-demand: AWS sends these warnings for spot instances "
                "only (set resources.use_spot: true)",
            )
        warning = Interruption(InterruptionKind(kind), instance.instance_id, to_iso(utcnow()))
        reclaim = warning.kind is InterruptionKind.SPOT_INTERRUPTION
        if reclaim:
            driver.reclaim(instance.instance_id, notice_seconds)
        if self._reconciler_handler is None:
            return 503, _problem("unavailable", "the control plane is not started")
        self._reconciler_handler(warning_event(warning), LocalContext("ReconcilerFunction", 60))
        answer: dict[str, Any] = {"service": service, "replica": replica_id, "instance_id": instance.instance_id}
        answer.update(kind=kind, reclaimed_in_seconds=notice_seconds if reclaim else None)
        return 202, answer

    def _spawn(self, name: str, target: Callable[[], None]) -> None:
        thread = threading.Thread(target=target, name=name, daemon=True)
        thread.start()
        self._threads.append(thread)


class IsolationUnavailable(RuntimeError):
    """--isolation netns asked for, where this machine cannot give replicas network namespaces."""


def _and_local_files(cleanup: Handler) -> Handler:
    """The cleanup handler, then what embedded mode keeps of the removed incarnations outside the
    in-memory AWS: their replicas' logs and working directories (a record the handler reported as
    failed is left for its redelivery)."""

    def handler(event: dict[str, Any], context: Any) -> Any:
        answer = cleanup(event, context)
        failed = {item.get("itemIdentifier") for item in (answer or {}).get("batchItemFailures", [])}
        for record in event.get("Records", []):
            stream = record.get("dynamodb") or {}
            image = stream.get("OldImage") or {}
            name, uid = (image.get("name") or {}).get("S"), (image.get("uid") or {}).get("S")
            if record.get("eventName") == "REMOVE" and name and uid and stream.get("SequenceNumber") not in failed:
                ProcessDriver.shared().remove_incarnation(name, uid)
        return answer

    return handler


def _used_by_another_run(local_dir: Path) -> bool:
    """Whether a `fleetkeeper local` that still runs published its credential in `local_dir`."""
    try:
        return auth._load(local_dir / auth.CREDENTIAL_FILE) is not None
    except auth.CredentialProblem:
        return True


def _problem(code: str, message: str) -> dict[str, Any]:
    """The api's error shape, for the /_local routes' answers."""
    return {"error": {"code": code, "message": message, "details": []}}


def _streams_client(endpoint: str) -> Any:
    import boto3

    return boto3.session.Session().client("dynamodbstreams", region_name="us-east-1", endpoint_url=endpoint)


def _dashboard_line(plane: EmbeddedControlPlane) -> str:
    if plane.dashboard is not None:
        mode = "actions allowed" if plane.options.allow_actions else "read-only (--allow-actions)"
        return f"{plane.dashboard.login_url()}   (this link works once; {mode})"
    return plane.dashboard_problem or "not served (--no-dashboard)"


def banner(plane: EmbeddedControlPlane) -> str:
    published = plane.published
    where = published.path if published is not None else plane.options.local_dir / auth.CREDENTIAL_FILE
    reach = "(the CLI finds it on its own: `fleetkeeper status`)"
    lines = [
        "fleetkeeper local: the control plane is running on this machine",
        f"  API            {plane.api_url}   {reach}",
        f"  credential     {where}   (yours only; curl: Authorization: Bearer <its token>)",
        f"  replicas       {plane.isolation}",
        f"  limits         {plane.limits}   (docs/CLI.md, local)",
        f"  replica logs   {plane.logs_dir}/<service>/<uid>/replica-<id>.log   (fleetkeeper logs NAME)",
        f"  in-memory AWS  {plane.aws_endpoint}   table {plane.options.table}",
        f"  dashboard      {_dashboard_line(plane)}",
        f"  reconciler     every {plane.options.tick:g}s and after every write (-v logs each run)",
        f"  autoscaler     reads the endpoints' request counts every {plane.options.metrics_interval:g}s "
        "(--metrics-interval)",
        "  endpoints      one port per service on 127.0.0.1, logged as each opens (fleetkeeper status NAME)",
        "Ctrl-C (or SIGTERM, or closing the terminal) stops every replica and exits.",
    ]
    return "\n".join(lines)


def parser(prog: str = "fleetkeeper local") -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=prog, description="Run the whole control plane on 127.0.0.1.")
    add_arguments(p)
    return p


def serve(
    options: Options,
    *,
    quiet: bool = False,
    verbose: bool = False,
    on_started: Callable[[EmbeddedControlPlane], None] | None = None,
) -> int:
    """Run until SIGINT/SIGTERM/SIGHUP; returns the process exit code."""
    if not (math.isfinite(options.tick) and 0 < options.tick <= MAX_TICK):  # the parser checks it too
        print(f"fleetkeeper local: --tick must be a finite number above 0 and at most {MAX_TICK:g}", file=sys.stderr)
        return 2
    stop = threading.Event()
    # SIGHUP: the terminal was closed. Replicas are in sessions of their own, so nothing else stops
    # them; they must be stopped as on Ctrl-C. (PR_SET_PDEATHSIG is no substitute: it fires when the
    # *thread* that started a replica exits, and reaches only the group leader, not what it started.)
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, lambda _signum, _frame: stop.set())
    plane = EmbeddedControlPlane(
        options, log_level=logging.WARNING if quiet else logging.INFO, routine_logs=verbose and not quiet
    )
    # Everything this process creates (the state dir's files, the replicas' logs and workdirs) is its
    # user's only; the replicas inherit it.
    umask = os.umask(auth.PRIVATE_UMASK)
    try:
        return _run(plane, options, stop, on_started)
    finally:
        os.umask(umask)


def _run(
    plane: EmbeddedControlPlane,
    options: Options,
    stop: threading.Event,
    on_started: Callable[[EmbeddedControlPlane], None] | None,
) -> int:
    try:
        plane.start()
    except (auth.CredentialProblem, IsolationUnavailable) as exc:
        plane.stop()
        print(f"fleetkeeper local: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        plane.stop()
        print(f"fleetkeeper local: cannot start on 127.0.0.1:{options.port}: {exc}", file=sys.stderr)
        return 2
    try:
        print(banner(plane), flush=True)
        if on_started is not None:
            on_started(plane)
        while not stop.wait(0.5):
            pass
        print("fleetkeeper local: stopping every replica...", flush=True)
    finally:
        plane.stop()
    print("fleetkeeper local: stopped", flush=True)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    return serve(options_from(args), quiet=args.quiet, verbose=args.verbose)


if __name__ == "__main__":
    sys.exit(main())
