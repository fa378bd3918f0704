"""`fleetkeeper doctor`: a smoke test of a deployed stack (or of `fleetkeeper local`), run as its user.

It makes a tiny service and takes it through what a team relies on, each step bounded in time and
reported PASS, FAIL or SKIP (fleetkeeper.cli.steps):

  1 create        POST a spec that serves HTTP (its reply names the version) with a readiness probe
  2 serve         its endpoint (the URL the API reports) answers GET / with v1's reply
  3 update        PUT v2 (another reply, and a scale-to-zero policy): it rolls; the endpoint answers v2
  4 scale to zero left without traffic, the autoscaler takes it to zero replicas; its route wakes
  5 wake          a request to the endpoint gets the wake target's 503, and soon v2's reply
  6 second owner  as the role --second-owner-role names (STS AssumeRole), a service of its own
  7 delete        both deleted, each until the API no longer has it
  8 leftovers     nothing left: the API, the endpoints, and (read-only, your credentials) the
                  instances, target groups, listeners and rules of those incarnations

After a FAIL the steps up to 6 are skipped; 7 and 8 always run for whatever was made (a clean-up
that is reported like any step). The exit code is 1 when any step failed.

The doctor is a client: it calls the API as any user does (SigV4 with your credentials on AWS, the
run's bearer token in embedded mode), GETs the endpoints over plain HTTP(S), and makes read-only AWS
calls with your credentials (fleetkeeper.cli.leftovers; docs/DEPLOY.md lists the IAM actions).
"""

from __future__ import annotations

import json
import secrets
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from typing import IO, TYPE_CHECKING, Any

from fleetkeeper.cli.doctor_options import Options, options_from
from fleetkeeper.cli.http import RETRYABLE, ApiClient, ApiError, SigV4Signer, Unreachable, UsageError, api_region
from fleetkeeper.cli.leftovers import AwsLeftovers, CheckFailed, Made
from fleetkeeper.cli.steps import Deadline, StepFailed, StepRunner, StepSkipped, wait_until
from fleetkeeper.cli.waiting import readiness

if TYPE_CHECKING:
    import argparse
    from collections.abc import Callable

    from botocore.credentials import Credentials

    from fleetkeeper.local.auth import LocalCredential

# How long the readiness probe may fail while a replica boots (initial_delay_seconds).
PROBE_GRACE_SECONDS = 600
HTTP_TIMEOUT = 5.0

# The app: GET /health -> "ok" (the probe), anything else -> $DOCTOR_REPLY, on $PORT (0.0.0.0 on
# EC2, where the probe and the load balancer come from other hosts; HOST=127.0.0.1 in embedded mode).
APP = """exec python3 -u - <<'PY'
import http.server, os

REPLY = (os.environ["DOCTOR_REPLY"] + "\\n").encode()

class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = b"ok\\n" if self.path == "/health" else REPLY
        self.send_response(200)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, fmt, *args):
        pass

http.server.ThreadingHTTPServer((os.environ.get("HOST", "0.0.0.0"), int(os.environ["PORT"])), Handler).serve_forever()
PY
"""


def doctor_spec(reply: str, *, to_zero_delay: int | None = None, autoscaled: bool = True) -> dict[str, Any]:
    """The tiny service: the stack's default instance type and image, one replica.

    Autoscaled from the start (1-2 replicas, a rate no test reaches), so the autoscaler holds its
    target of 1 when v2 allows zero: v2 rolls out at one replica, and goes to zero only once the
    endpoint has had no request for `to_zero_delay` seconds."""
    service: dict[str, Any] = {
        "readiness_probe": {"path": "/health", "initial_delay_seconds": PROBE_GRACE_SECONDS, "timeout_seconds": 2},
        "drain_seconds": 5,
    }
    if not autoscaled:
        service["replicas"] = 1
    elif to_zero_delay is None:
        service["replica_policy"] = {"min_replicas": 1, "max_replicas": 2, "target_qps_per_replica": 1000}
    else:
        service["replica_policy"] = {
            "min_replicas": 0,
            "max_replicas": 1,
            "target_qps_per_replica": 1000,
            "upscale_delay_seconds": 0,
            "downscale_delay_seconds": to_zero_delay,
            "downscale_to_zero_delay_seconds": to_zero_delay,
        }
    return {
        "service": service,
        "envs": {"DOCTOR_REPLY": reply},
        "update": {"mode": "rolling", "max_surge": 1, "max_unavailable": 0},
        "run": APP,
    }


@dataclass(frozen=True)
class Answer:
    """One GET of an endpoint: its status, body and headers, or why there was none."""

    status: int | None
    body: str = ""
    headers: dict[str, str] = field(default_factory=dict)  # names lower-cased
    error: str = ""

    def describe(self) -> str:
        if self.status is None:
            return self.error
        text = self.body.strip().replace("\n", " ")
        return f"HTTP {self.status} {text[:120]!r}"

    @property
    def error_code(self) -> str:
        try:
            return str(json.loads(self.body)["error"]["code"])
        except (ValueError, KeyError, TypeError):
            return ""


def http_get(url: str, timeout: float = HTTP_TIMEOUT) -> Answer:
    """GET `url` as any client of the service would (no credential: endpoints take none)."""
    request = urllib.request.Request(url, headers={"User-Agent": "fleetkeeper-doctor"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as answer:
            return Answer(answer.status, answer.read().decode(errors="replace"), _headers(answer.headers.items()))
    except urllib.error.HTTPError as exc:
        return Answer(exc.code, exc.read().decode(errors="replace"), _headers(exc.headers.items()))
    except (urllib.error.URLError, OSError) as exc:
        return Answer(None, error=f"no answer: {getattr(exc, 'reason', exc)}")


def _headers(items: Any) -> dict[str, str]:
    """Header names lower-cased: HTTP's are case-insensitive, whatever a load balancer sends."""
    return {str(k).lower(): str(v) for k, v in items}


@dataclass
class Account:
    """Where the doctor's own AWS reads go: boto3 clients with the user's credentials (on AWS), or
    the embedded mode's in-memory AWS with its run's key; the stack's id and load balancer."""

    client: Callable[[str], Any]
    stack_id: str | None
    load_balancer_dns: str | None
    embedded: bool


@dataclass
class Owner:
    """A caller of the API (you, or the second role): its client, the names it asked to create, the
    incarnations the API answered with, and their endpoints once seen."""

    label: str
    client: ApiClient
    names: list[str] = field(default_factory=list)
    made: dict[str, Made] = field(default_factory=dict)
    endpoints: dict[str, str] = field(default_factory=dict)


class Doctor:
    def __init__(
        self,
        client: ApiClient,
        account: Account,
        options: Options,
        *,
        out: IO[str],
        err: IO[str],
        suffix: str | None = None,
        get: Callable[[str], Answer] = http_get,
        sleep: Callable[[float], None] = time.sleep,
        clock: Callable[[], float] = time.monotonic,
        credential: LocalCredential | None = None,
        client_as: Callable[[Credentials], ApiClient] | None = None,
    ) -> None:
        self.account = account
        self.options = options
        self.err = err
        self.get = get
        self.sleep = sleep
        self.credential = credential
        # How the second owner's client is made from its assumed credentials (tests: a bridge that
        # reports that role's session as the caller, as API Gateway does).
        self.client_as = client_as
        self.name = f"fk-doctor-{suffix or secrets.token_hex(3)}"
        self.second_name = f"{self.name}-b"
        self.you = Owner("you", client)
        self.second: Owner | None = None
        self.runner = StepRunner(out, clock=clock)
        # Each created service's owner, as the API recorded it.
        self._owners: dict[str, str] = {}
        self._delete_failed = False
        self._noted = ""

    # -- the run ---------------------------------------------------------------------------------------

    def run(self) -> int:
        out = self.runner.out
        if self.account.embedded:
            where = "embedded mode"
        else:
            where = (
                f"stack {self.account.stack_id}" if self.account.stack_id else "no --stack: no AWS resources to check"
            )
        names = f"{self.name}, {self.second_name}" if self.options.second_owner_role else self.name
        out.write(f"fleetkeeper doctor: {self.you.client.base_url} ({where}); services {names}\n")
        timeouts = self.options.timeouts
        steps: list[tuple[str, float, Callable[[Deadline], str]]] = [
            ("create", timeouts["serve"], self.create),
            ("serve", timeouts["serve"], self.serve),
            ("update", timeouts["update"], self.update),
            ("scale to zero", timeouts["zero"], self.scale_to_zero),
            ("wake", timeouts["wake"], self.wake),
            ("second owner", timeouts["second"], self.second_owner),
        ]
        for title, timeout, action in steps:
            if self.runner.failed:
                self.runner.skip(title, "not run: an earlier step failed")
                continue
            self.runner.run(title, timeout, action)
        # The clean-up runs whatever happened before (after a Ctrl-C too).
        self.runner.run("delete", timeouts["delete"], self.delete)
        self.runner.run("leftovers", timeouts["leftovers"], self.leftovers)
        verdict = "FAILED" if self.runner.failed else "passed"
        out.write(f"doctor {verdict}: {self.runner.summary()}\n")
        return self.runner.exit_code()

    # -- steps -----------------------------------------------------------------------------------------

    def create(self, deadline: Deadline) -> str:
        return self._create(self.you, self.name, doctor_spec(self._reply(self.name, 1)))

    def serve(self, deadline: Deadline) -> str:
        endpoint, answer, _ = self._until_reply(deadline, self.you, self.name, self._reply(self.name, 1))
        # A replica can answer before the reconciler has recorded it READY (its probe is the next
        # pass's work), so the step also waits for the status the control plane promises.
        last = "-"

        def ready() -> dict[str, Any] | None:
            nonlocal last
            view = self._poll(self.you, self.name, "serve", deadline)
            if view is None:
                return None
            last = f"{view.get('status')}: {view.get('status_message') or '-'}"
            return view if view.get("status") == "READY" else None

        view = wait_until(
            deadline,
            ready,
            expected=f"{self.name} to be recorded READY after its endpoint answered",
            seen=lambda: last,
            interval=self.options.interval,
            sleep=self.sleep,
        )
        return f"GET {endpoint}/ answered {answer.describe()} ({view['status']} v{view['target_version']})"

    def update(self, deadline: Deadline) -> str:
        spec = doctor_spec(self._reply(self.name, 2), to_zero_delay=self.options.to_zero_delay)
        view = self.you.client.request("PUT", f"/v1/services/{self.name}", {"spec": spec}).body
        if view.get("changed") is False or int(view.get("target_version", 0)) != 2:
            raise StepFailed(
                f"expected the update to write v2; the API answered v{view.get('target_version')} "
                f"(changed: {view.get('changed')})"
            )
        seen: dict[str, int] = {}
        endpoint, answer, _ = self._until_reply(deadline, self.you, self.name, self._reply(self.name, 2), tally=seen)
        during = ", ".join(f"{count}x {what}" for what, count in sorted(seen.items())) or "nothing else"
        return f"v2 rolled out: GET {endpoint}/ answered {answer.describe()}; during the rollout: {during}"

    def scale_to_zero(self, deadline: Deadline) -> str:
        view: dict[str, Any] = {}

        def at_zero() -> dict[str, Any] | None:
            nonlocal view
            polled = self._poll(self.you, self.name, "scale to zero", deadline)
            if polled is None:
                return None
            view = polled
            scaling = view.get("autoscaling") or {}
            self._note("scale to zero", deadline, _scaling_line(view))
            if not view.get("replicas") and scaling.get("target_replicas") == 0 and scaling.get("waking"):
                return view
            return None

        wait_until(
            deadline,
            at_zero,
            expected=f"{self.name} at 0 replicas with its route on the wake target (no request for "
            f"{self.options.to_zero_delay}s)",
            seen=lambda: _scaling_line(view),
            interval=max(self.options.interval, 1.0),
            sleep=self.sleep,
        )
        return f"0 replicas, target 0, waking route ({_scaling_line(view)})"

    def wake(self, deadline: Deadline) -> str:
        endpoint = self.you.endpoints[self.name]
        expected = self._reply(self.name, 2)
        first = self.get(endpoint + "/")
        if first.status != 503 or first.error_code != "waking":
            raise StepFailed(
                f"expected the wake target's answer (503, error code `waking`, Retry-After) from {endpoint} at zero "
                f"replicas; got {first.describe()}"
            )
        retry_after = first.headers.get("retry-after", "?")
        requests, last = 1, first

        def served() -> Answer | None:
            nonlocal requests, last
            last = self.get(endpoint + "/")
            requests += 1
            self._note("wake", deadline, f"GET {endpoint}/ -> {last.describe()}")
            return last if last.status == 200 and last.body.strip() == expected else None

        answer = wait_until(
            deadline,
            served,
            expected=f"GET {endpoint}/ to answer 200 {expected!r} once woken",
            seen=lambda: last.describe(),
            interval=self.options.interval,
            sleep=self.sleep,
        )
        return (
            f"503 waking (Retry-After {retry_after}s), then {answer.describe()} {deadline.elapsed():.1f}s after the "
            f"first request ({requests} requests)"
        )

    def second_owner(self, deadline: Deadline) -> str:
        role = self.options.second_owner_role
        if not role:
            raise StepSkipped(
                "no --second-owner-role ARN: the owners' isolation is not tried (give a role you may assume)"
            )
        client, expected_owner, session = self._assume(role)
        self.second = Owner(f"role {role}", client)
        reply = self._reply(self.second_name, 1)
        detail = self._create(self.second, self.second_name, doctor_spec(reply, autoscaled=False))
        ownership = self._ownership(expected_owner, session)
        endpoint, answer, _ = self._until_reply(deadline, self.second, self.second_name, reply)
        return f"{detail}; assumed {session}; {ownership}; GET {endpoint}/ answered {answer.describe()}"

    def _ownership(self, expected: str | None, session: str) -> str:
        """The second service's owner as the API recorded it, against the role's (on AWS), and
        whether that role sees your service: 404 unless it administers the stack or was granted it."""
        owner = self._owners.get(self.second_name, "")
        if expected is None:
            return (
                f"owner {owner or '-'}: embedded mode gives every request its one user's identity, so the "
                "role's ownership is checked on AWS only"
            )
        if owner != expected:
            raise StepFailed(
                f"expected {self.second_name}'s owner to be {expected} (the role of {session}); the API says "
                f"{owner or 'none'}"
            )
        if self._owners.get(self.name) == owner:
            raise StepFailed(f"the second role is the owner of {self.name} too ({owner}): give a role other than yours")
        assert self.second is not None
        try:
            self.second.client.request("GET", f"/v1/services/{self.name}")
            sees = f"it sees {self.name} too (an administrator of the stack, or granted)"
        except ApiError as exc:
            if exc.status != 404:
                raise
            sees = f"{self.name} does not exist for it (404)"
        return f"owned by {owner}; {sees}"

    def delete(self, deadline: Deadline) -> str:
        owners = [o for o in (self.you, self.second) if o is not None and o.names]
        if not owners:
            return "nothing was created"
        problems: list[str] = []
        deleting: list[tuple[Owner, str]] = []
        for owner in owners:
            for name in owner.names:
                try:
                    owner.client.request("DELETE", f"/v1/services/{name}")
                    deleting.append((owner, name))
                except ApiError as exc:
                    if exc.status != 404:
                        problems.append(f"DELETE {name} as {owner.label}: HTTP {exc.status} {exc.message}")
                except Exception as exc:  # the next one is tried all the same
                    problems.append(f"DELETE {name} as {owner.label}: {exc}")
        gone: list[str] = []
        for owner, name in deleting:
            try:
                wait_until(
                    deadline,
                    lambda owner=owner, name=name: self._gone(owner, name),  # type: ignore[misc]
                    expected=f"{name} to be gone (404)",
                    seen=lambda owner=owner, name=name: self._status_of(owner, name),  # type: ignore[misc]
                    interval=max(self.options.interval, 1.0),
                    sleep=self.sleep,
                )
                gone.append(f"{name} ({deadline.elapsed():.0f}s)")
            except StepFailed as exc:
                problems.append(str(exc))
        if problems:
            self._delete_failed = True
            raise StepFailed("; ".join(problems))
        return "deleted and gone: " + ", ".join(gone) if gone else "nothing to delete (never created)"

    def leftovers(self, deadline: Deadline) -> str:
        owners = [o for o in (self.you, self.second) if o is not None and o.made]
        if not owners:
            return "nothing was created"
        made = [m for o in owners for m in o.made.values()]
        checks: list[str] = []
        left: list[str] = []

        def clean() -> bool | None:
            nonlocal left, checks
            left, checks = self._left(owners, made)
            self._note("leftovers", deadline, "; ".join(left) or "nothing left")
            return True if not left else None

        # After a failed delete, what is left is known to be there: say it at once, not after waiting.
        patience = Deadline(0.0, self.runner.clock) if self._delete_failed else deadline
        wait_until(
            patience,
            clean,
            expected="nothing of the doctor's services left",
            seen=lambda: "; ".join(left),
            # On AWS each round is a dozen Describe calls: every 5 s is often enough.
            interval=self.options.interval if self.account.embedded else max(self.options.interval, 5.0),
            sleep=self.sleep,
        )
        return "nothing left: " + "; ".join(checks)

    # -- what the steps share --------------------------------------------------------------------------

    def _reply(self, name: str, version: int) -> str:
        return f"{name} v{version}"

    def _create(self, owner: Owner, name: str, spec: dict[str, Any]) -> str:
        owner.names.append(name)  # asked for: deleted in the end even if the answer never came
        view = owner.client.request("POST", "/v1/services", {"name": name, "spec": spec}).body
        owner.made[name] = Made(name, str(view["uid"]))
        self._owners[name] = str(view.get("owner") or "")
        owned = view.get("owner") or "-"
        return f"{name} created as {owner.label}: v{view['target_version']}, uid {view['uid']}, owner {owned}"

    def _view(self, owner: Owner, name: str) -> dict[str, Any]:
        view: dict[str, Any] = owner.client.request("GET", f"/v1/services/{name}").body
        made = owner.made.get(name)
        if made is not None and view.get("uid") != made.uid:
            raise StepFailed(f"{name} was deleted and created again by someone else (uid {view.get('uid')})")
        return view

    def _until_reply(
        self,
        deadline: Deadline,
        owner: Owner,
        name: str,
        expected: str,
        *,
        tally: dict[str, int] | None = None,
    ) -> tuple[str, Answer, dict[str, Any]]:
        """Poll the service until its endpoint answers GET / with `expected`: (endpoint, answer, view).
        A FAILED service fails at once; `tally` counts the other answers seen meanwhile."""
        last = "no answer yet"
        step = "update" if tally is not None else "serve"
        result: tuple[str, Answer, dict[str, Any]] | None = None

        def answered() -> tuple[str, Answer, dict[str, Any]] | None:
            nonlocal last, result
            polled = self._poll(owner, name, step, deadline)
            if polled is None:
                return None
            view = polled
            version = int(view.get("target_version", 0))
            state = f"{view.get('status')} v{version} ({readiness(view, version)})"
            if view.get("status") == "FAILED":
                raise StepFailed(f"expected {name} to serve {expected!r}; it FAILED: {view.get('status_message')}")
            endpoint = view.get("endpoint")
            if (
                not endpoint
                and self.account.stack_id
                and not self.account.embedded
                and not self.account.load_balancer_dns
            ):
                raise StepFailed(
                    f"expected {name} to get an endpoint; the stack has no LoadBalancerDnsName output "
                    "(LoadBalancer=none): its services have none, and the doctor has nothing to call"
                )
            if not endpoint:
                last = f"{state}, no endpoint yet: {view.get('status_message') or '-'}"
                self._note(step, deadline, last)
                return None
            owner.endpoints[name] = str(endpoint)
            answer = self.get(f"{endpoint}/")
            if answer.status == 200 and answer.body.strip() == expected:
                result = (str(endpoint), answer, view)
                return result
            if tally is not None:
                tally[answer.describe()] = tally.get(answer.describe(), 0) + 1
            last = f"{state}; GET {endpoint}/ -> {answer.describe()}"
            if answer.status is None and view.get("status") == "READY":
                # Served, yet not to us: the usual cause is where the doctor runs from.
                last += (
                    " (READY, but its endpoint does not answer here: an internal load balancer answers inside its "
                    "VPC only, and only LoadBalancerAllowedCidr; docs/DEPLOY.md, Smoke test)"
                )
            self._note(step, deadline, last)
            return None

        return wait_until(
            deadline,
            answered,
            expected=f"{name}'s endpoint to answer GET / with 200 {expected!r}",
            seen=lambda: last,
            interval=self.options.interval,
            sleep=self.sleep,
        )

    def _poll(self, owner: Owner, name: str, step: str, deadline: Deadline) -> dict[str, Any] | None:
        """The service's view, or None after a blip (unreachable, throttled, a gateway error): while
        waiting, a blip is no verdict; the step's timeout is."""
        try:
            return self._view(owner, name)
        except Unreachable as exc:
            self._note(step, deadline, str(exc))
        except ApiError as exc:
            if exc.status not in RETRYABLE:
                raise
            self._note(step, deadline, f"the API answered {exc.status}: {exc.message}")
        return None

    def _gone(self, owner: Owner, name: str) -> bool | None:
        try:
            view = owner.client.request("GET", f"/v1/services/{name}").body
        except ApiError as exc:
            if exc.status == 404:
                return True
            if exc.status in RETRYABLE:
                return None
            raise
        except Unreachable:
            return None
        made = owner.made.get(name)
        return True if made is not None and view.get("uid") != made.uid else None

    def _status_of(self, owner: Owner, name: str) -> str:
        try:
            view = owner.client.request("GET", f"/v1/services/{name}").body
        except ApiError as exc:
            return f"HTTP {exc.status} {exc.message}"
        except Unreachable as exc:
            return str(exc)
        return f"{view.get('status')} ({view.get('lifecycle')}), {len(view.get('replicas') or [])} replica(s) left"

    def _left(self, owners: list[Owner], made: list[Made]) -> tuple[list[str], list[str]]:
        """(what is left, what was checked)."""
        left: list[str] = []
        checks = ["the API (404 for each, and not listed)"]
        for owner in owners:
            listed = {str(s.get("name")): str(s.get("uid")) for s in self._listing(owner)}
            for one in owner.made.values():
                if not self._gone(owner, one.name):
                    left.append(f"{one.name} still in the API (as {owner.label})")
                if listed.get(one.name) == one.uid:
                    left.append(f"{one.name} still listed by GET /v1/services (as {owner.label})")
        endpoints = {name: url for owner in owners for name, url in owner.endpoints.items()}
        for name, url in endpoints.items():
            answer = self.get(url + "/")
            if answer.status == 200 and answer.body.strip().startswith(f"{name} v"):
                left.append(f"{url} still answers as {name}: {answer.describe()}")
        if endpoints:
            checks.append(f"the endpoints ({', '.join(sorted(endpoints.values()))} answer no more)")
        if self.credential is not None:
            left.extend(self._embedded_left(made))
            checks.append("the embedded balancer's ports and the replicas' log files")
        if self.account.stack_id is None:
            checks.append("not the AWS resources: give --stack NAME for the instances, target groups and routes")
        else:
            account = "the in-memory AWS" if self.account.embedded else "AWS, with your credentials"
            try:
                found = AwsLeftovers(
                    self.account.client("ec2"),
                    self.account.client("elbv2"),
                    self.account.stack_id,
                    self.account.load_balancer_dns,
                ).find(made)
            except CheckFailed as exc:
                raise StepFailed(str(exc)) from None
            left.extend(found)
            uids = ", ".join(m.uid for m in made)
            checks.append(
                f"{account}: instances tagged fleetkeeper:stack={self.account.stack_id} and fleetkeeper:uid in "
                f"{{{uids}}} not terminated, target groups fk-{self.account.stack_id}-<uid>, listeners and rules of "
                "the stack's load balancers for those uids or names"
            )
        return left, checks

    def _embedded_left(self, made: list[Made]) -> list[str]:
        """In embedded mode: the local balancer's open ports and each incarnation's replica logs
        (the stream pump's cleanup removes them with the incarnation)."""
        left = []
        info = self.you.client.request("GET", "/_local/info").body
        endpoints = info.get("endpoints") or {}
        for one in made:
            if one.name in endpoints:
                left.append(f"the embedded balancer still has a port for {one.name}: {endpoints[one.name]}")
            logs = self.you.client.request("GET", f"/_local/logs/{one.name}?uid={one.uid}").body
            if logs.get("logs"):
                left.append(f"{len(logs['logs'])} replica log file(s) of {one.name} (uid {one.uid})")
        return left

    def _listing(self, owner: Owner) -> list[dict[str, Any]]:
        services: list[dict[str, Any]] = []
        token = ""
        while True:
            query = "?limit=100" + (f"&next_token={urllib.parse.quote(token, safe='')}" if token else "")
            page = owner.client.request("GET", f"/v1/services{query}").body
            services.extend(page.get("services", []))
            token = str(page.get("next_token") or "")
            if not token:
                return services

    def _assume(self, role: str) -> tuple[ApiClient, str | None, str]:
        """The second owner's API client (its credentials from STS AssumeRole, signed as the role),
        the owner the API should record for it (None in embedded mode), and the session's ARN."""
        from botocore.credentials import Credentials
        from botocore.exceptions import BotoCoreError, ClientError

        from fleetkeeper.owners.principals import canonical_caller

        session_name = self.name  # in CloudTrail: which doctor run assumed it
        try:
            answer = self.account.client("sts").assume_role(RoleArn=role, RoleSessionName=session_name)
        except ClientError as exc:
            error = exc.response.get("Error", {})
            raise StepFailed(
                f"sts:AssumeRole of {role} was refused: {error.get('Code')}: {error.get('Message')} (its trust "
                "policy must let your identity assume it)"
            ) from None
        except BotoCoreError as exc:
            raise StepFailed(f"sts:AssumeRole of {role} failed: {exc}") from None
        session = str(answer["AssumedRoleUser"]["Arn"])
        raw = answer["Credentials"]
        credentials = Credentials(raw["AccessKeyId"], raw["SecretAccessKey"], raw["SessionToken"])
        client = (self.client_as or self._client_as)(credentials)
        # In embedded mode every request is its one user's (see _client_as): no owner to expect.
        return client, None if self.account.embedded else canonical_caller(session), session

    def _client_as(self, credentials: Credentials) -> ApiClient:
        """An API client acting with `credentials`: on AWS every request SigV4-signed with them (API
        Gateway then reports the role's session as the caller). The embedded API takes its run's
        bearer token instead, and gives every request its one user's identity: the assumed
        credentials cannot change whom it sees."""
        base = self.you.client.base_url
        if self.account.embedded:
            return ApiClient(base, token=self.you.client.token)
        return ApiClient(base, signer=SigV4Signer(api_region(base), credentials))

    def _note(self, step: str, deadline: Deadline, line: str) -> None:
        """Progress on stderr, one line each time what a step sees changes (CI logs stay short)."""
        text = f"{step}: {line}"
        if text != self._noted:
            self._noted = text
            self.err.write(f"  [{deadline.elapsed():5.0f}s] {text}\n")
            self.err.flush()


def _scaling_line(view: dict[str, Any]) -> str:
    if not view:
        return "no answer yet"
    scaling = view.get("autoscaling") or {}
    replicas = view.get("replicas") or []
    states = ", ".join(f"{r.get('replica_id')} v{r.get('version')} {r.get('status')}" for r in replicas) or "none"
    rate = scaling.get("request_rate")
    return (
        f"target {scaling.get('target_replicas', '?')}, replicas: {states}, "
        f"rate {'-' if rate is None else f'{rate:g}/s'}, waking {bool(scaling.get('waking'))}"
    )


# -- the command ---------------------------------------------------------------------------------------


def account_for(client: ApiClient, stack: str | None, credential: LocalCredential | None) -> Account:
    """The doctor's AWS reads: the in-memory AWS of `fleetkeeper local` (its run's key id), else AWS
    with the standard credential chain in the API's region, the stack's id read from CloudFormation."""
    import boto3

    if credential is not None and credential.aws_endpoint:
        from fleetkeeper.settings import LOCAL_STACK_ID

        def local_client(service: str) -> Any:
            return boto3.client(
                service,  # type: ignore[call-overload]
                endpoint_url=credential.aws_endpoint,
                region_name="us-east-1",
                aws_access_key_id=credential.aws_access_key_id,
                aws_secret_access_key="local",
            )

        return Account(local_client, LOCAL_STACK_ID, None, embedded=True)
    session = boto3.session.Session()

    def aws_client(service: str) -> Any:
        # The API's region (asked only when a client is made: `--api-url` alone may need none).
        return session.client(service, region_name=api_region(client.base_url, session))  # type: ignore[call-overload]

    stack_id, dns = _stack(aws_client, stack) if stack else (None, None)
    return Account(aws_client, stack_id, dns, embedded=False)


def _stack(client: Callable[[str], Any], stack: str) -> tuple[str, str | None]:
    """The stack's id (what its resources are tagged and named with: the last group of its StackId's
    UUID, as template.yaml derives FLEETKEEPER_STACK_ID) and its LoadBalancerDnsName output."""
    from botocore.exceptions import BotoCoreError, ClientError

    try:
        described = client("cloudformation").describe_stacks(StackName=stack)["Stacks"][0]
    except (ClientError, BotoCoreError, IndexError) as exc:
        raise UsageError(f"cannot read stack {stack!r} (cloudformation:DescribeStacks): {exc}") from None
    stack_id = str(described["StackId"]).split("/")[2].split("-")[4]
    outputs = {o.get("OutputKey"): o.get("OutputValue") for o in described.get("Outputs") or []}
    dns = outputs.get("LoadBalancerDnsName")
    return stack_id, str(dns) if dns else None


def run_doctor(args: argparse.Namespace, client: ApiClient, out: IO[str], err: IO[str]) -> int:
    from fleetkeeper.local import auth

    credential = auth.credential_for(client.base_url) if client.embedded else None
    options = options_from(args, embedded=credential is not None)
    account = account_for(client, args.stack, credential)
    return Doctor(client, account, options, out=out, err=err, credential=credential).run()
