"""What the dashboard reads and does, through the fleetkeeper API as the CLI calls it.

The client is the CLI's (fleetkeeper.cli.http.ApiClient): against the embedded mode it carries the
run's bearer token, against a deployed stack every request is SigV4-signed with the user's own
credentials. So the dashboard sees and may change exactly what its user may through the API (the
API's access rules, unchanged): a service the user may not read is a 404 here too, an action the
user may not take is the API's 403, shown as the API words it.

Replica logs come from where `fleetkeeper logs` reads them: the embedded API's `/_local/logs` (behind
the same credential), or the stack's CloudWatch log group with the user's own credentials.

Synchronous (urllib): the server runs each call in a worker thread.
"""

from __future__ import annotations

import io
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from fleetkeeper.cli.http import ApiError

if TYPE_CHECKING:
    from fleetkeeper.cli.http import ApiClient

# A service page's events: the newest the API keeps (fleetkeeper.service_events.EVENTS_KEPT).
EVENTS_SHOWN = 100
# How far back a replica's log tail looks on AWS (CloudWatch Logs is read from a start time).
CLOUD_LOG_SECONDS = 3600


class ActionRefused(Exception):
    """An action the dashboard will not send (the reason is for the person who asked)."""


@dataclass
class Backend:
    client: ApiClient
    # The stack's replica log group (AWS only); None in embedded mode or when it is not known.
    log_group: str | None = None

    @property
    def embedded(self) -> bool:
        return self.client.embedded

    # -- reads --

    def services(self) -> list[dict[str, Any]]:
        """Every service the caller may read, following the list's pages."""
        found: list[dict[str, Any]] = []
        token: str | None = None
        while True:
            path = "/v1/services?limit=100" + (f"&next_token={quote(token, safe='')}" if token else "")
            page = self.client.request("GET", path).body
            found.extend(page["services"])
            token = page.get("next_token")
            if not token:
                return found

    def service(self, name: str) -> dict[str, Any]:
        body: dict[str, Any] = self.client.request("GET", f"/v1/services/{quote(name)}").body
        return body

    def versions(self, name: str) -> list[dict[str, Any]]:
        """Every version, oldest first."""
        found: list[dict[str, Any]] = []
        token: str | None = None
        while True:
            path = f"/v1/services/{quote(name)}/versions?limit=20" + (
                f"&next_token={quote(token, safe='')}" if token else ""
            )
            page = self.client.request("GET", path).body
            found.extend(page["versions"])
            token = page.get("next_token")
            if not token:
                return found

    def events(self, name: str) -> list[dict[str, Any]]:
        """The newest events, newest first."""
        body = self.client.request("GET", f"/v1/services/{quote(name)}/events?limit={EVENTS_SHOWN}").body
        events: list[dict[str, Any]] = body["events"]
        return events

    def metrics(self, name: str, minutes: int = 30) -> dict[str, Any]:
        body: dict[str, Any] = self.client.request("GET", f"/v1/services/{quote(name)}/metrics?minutes={minutes}").body
        return body

    def log_tail(self, view: dict[str, Any], replica_id: int, lines: int) -> str:
        """The last `lines` lines of one replica's log (as its service wrote them: escape before showing)."""
        name, uid = str(view["name"]), str(view["uid"])
        if self.embedded:
            path = f"/_local/logs/{quote(name)}/{replica_id}?uid={quote(uid, safe='')}&tail={lines}"
            try:
                text: str = self.client.request("GET", path, raw=True).body
            except ApiError as exc:
                if exc.status == 404:
                    return ""
                raise
            return text
        if self.log_group is None:
            raise ActionRefused(
                "no log group known: start the dashboard with --stack NAME (its ReplicaLogGroup output) or --log-group"
            )
        from fleetkeeper.cli import cloudlogs

        out = io.StringIO()
        cloudlogs.print_logs(
            cloudlogs.logs_client(),
            self.log_group,
            name,
            uid,
            replica=replica_id,
            since_seconds=CLOUD_LOG_SECONDS,
            follow=False,
            out=out,
            now=time.time,
            owner=str(view.get("owner") or ""),
        )
        return "\n".join(out.getvalue().splitlines()[-lines:])

    # -- actions (the API decides whether the caller may) --

    def rollback(self, name: str, version: int, generation: int) -> dict[str, Any]:
        """Roll back to `version`, only if the service is still at `generation` (what the user confirmed)."""
        return self._write("POST", f"/v1/services/{quote(name)}/rollback", {"version": version}, generation)

    def scale(self, name: str, replicas: int, generation: int) -> dict[str, Any]:
        """A fixed-count service's target version, with `replicas` replicas: a new version that changes
        the count only (taken in place, no replica replaced: fleetkeeper.spec.changes)."""
        view = self.service(name)
        if int(view["generation"]) != generation:
            raise ActionRefused(
                f"{name} changed since you confirmed (generation {view['generation']}, not {generation}): look again"
            )
        spec = scaled_spec(view.get("spec") or {}, replicas)
        return self._write("PUT", f"/v1/services/{quote(name)}", {"spec": spec}, generation)

    def terminate(self, name: str, replica_id: int, uid: str) -> dict[str, Any]:
        """Ask for one replica to go (`fleetkeeper down NAME --replica-id N`): the reconciler drains it and
        replaces it. No If-Match: what the user confirmed is this replica, not a spec, and a service never
        reuses a replica id; `uid` (the service the page showed) keeps a service deleted and made again
        under the same name from losing its replica of that id. The answer's `changed` is false for a
        replica asked for, or leaving, already."""
        view = self.service(name)
        if str(view["uid"]) != uid:
            raise ActionRefused(f"{name} was deleted and made again since you confirmed: look again")
        answer: dict[str, Any] = self.client.request("DELETE", f"/v1/services/{quote(name)}/replicas/{replica_id}").body
        return answer

    def _write(self, method: str, path: str, body: dict[str, Any], generation: int) -> dict[str, Any]:
        headers = {"If-Match": f'"{generation}"'}
        answer: dict[str, Any] = self.client.request(method, path, body, headers=headers).body
        return answer


def scaled_spec(spec: dict[str, Any], replicas: int) -> dict[str, Any]:
    """`spec` with its fixed replica count set to `replicas`; ActionRefused for one the dashboard must
    not rewrite: an autoscaled spec (its autoscaler owns the count), or one with secrets (the API never
    answers their values, and a new version must carry them: `fleetkeeper update` asks for them)."""
    if spec.get("secrets"):
        names = ", ".join(sorted(spec["secrets"]))
        raise ActionRefused(
            f"this service has secrets ({names}): the API never shows their values, so the dashboard cannot "
            "make a version with them; scale it with `fleetkeeper update NAME SPEC.yaml --secret ...`"
        )
    section = dict(spec.get("service") or {})
    policy = section.get("replica_policy")
    if isinstance(policy, dict) and policy.get("target_qps_per_replica") is not None:
        raise ActionRefused("this service autoscales: its autoscaler sets the replica count")
    if isinstance(policy, dict):
        policy = {**policy, "min_replicas": replicas}
        if policy.get("max_replicas") is not None:
            policy["max_replicas"] = replicas
        section["replica_policy"] = policy
    else:
        section["replicas"] = replicas
    return {**spec, "service": section}
