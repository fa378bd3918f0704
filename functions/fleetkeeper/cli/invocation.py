"""One invocation of the CLI: the parsed arguments, the API client, where output goes, and what
every command does alike (acknowledge, emit a document, --wait, read every page)."""

from __future__ import annotations

import sys
from typing import IO, TYPE_CHECKING, Any

from fleetkeeper.cli import render
from fleetkeeper.cli.args import STRUCTURED
from fleetkeeper.cli.http import ApiError
from fleetkeeper.cli.waiting import EXIT_OK, Goal, Progress, wait_for

if TYPE_CHECKING:
    import argparse

    from fleetkeeper.cli.http import ApiClient

# Bad usage, or a request the API refused (docs/CLI.md's exit codes; EXIT_OK and EXIT_FAILED are
# fleetkeeper.cli.waiting's).
EXIT_USAGE = 2


def quote(text: str) -> str:
    """`text` as one segment of a URL's path or a query's value."""
    from urllib.parse import quote as url_quote

    return url_quote(text, safe="")


class Cli:
    """One invocation: the parsed arguments, the API client, and where output goes."""

    def __init__(
        self,
        args: argparse.Namespace,
        client: ApiClient,
        out: IO[str],
        err: IO[str],
        stdin: IO[str] | None = None,
    ) -> None:
        self.args = args
        self.client = client
        self.out = out
        self.err = err
        self.stdin = stdin if stdin is not None else sys.stdin

    def print(self, text: str) -> None:
        print(text, file=self.out)

    def note(self, text: str) -> None:
        print(text, file=self.err)

    @property
    def name(self) -> str:
        """NAME as one path segment: a name with a slash must reach the API as a bad name, not a route."""
        return quote(self.args.name)

    @property
    def structured(self) -> bool:
        """-o json or -o yaml: stdout is for the document only (acknowledgements go to stderr)."""
        return getattr(self.args, "output", "table") in STRUCTURED

    def emit(self, value: Any) -> None:
        self.print(render.structured(value, self.args.output))

    def said(self, line: str, view: dict[str, Any]) -> None:
        """The one-line acknowledgement (stderr when stdout is reserved for JSON)."""
        (self.note if self.structured else self.print)(line)

    def maybe_wait(self, view: dict[str, Any]) -> int:
        if not self.args.wait:
            if self.structured:
                self.emit(view)
            return EXIT_OK
        goal = Goal(view["name"], view["uid"], int(view["generation"]), int(view["target_version"]))
        outcome = wait_for(self.client, goal, timeout=self.args.timeout, progress=Progress(self.err))
        if self.structured:
            self.emit(outcome.view if outcome.view is not None else view)
        return self.finish(outcome.code, outcome.message)

    def finish(self, code: int, message: str) -> int:
        if code == EXIT_OK:
            self.said(message, {})
        else:
            self.note(f"fleetkeeper: {message}")
        return code

    def all_versions(self) -> dict[str, Any]:
        """GET .../versions page by page, as one body: name, target_version, every version."""
        first: dict[str, Any] | None = None
        versions: list[dict[str, Any]] = []
        token: str | None = None
        while True:
            query = "?limit=20" + (f"&next_token={quote(token)}" if token else "")
            page = self.client.request("GET", f"/v1/services/{self.name}/versions{query}").body
            first = first or page
            versions.extend(page["versions"])
            token = page.get("next_token")
            if not token:
                return {"name": first["name"], "target_version": first["target_version"], "versions": versions}

    def all_services(self) -> list[dict[str, Any]]:
        services: list[dict[str, Any]] = []
        token: str | None = None
        while True:
            query = "?limit=100" + (f"&next_token={quote(token)}" if token else "")
            page = self.client.request("GET", f"/v1/services{query}").body
            services.extend(page["services"])
            token = page.get("next_token")
            if not token:
                return services

    def service_if_there(self, name: str) -> dict[str, Any] | None:
        """One service's view; None when it went between the list and this read."""
        try:
            view: dict[str, Any] = self.client.request("GET", f"/v1/services/{quote(name)}").body
        except ApiError as exc:
            if exc.status == 404:
                return None
            raise
        return view

    def emit_item(self, value: Any, streaming: bool) -> None:
        """One document of a stream (--watch, --follow): JSON one a line, YAML `---` separated."""
        if not streaming:
            self.emit(value)
        elif self.args.output == "yaml":
            self.print("---\n" + render.structured(value, "yaml"))
        else:
            self.print(render.as_json_line(value))

    def recent_events(self, *, limit: int) -> list[dict[str, Any]]:
        page = self.client.request("GET", f"/v1/services/{self.name}/events?limit={limit}").body
        return list(page["events"])
