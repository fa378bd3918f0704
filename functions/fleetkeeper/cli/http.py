"""Talking to the fleetkeeper API: where it is, signing, and plain urllib requests.

Against API Gateway every request is SigV4-signed for `execute-api` with botocore's signer and the
standard credential chain (environment, profile, SSO, instance role...): the CLI has no
credentials of its own. Against a loopback URL (embedded mode) nothing is signed: requests carry the
bearer token of the user's running `fleetkeeper local`, found on its own (fleetkeeper.local.auth);
without one, the CLI sends nothing to a loopback port unless told to with --local, for a port on a
shared machine may be anyone's.
"""

from __future__ import annotations

import ipaddress
import json
import os
import re
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from fleetkeeper.local import auth

if TYPE_CHECKING:
    from collections.abc import Callable
    from pathlib import Path

API_URL_ENV = "FLEETKEEPER_API_URL"
DEFAULT_API_URL = "http://127.0.0.1:8470"  # `fleetkeeper local`'s default port (local/options.py)
STACK_OUTPUT = "ApiUrl"
_EXECUTE_API_HOST = re.compile(r"\.execute-api\.(?P<region>[a-z0-9-]+)\.amazonaws\.com(?:\.cn)?\Z")
# Answers worth asking again: throttling and the gateway's transient failures.
RETRYABLE = frozenset({429, 502, 503, 504})


class UsageError(Exception):
    """Bad input or configuration on the caller's side (exit code 2)."""


class Unreachable(Exception):
    """The API could not be reached or did not answer."""


class ApiError(Exception):
    """The API answered with an error; `message` is its own words."""

    def __init__(self, status: int, message: str, body: Any) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.body = body

    @property
    def code(self) -> str:
        if isinstance(self.body, dict) and isinstance(self.body.get("error"), dict):
            return str(self.body["error"].get("code", ""))
        return ""


@dataclass(frozen=True)
class Response:
    status: int
    headers: dict[str, str]
    body: Any


def is_loopback(url: str) -> bool:
    host = urlsplit(url).hostname or ""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


NO_API = (
    "no API to talk to: point at a deployed stack with --stack NAME or --api-url URL (or $FLEETKEEPER_API_URL), "
    "or start `fleetkeeper local` (in another terminal): the CLI then finds it on its own"
)


def resolve_api_url(
    api_url: str | None,
    stack: str | None,
    *,
    local: bool = False,
    environ: dict[str, str] | None = None,
    cloudformation: Callable[[], Any] | None = None,
) -> str:
    """--api-url, else $FLEETKEEPER_API_URL, else the --stack's ApiUrl output, else the user's running
    `fleetkeeper local` (its credential names its URL), else with --local embedded mode's default URL.
    There is no silent default: a port on this machine may be anyone's."""
    env = os.environ if environ is None else environ
    chosen = api_url or env.get(API_URL_ENV) or (stack_api_url(stack, cloudformation) if stack else None)
    if not chosen:
        chosen = _running_plane(env, local=local)
    url = chosen.rstrip("/")
    parts = urlsplit(url)
    if parts.scheme not in {"http", "https"} or not parts.hostname:
        raise UsageError(f"the API URL must be http(s)://host[:port][/stage], got {url!r}")
    try:
        parts.port  # noqa: B018 - urlsplit checks the port only when it is read
    except ValueError:
        raise UsageError(f"the API URL's port must be a number from 0 to 65535, got {url!r}") from None
    if parts.scheme == "http" and not is_loopback(url):
        raise UsageError(f"refusing to send requests over plain http to {parts.hostname}: use https")
    if local and not is_loopback(url):
        raise UsageError(f"--local is the embedded mode on this machine, but the API URL is {url}")
    return url


def _running_plane(environ: dict[str, str] | os._Environ[str], *, local: bool) -> str:
    """The URL of the user's one running `fleetkeeper local`; with --local and none, the default URL."""
    try:
        planes = auth.running(environ)
    except auth.CredentialProblem as exc:
        raise UsageError(str(exc)) from None
    if len(planes) == 1:
        return planes[0].api_url
    if len(planes) > 1:
        urls = ", ".join(sorted(p.api_url for p in planes))
        raise UsageError(f"several `fleetkeeper local` of yours are running ({urls}): choose one with --api-url")
    if local:
        return DEFAULT_API_URL
    raise UsageError(NO_API)


def local_token(url: str, *, local: bool = False, environ: dict[str, str] | None = None) -> str | None:
    """The bearer token for a loopback `url`: the user's running `fleetkeeper local` there has one.

    None for an AWS URL (signed instead), or, with --local, for a loopback API without a credential
    (one of the user's own, e.g. `sam local start-api`). Otherwise a UsageError: the CLI does not send
    a spec (and its secrets) to whatever process holds a loopback port."""
    if not is_loopback(url):
        return None
    try:
        credential = auth.credential_for(url, environ)
    except auth.CredentialProblem as exc:
        raise UsageError(str(exc)) from None
    if credential is not None:
        return credential.token
    if local:
        return None
    raise UsageError(
        f"no running `fleetkeeper local` of yours answers at {url} (no credential for it in "
        f"{auth.runtime_dir(environ)}): start it with `fleetkeeper local`, "
        "or pass --local to send requests there without one"
    )


def stack_api_url(stack: str, cloudformation: Callable[[], Any] | None = None) -> str:
    """The `ApiUrl` output of a deployed fleetkeeper stack (CloudFormation DescribeStacks)."""
    from botocore.exceptions import BotoCoreError, ClientError

    make_client = cloudformation or _cloudformation_client
    try:
        stacks = make_client().describe_stacks(StackName=stack)["Stacks"]
    except ClientError as exc:
        raise UsageError(f"cannot read stack {stack!r}: {exc.response['Error'].get('Message', exc)}") from exc
    except BotoCoreError as exc:
        raise UsageError(f"cannot read stack {stack!r}: {exc}") from exc
    for output in (stacks[0].get("Outputs") or []) if stacks else []:
        if output.get("OutputKey") == STACK_OUTPUT:
            return str(output["OutputValue"])
    raise UsageError(f"stack {stack!r} has no {STACK_OUTPUT} output: is it a fleetkeeper stack?")


def _cloudformation_client() -> Any:
    import boto3

    return boto3.session.Session().client("cloudformation")


def api_region(url: str, session: Any = None) -> str:
    """The AWS region of an API URL: from its host name (`<id>.execute-api.<region>.amazonaws.com`),
    else the usual AWS settings (AWS_REGION, the profile's region)."""
    match = _EXECUTE_API_HOST.search(urlsplit(url).hostname or "")
    if match:
        return match["region"]
    if session is None:
        import boto3

        session = boto3.session.Session()
    region = session.region_name
    if not region:
        raise UsageError(f"cannot tell the AWS region of {url}: set AWS_REGION")
    return str(region)


class SigV4Signer:
    """Signs requests for API Gateway (`execute-api`) with the standard credential chain."""

    def __init__(self, region: str, credentials: Any) -> None:
        self.region = region
        self.credentials = credentials

    @classmethod
    def for_url(cls, url: str) -> SigV4Signer:
        import boto3
        from botocore.exceptions import BotoCoreError

        session = boto3.session.Session()
        region = api_region(url, session)
        try:
            credentials = session.get_credentials()
        except BotoCoreError as exc:  # an expired SSO session, a broken profile...
            raise UsageError(f"cannot load AWS credentials to sign requests: {exc}") from exc
        if credentials is None:
            raise UsageError("no AWS credentials found to sign requests to the API (environment, profile, SSO or role)")
        return cls(region, credentials)

    def sign(self, method: str, url: str, headers: dict[str, str], body: bytes | None) -> dict[str, str]:
        from botocore.auth import SigV4Auth
        from botocore.awsrequest import AWSRequest

        request = AWSRequest(method=method, url=url, headers=headers, data=body or b"")
        SigV4Auth(self.credentials.get_frozen_credentials(), "execute-api", self.region).add_auth(request)
        return dict(request.headers.items())


class ApiClient:
    """JSON requests to the fleetkeeper API over urllib; errors become ApiError / Unreachable."""

    def __init__(
        self,
        base_url: str,
        *,
        signer: SigV4Signer | None = None,
        token: str | None = None,
        timeout: float = 30.0,
        retries: int = 3,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.signer = signer
        # The embedded mode's bearer token (fleetkeeper.local.auth); sent to base_url's origin only.
        self.token = token
        self.timeout = timeout
        self.retries = retries
        self.sleep = sleep

    @classmethod
    def for_url(cls, base_url: str, token: str | None = None) -> ApiClient:
        return cls(base_url, signer=None if is_loopback(base_url) else SigV4Signer.for_url(base_url), token=token)

    @property
    def embedded(self) -> bool:
        return is_loopback(self.base_url)

    def request(
        self, method: str, path: str, body: Any = None, *, raw: bool = False, headers: dict[str, str] | None = None
    ) -> Response:
        """Send one request (with `headers` added: If-Match...); retried (reads only) on connection
        errors, throttling and 502-504."""
        url = self.base_url + path
        data = None if body is None else json.dumps(body).encode()
        attempts = self.retries if method == "GET" else 1
        for attempt in range(1, attempts + 1):
            try:
                return self._send(method, url, data, raw=raw, extra=headers)
            except ApiError as exc:
                if exc.status not in RETRYABLE or attempt == attempts:
                    raise
            except Unreachable:
                if attempt == attempts:
                    raise
            self.sleep(0.5 * 2 ** (attempt - 1))
        raise AssertionError("unreachable")  # pragma: no cover

    def upload(self, url: str, method: str, headers: dict[str, str], path: Path) -> None:
        """Send a file to a URL the API handed out (a presigned S3 URL, or the embedded store's):
        not signed by us (the URL carries its own authorisation), streamed from disk."""
        parts = urlsplit(url)
        if parts.scheme != "https" and not is_loopback(url):
            raise Unreachable(f"refusing to upload over plain http to {parts.hostname}")
        size = path.stat().st_size
        headers = {**headers, "Content-Length": str(size)}
        if self.token and _same_origin(url, self.base_url):  # the embedded store's URL: the API's own
            headers["Authorization"] = f"{auth.BEARER} {self.token}"
        with path.open("rb") as body:
            request = urllib.request.Request(url, data=body, method=method, headers=headers)
            try:
                with urllib.request.urlopen(request, timeout=max(self.timeout, 600.0)) as answer:
                    answer.read()
            except urllib.error.HTTPError as exc:
                payload = exc.read()
                raise ApiError(exc.code, f"the workdir upload was refused: {_upload_error(payload)}", None) from None
            except (urllib.error.URLError, OSError) as exc:
                reason = getattr(exc, "reason", exc)
                raise Unreachable(f"cannot upload the workdir to {parts.hostname}: {reason}") from None

    def _send(
        self, method: str, url: str, data: bytes | None, *, raw: bool, extra: dict[str, str] | None = None
    ) -> Response:
        headers = {"Accept": "application/json", "User-Agent": "fleetkeeper-cli", **(extra or {})}
        if data is not None:
            headers["Content-Type"] = "application/json"
        if self.signer is not None:
            headers = self.signer.sign(method, url, headers, data)
        elif self.token:
            headers["Authorization"] = f"{auth.BEARER} {self.token}"
        request = urllib.request.Request(url, data=data, method=method, headers=headers)
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as answer:
                payload = answer.read()
                status, answer_headers = answer.status, dict(answer.headers.items())
        except urllib.error.HTTPError as exc:
            payload = exc.read()
            body = _decode(payload)
            raise ApiError(exc.code, _error_message(exc.code, body), body) from None
        except (urllib.error.URLError, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            raise Unreachable(f"cannot reach the fleetkeeper API at {self.base_url}: {reason}") from None
        return Response(status, answer_headers, payload.decode(errors="replace") if raw else _decode(payload))


def _same_origin(url: str, other: str) -> bool:
    a, b = urlsplit(url), urlsplit(other)
    return (a.scheme, (a.hostname or "").lower(), a.port) == (b.scheme, (b.hostname or "").lower(), b.port)


def _upload_error(payload: bytes) -> str:
    """S3's XML error (its Code and Message), or fleetkeeper's JSON one, in one line."""
    text = payload.decode(errors="replace")
    body = _decode(payload)
    if isinstance(body, dict):
        return _error_message(0, body)
    match = re.search(r"<Code>(.*?)</Code>.*?<Message>(.*?)</Message>", text, re.S)
    return f"{match[1]}: {match[2]}" if match else (text.strip()[:300] or "no reason given")


def _decode(payload: bytes) -> Any:
    if not payload:
        return None
    try:
        return json.loads(payload)
    except ValueError:
        return payload.decode(errors="replace")


def _error_message(status: int, body: Any) -> str:
    """The API's own message: fleetkeeper's {"error": {"message"}}, or API Gateway's {"message"}."""
    if isinstance(body, dict):
        error = body.get("error")
        if isinstance(error, dict) and error.get("message"):
            return str(error["message"])
        if body.get("message"):
            return str(body["message"])
    if isinstance(body, str) and body.strip():
        return body.strip()
    return f"HTTP {status}"
