"""Issue 23: each service answers only to its owners, on every route; issue 22: idempotency keys per caller.

Callers are API Gateway identities (`requestContext.identity.userArn`) as AWS_IAM auth reports them:
sessions of team A's and team B's CI roles, an IAM user, an administrator matched by a pattern.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from fleetkeeper import aws
from fleetkeeper.store import keys
from fleetkeeper.store.codec import to_raw
from tests.support import TABLE
from tests.support.handler_client import HandlerClient
from tests.support.specs import hello_spec

ACCOUNT = "123456789012"
TEAM_A = f"arn:aws:iam::{ACCOUNT}:role/team-a-ci"
TEAM_B = f"arn:aws:iam::{ACCOUNT}:role/team-b-ci"


def session(role: str, name: str = "run-1") -> str:
    """The ARN API Gateway reports for a session of `role` (arn:aws:iam::ACCT:role/NAME)."""
    return role.replace(":iam::", ":sts::").replace(":role/", ":assumed-role/") + f"/{name}"


@pytest.fixture
def a(api: HandlerClient) -> HandlerClient:
    return api.as_(session(TEAM_A))


@pytest.fixture
def b(api: HandlerClient) -> HandlerClient:
    return api.as_(session(TEAM_B))


@pytest.fixture
def admin(api: HandlerClient, monkeypatch: pytest.MonkeyPatch) -> HandlerClient:
    monkeypatch.setenv("FLEETKEEPER_ADMIN_PRINCIPALS", f"arn:aws:iam::{ACCOUNT}:role/platform-*")
    return api.as_(session(f"arn:aws:iam::{ACCOUNT}:role/platform-admins", "alice"))


def create(client: HandlerClient, name: str = "web", **spec: Any) -> dict[str, Any]:
    answer = client.post("/v1/services", {"name": name, "spec": hello_spec(**spec)})
    assert answer.status == 201, answer.body
    return dict(answer.body)


def grant(client: HandlerClient, name: str, principal: str, mode: str) -> Any:
    return client.post(f"/v1/services/{name}/access", {"add": [{"principal": principal, "mode": mode}]})


def names(client: HandlerClient, limit: int = 100) -> list[str]:
    """Every service the caller's list shows, following next_token to the end."""
    seen: list[str] = []
    token = None
    for _ in range(1000):
        page = client.get(f"/v1/services?limit={limit}" + (f"&next_token={token}" if token else ""))
        assert page.status == 200, page.body
        assert len(page.body["services"]) <= limit
        seen += [s["name"] for s in page.body["services"]]
        token = page.body["next_token"]
        if token is None:
            return seen
    raise AssertionError("the pages never ended")


# Every route that names a service, as (method, path, body).
ROUTES: list[tuple[str, str, Any]] = [
    ("GET", "/v1/services/web", None),
    ("GET", "/v1/services/web/versions", None),
    ("GET", "/v1/services/web/events", None),
    ("PUT", "/v1/services/web", {"spec": hello_spec(envs={"V": "2"})}),
    ("POST", "/v1/services/web/rollback", {"version": 1}),
    ("POST", "/v1/services/web/access", {"add": [{"principal": TEAM_B, "mode": "write"}]}),
    ("DELETE", "/v1/services/web", None),
]


# --- owners ------------------------------------------------------------------------------------------


def test_a_service_belongs_to_the_role_that_created_it_not_to_the_session(a: HandlerClient, api: HandlerClient) -> None:
    created = create(a)
    assert created["owner"] == TEAM_A
    assert created["access"] == []
    # The next CI run is another session of the same role: the same owner.
    next_run = api.as_(session(TEAM_A, "run-2"))
    assert next_run.get("/v1/services/web").body["owner"] == TEAM_A
    assert next_run.put("/v1/services/web", {"spec": hello_spec(envs={"V": "2"})}).status == 200
    assert next_run.delete("/v1/services/web").status == 202


def test_an_iam_user_owns_by_its_user_arn_path_included(api: HandlerClient) -> None:
    user = api.as_(f"arn:aws:iam::{ACCOUNT}:user/division/ci-bot")
    assert create(user)["owner"] == f"arn:aws:iam::{ACCOUNT}:user/division/ci-bot"
    assert user.get("/v1/services/web").status == 200
    assert api.as_(f"arn:aws:iam::{ACCOUNT}:user/other").get("/v1/services/web").status == 404


@pytest.mark.parametrize(("method", "path", "body"), ROUTES)
def test_another_role_gets_the_404_an_unknown_name_gets_on_every_route(
    a: HandlerClient, b: HandlerClient, method: str, path: str, body: Any
) -> None:
    unknown = b.call(method, path, body)
    assert unknown.status == 404, unknown.body
    create(a)
    hidden = b.call(method, path, body)
    assert (hidden.status, hidden.body) == (unknown.status, unknown.body)
    assert "ETag" not in hidden.headers
    # And nothing changed: A's service is as A left it.
    view = a.get("/v1/services/web").body
    assert (view["generation"], view["lifecycle"], view["access"]) == (1, "ACTIVE", [])


def test_another_roles_list_leaves_the_service_out(a: HandlerClient, b: HandlerClient) -> None:
    create(a, "web")
    create(b, "api")
    assert names(a) == ["web"]
    assert names(b) == ["api"]


def test_a_name_another_team_holds_is_taken_and_nothing_of_it_is_told(a: HandlerClient, b: HandlerClient) -> None:
    create(a)
    taken = b.post("/v1/services", {"name": "web", "spec": hello_spec()})
    assert taken.status == 409
    assert taken.error["message"] == "the name 'web' is taken by a service you may not see; choose another name"
    # Its owner is told how to change it, as before.
    again = a.post("/v1/services", {"name": "web", "spec": hello_spec()})
    assert "fleetkeeper update web SPEC.yaml" in again.error["message"]


# --- grants --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("method", "path", "body", "doing"),
    [
        ("PUT", "/v1/services/web", {"spec": hello_spec(envs={"V": "2"})}, "updating it"),
        ("POST", "/v1/services/web/rollback", {"version": 1}, "rolling it back"),
        ("DELETE", "/v1/services/web", None, "deleting it"),
        ("POST", "/v1/services/web/access", {"remove": [TEAM_B]}, "changing who may access it"),
    ],
)
def test_a_read_grant_reads_but_every_change_is_a_403_naming_the_access_missing(
    a: HandlerClient, b: HandlerClient, method: str, path: str, body: Any, doing: str
) -> None:
    create(a)
    assert a.put("/v1/services/web", {"spec": hello_spec(envs={"V": "1"})}).status == 200
    assert grant(a, "web", TEAM_B, "read").status == 200
    assert b.get("/v1/services/web").status == 200
    assert b.get("/v1/services/web/versions").status == 200
    assert b.get("/v1/services/web/events").status == 200
    assert names(b) == ["web"]
    refused = b.call(method, path, body)
    assert refused.status == 403, refused.body
    assert refused.error["code"] == "forbidden"
    assert f"{doing} needs write access to service web" in refused.error["message"]
    assert refused.error["details"] == [{"field": "access", "problem": "write access to service web"}]
    assert f"fleetkeeper access web --add {TEAM_B}" in refused.error["message"]
    view = a.get("/v1/services/web").body
    assert (view["generation"], view["lifecycle"]) == (2, "ACTIVE")


def test_a_write_grant_changes_and_a_revoke_takes_it_back(a: HandlerClient, b: HandlerClient) -> None:
    create(a)
    granted = grant(a, "web", TEAM_B, "write")
    assert granted.status == 200
    assert granted.body == {
        "name": "web",
        "owner": TEAM_A,
        "access": [{"principal": TEAM_B, "mode": "write"}],
        "changed": True,
    }
    assert b.put("/v1/services/web", {"spec": hello_spec(envs={"V": "2"})}).status == 200
    assert b.get("/v1/services/web").body["access"] == [{"principal": TEAM_B, "mode": "write"}]
    # Granting it again changes nothing; a new mode replaces the old one.
    assert grant(a, "web", TEAM_B, "write").body["changed"] is False
    assert grant(a, "web", TEAM_B, "read").body["access"] == [{"principal": TEAM_B, "mode": "read"}]
    revoked = a.post("/v1/services/web/access", {"remove": [TEAM_B]})
    assert (revoked.status, revoked.body["access"], revoked.body["changed"]) == (200, [], True)
    assert b.get("/v1/services/web").status == 404


def test_a_grant_of_a_role_with_a_path_matches_its_sessions_by_name(a: HandlerClient, b: HandlerClient) -> None:
    create(a)
    answer = grant(a, "web", f"arn:aws:iam::{ACCOUNT}:role/teams/team-b-ci", "read")
    # Stored as the role without its path: that is what a session of it acts as.
    assert answer.body["access"] == [{"principal": TEAM_B, "mode": "read"}]
    assert b.get("/v1/services/web").status == 200


def test_a_pattern_grant_admits_every_role_it_matches(a: HandlerClient, api: HandlerClient) -> None:
    create(a)
    assert grant(a, "web", f"arn:aws:iam::{ACCOUNT}:role/team-b-*", "read").status == 200
    assert api.as_(session(f"arn:aws:iam::{ACCOUNT}:role/team-b-deploy")).get("/v1/services/web").status == 200
    assert api.as_(session(f"arn:aws:iam::{ACCOUNT}:role/team-c-ci")).get("/v1/services/web").status == 404
    assert api.as_(session("arn:aws:iam::210987654321:role/team-b-ci")).get("/v1/services/web").status == 404


def test_a_change_of_access_is_an_event_naming_who_did_what(a: HandlerClient) -> None:
    create(a)
    grant(a, "web", TEAM_B, "read")
    a.post("/v1/services/web/access", {"add": [{"principal": TEAM_B, "mode": "write"}]})
    a.post("/v1/services/web/access", {"remove": [TEAM_B]})
    events = a.get("/v1/services/web/events").body["events"]
    messages = [e["message"] for e in events if e["reason"] == "AccessChanged"]
    assert sorted(messages) == sorted(
        [
            f"access changed by {TEAM_A}: granted read to {TEAM_B}",
            f"access changed by {TEAM_A}: {TEAM_B}: read -> write",
            f"access changed by {TEAM_A}: revoked {TEAM_B}",
        ]
    )
    # Access is not the spec: the generation (what the reconciler acts on) did not move.
    assert a.get("/v1/services/web").body["generation"] == 1


@pytest.mark.parametrize(
    ("body", "field", "words"),
    [
        ({"add": [{"principal": "team-b", "mode": "read"}]}, "add[0].principal", "is not an IAM principal ARN"),
        ({"add": [{"principal": session(TEAM_B), "mode": "read"}]}, "add[0].principal", "one session of a role"),
        (
            {"add": [{"principal": f"arn:aws:iam::{ACCOUNT}:role/teams/*", "mode": "read"}]},
            "add[0].principal",
            "roles are matched by name",
        ),
        ({"add": [{"principal": TEAM_B, "mode": "admin"}]}, "add[0].mode", ""),
        ({"add": [{"principal": TEAM_B}]}, "add[0].mode", ""),
        ({"remove": ["*"]}, "remove[0]", "is not an IAM principal ARN"),
        ({"add": [{"principal": TEAM_B, "mode": "read"}], "remove": [TEAM_B]}, "remove", "both added and removed"),
        ({"grant": []}, "grant", ""),
    ],
)
def test_a_bad_grant_is_a_400_naming_it_and_changes_nothing(
    a: HandlerClient, body: dict[str, Any], field: str, words: str
) -> None:
    create(a)
    answer = a.post("/v1/services/web/access", body)
    assert answer.status == 400, answer.body
    assert any(d["field"].startswith(field) for d in answer.error["details"]), answer.error
    assert words in answer.error["message"]
    assert a.get("/v1/services/web").body["access"] == []


def test_a_service_names_at_most_twenty_principals(a: HandlerClient) -> None:
    create(a)
    first = [{"principal": f"arn:aws:iam::{ACCOUNT}:role/r{i}", "mode": "read"} for i in range(15)]
    assert a.post("/v1/services/web/access", {"add": first}).status == 200
    more = [{"principal": f"arn:aws:iam::{ACCOUNT}:role/s{i}", "mode": "read"} for i in range(6)]
    answer = a.post("/v1/services/web/access", {"add": more})
    assert answer.status == 400
    assert "would name 21 principals; at most 20" in answer.error["message"]
    assert len(a.get("/v1/services/web").body["access"]) == 15


# --- administrators ------------------------------------------------------------------------------------


def test_an_administrator_pattern_reads_and_changes_every_service(
    a: HandlerClient, b: HandlerClient, admin: HandlerClient
) -> None:
    create(a, "web")
    create(b, "api")
    assert names(admin) == ["api", "web"]
    assert admin.get("/v1/services/web").status == 200
    assert admin.put("/v1/services/web", {"spec": hello_spec(envs={"V": "2"})}).status == 200
    assert admin.post("/v1/services/web/rollback", {"version": 1}).status == 200
    assert grant(admin, "api", TEAM_A, "read").status == 200
    assert names(a) == ["api", "web"]
    assert admin.delete("/v1/services/api").status == 202
    # What an administrator creates is its own role's, like anyone's.
    assert create(admin, "ops")["owner"] == f"arn:aws:iam::{ACCOUNT}:role/platform-admins"


def test_a_service_from_before_owners_is_an_administrators_only(
    api: HandlerClient, admin: HandlerClient, table: str
) -> None:
    create(api)
    aws.dynamodb().update_item(
        TableName=table,
        Key=to_raw(keys.service_key("web")),
        UpdateExpression="REMOVE #o, #a, access_rev",
        ExpressionAttributeNames={"#o": "owner", "#a": "access"},
    )
    assert api.get("/v1/services/web").status == 404
    view = admin.get("/v1/services/web").body
    assert (view["owner"], view["access"]) == ("", [])
    assert grant(admin, "web", TEAM_A, "write").status == 200
    assert api.as_(session(TEAM_A)).put("/v1/services/web", {"spec": hello_spec(envs={"V": "2"})}).status == 200


# --- identities API Gateway reports --------------------------------------------------------------------


@pytest.mark.parametrize("principal", [None, "", "anonymous", "arn:aws:s3:::bucket", "local:me/../x"])
def test_a_request_without_a_recognized_identity_is_a_403_and_writes_nothing(
    api: HandlerClient, principal: str | None
) -> None:
    caller = api.as_(principal)
    for method, path, body in [*ROUTES, ("GET", "/v1/services", None), ("POST", "/v1/services", None)]:
        answer = caller.call(method, path, body if body is not None else {"name": "web", "spec": hello_spec()})
        assert answer.status == 403, (method, path, answer.body)
        assert answer.error["code"] == "forbidden"
    assert names(api) == []


def test_a_federated_user_owns_nothing_and_is_named_by_no_grant(api: HandlerClient) -> None:
    """`federated-user/NAME` is whatever GetFederationToken's caller named itself: as an owner, any IAM
    user allowed that action would be every federated owner. A 403 saying why, and nothing written."""
    federated = api.as_("arn:aws:sts::123456789012:federated-user/alice")
    refused = federated.post("/v1/services", {"name": "web", "spec": hello_spec()})
    assert refused.status == 403, refused.body
    assert "federated users" in refused.error["message"] and "GetFederationToken" in refused.error["message"]
    assert names(api) == []
    assert api.post("/v1/services", {"name": "web", "spec": hello_spec()}).status == 201
    grant = api.post(
        "/v1/services/web/access",
        {"add": [{"principal": "arn:aws:sts::123456789012:federated-user/alice", "mode": "read"}]},
    )
    assert grant.status == 400, grant.body
    assert "federated users" in grant.error["message"]


# --- pages of a filtered list ----------------------------------------------------------------------------


def test_a_filtered_list_pages_through_every_visible_service_and_ends(
    a: HandlerClient, b: HandlerClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    from fleetkeeper.store import reads

    # Small reads so that several pages of another team's services lie between B's.
    monkeypatch.setattr(reads, "_FILTERED_QUERY_LIMIT", 4)
    monkeypatch.setattr(reads, "LIST_EXAMINED_PER_PAGE", 8)
    mine = []
    for i in range(40):
        name = f"svc-{i:02d}"
        if i in (3, 4, 5, 21, 38, 39):
            create(b, name)
            mine.append(name)
        else:
            create(a, name)
    pages: list[list[str]] = []
    token = None
    while True:
        page = b.get("/v1/services?limit=2" + (f"&next_token={token}" if token else ""))
        assert page.status == 200
        pages.append([s["name"] for s in page.body["services"]])
        token = page.body["next_token"]
        if token is None:
            break
        assert len(pages) < 40, "the pages never ended"
    assert [n for p in pages for n in p] == mine
    assert all(len(p) <= 2 for p in pages)
    # Short pages happen only while the index is being read past other teams' services; the last
    # page ends exactly at the last visible one (no empty page after it).
    assert pages[-1] == ["svc-38", "svc-39"]
    assert names(a, limit=7) == [f"svc-{i:02d}" for i in range(40) if f"svc-{i:02d}" not in mine]


def test_a_full_last_page_carries_no_token(a: HandlerClient) -> None:
    for name in ("one", "two"):
        create(a, name)
    page = a.get("/v1/services?limit=2")
    assert ([s["name"] for s in page.body["services"]], page.body["next_token"]) == (["one", "two"], None)


# --- re-creating a deleted name ----------------------------------------------------------------------------


def test_a_name_re_created_by_another_team_shows_nothing_of_the_old_incarnation(
    a: HandlerClient, b: HandlerClient, table: str
) -> None:
    create(a, envs={"OLD": "a-secret-ish-value"})
    assert a.put("/v1/services/web", {"spec": hello_spec(envs={"OLD": "v2"})}).status == 200
    assert a.delete("/v1/services/web").status == 202
    # The reconciler deletes the service item once its replicas are gone; the cleanup then deletes
    # the old incarnation's children, maybe later: here they are all still there.
    aws.dynamodb().delete_item(TableName=table, Key=to_raw(keys.service_key("web")))
    created = create(b)
    assert created["owner"] == TEAM_B
    versions = b.get("/v1/services/web/versions").body["versions"]
    assert [v["version"] for v in versions] == [1]
    assert "OLD" not in json.dumps(versions)
    events = b.get("/v1/services/web/events").body["events"]
    assert [e["reason"] for e in events] == ["Created"]
    # The old owner has no hold on the new incarnation.
    for method, path, body in ROUTES:
        assert a.call(method, path, body).status == 404


# --- idempotency keys are the caller's ------------------------------------------------------------------


def test_two_callers_with_one_idempotency_key_never_share_a_result(a: HandlerClient, b: HandlerClient) -> None:
    key = {"Idempotency-Key": "deploy-1"}
    first = a.post("/v1/services", {"name": "web", "spec": hello_spec()}, headers=key)
    assert first.status == 201
    # B replays A's exact request under A's key: not A's answer (which would show A's service), but
    # B's own request: the name is taken.
    same = b.post("/v1/services", {"name": "web", "spec": hello_spec()}, headers=key)
    assert same.status == 409, same.body
    assert "web" not in json.dumps(same.body).replace("'web'", "")
    # B's own request under the same key runs, and A's replay still answers A's first result.
    other = b.post("/v1/services", {"name": "api", "spec": hello_spec()}, headers=key)
    assert other.status == 201
    replay = a.post("/v1/services", {"name": "web", "spec": hello_spec()}, headers=key)
    assert (replay.status, replay.body) == (201, first.body)


def test_another_session_of_the_same_role_replays_the_roles_key(a: HandlerClient, api: HandlerClient) -> None:
    key = {"Idempotency-Key": "deploy-2"}
    first = a.post("/v1/services", {"name": "web", "spec": hello_spec()}, headers=key)
    retry = api.as_(session(TEAM_A, "run-2")).post("/v1/services", {"name": "web", "spec": hello_spec()}, headers=key)
    assert (retry.status, retry.body) == (201, first.body)


def secret_spec(value: str) -> dict[str, Any]:
    return hello_spec(secrets={"TOKEN": value})


def test_the_same_key_with_other_secret_values_is_another_request(a: HandlerClient) -> None:
    key = {"Idempotency-Key": "rotate"}
    create(a, secrets={"TOKEN": "v0"})
    first = a.put("/v1/services/web", {"spec": secret_spec("v1")}, headers=key)
    assert first.status == 200
    assert a.put("/v1/services/web", {"spec": secret_spec("v1")}, headers=key).body == first.body
    refused = a.put("/v1/services/web", {"spec": secret_spec("v2")}, headers=key)
    assert (refused.status, refused.error["code"]) == (422, "idempotency_key_reused")


def test_the_hmac_key_is_a_securestring_outside_the_replicas_path(a: HandlerClient) -> None:
    from fleetkeeper.api.request_hmac import RequestHmac, forget_keys, key_parameter
    from fleetkeeper.replicas.secrets import parameter_prefix

    forget_keys()  # a key cached by an earlier test's account is not this account's
    create(a, secrets={"TOKEN": "v0"})
    assert a.put("/v1/services/web", {"spec": secret_spec("v1")}, headers={"Idempotency-Key": "k"}).status == 200
    name = key_parameter(TABLE)
    assert not name.startswith(parameter_prefix(TABLE) + "/")
    stored = aws.ssm().describe_parameters(ParameterFilters=[{"Key": "Name", "Values": [name]}])["Parameters"]
    assert [p["Type"] for p in stored] == ["SecureString"]
    # Another execution environment (nothing cached) reads the same key: the same digest.
    digest = RequestHmac(name).digest({"TOKEN": "v1"})
    forget_keys()
    assert RequestHmac(name).digest({"TOKEN": "v1"}) == digest
    assert RequestHmac(name).digest({"TOKEN": "v2"}) != digest


# --- workdir uploads -------------------------------------------------------------------------------------


def test_a_workdir_upload_tells_only_readers_what_a_service_stores(
    a: HandlerClient, b: HandlerClient, api: HandlerClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    import base64
    import hashlib

    from fleetkeeper.replicas.workdirs import upload_key
    from tests.replicas.test_secrets_and_workdirs import archive

    aws.s3().create_bucket(Bucket="fleetkeeper-owners-workdirs")
    monkeypatch.setenv("WORKDIR_BUCKET", "fleetkeeper-owners-workdirs")
    data = archive({"app.py": b"print('a')\n"})
    digest = "sha256:" + hashlib.sha256(data).hexdigest()
    checksum = base64.b64encode(hashlib.sha256(data).digest()).decode()
    aws.s3().put_object(
        Bucket="fleetkeeper-owners-workdirs", Key=upload_key(digest), Body=data, ChecksumSHA256=checksum
    )
    create(a, workdir={"digest": digest})
    aws.s3().delete_object(Bucket="fleetkeeper-owners-workdirs", Key=upload_key(digest))  # the upload expired
    asked = {"digest": digest, "size": len(data), "service": "web"}
    assert a.post("/v1/workdirs", asked).body["upload"] is None  # web stores it: nothing to upload
    # Team B is answered as for a new service: an upload, nothing about web.
    assert b.post("/v1/workdirs", asked).body["upload"] is not None
    assert b.post("/v1/workdirs", {**asked, "service": "not-yet"}).body["upload"] is not None
    grant(a, "web", TEAM_B, "read")
    assert b.post("/v1/workdirs", asked).body["upload"] is None


# --- the reconciler leaves owners and grants alone -----------------------------------------------------


def test_reconciling_a_service_keeps_its_owner_and_grants(world: Any) -> None:
    from dataclasses import replace

    from fleetkeeper.model import AccessGrant
    from fleetkeeper.owners.access import Caller

    world.commands = replace(world.commands, caller=Caller(TEAM_A))
    world.create("web")
    service, changed = world.commands.change_access("web", [AccessGrant(TEAM_B, "read")], [])
    assert changed and service.access_rev == 1
    world.converge()
    world.update("web", envs={"V": "2"})
    world.converge()
    after = world.store.service("web")
    assert (after.owner, after.access, after.access_rev) == (TEAM_A, (AccessGrant(TEAM_B, "read"),), 1)
    assert after.status.value == "READY"


def test_a_change_of_access_on_a_stale_read_is_refused_by_the_store_and_retried_by_the_command(
    a: HandlerClient, table: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from fleetkeeper import service_events
    from fleetkeeper.model import AccessGrant
    from fleetkeeper.store.commands import CommandStore
    from fleetkeeper.store.errors import Raced
    from fleetkeeper.store.table import Table

    create(a)
    store = CommandStore(Table(table))
    stale = store.service("web")
    grant(a, "web", TEAM_B, "read")  # moves access_rev on under `stale`
    event = service_events.access_changed("test", ["x"])
    with pytest.raises(Raced):
        store.set_access(stale, (), "2026-01-01T00:00:00.000Z", event=event)
    assert a.get("/v1/services/web").body["access"] == [{"principal": TEAM_B, "mode": "read"}]

    # Another writer changes the grants between the command's read and its write: its write is
    # refused, and the command reads again and applies its change on top of the other one.
    other, third = (f"arn:aws:iam::{ACCOUNT}:role/team-{t}-ci" for t in "cd")
    original = CommandStore.set_access
    raced: list[bool] = []

    def racing(self: CommandStore, service: Any, access: Any, now: str, *, event: Any) -> Any:
        if not raced:
            raced.append(True)
            fresh = self.service(service.name)
            original(self, fresh, (*fresh.access, AccessGrant(third, "write")), now, event=event)
        return original(self, service, access, now, event=event)

    monkeypatch.setattr(CommandStore, "set_access", racing)
    assert grant(a, "web", other, "read").body["access"] == [
        {"principal": TEAM_B, "mode": "read"},
        {"principal": third, "mode": "write"},
        {"principal": other, "mode": "read"},
    ]
    assert raced == [True]


def test_access_of_a_service_being_deleted_cannot_change(a: HandlerClient) -> None:
    create(a)
    assert a.delete("/v1/services/web").status == 202
    answer = grant(a, "web", TEAM_B, "read")
    assert (answer.status, answer.error["code"]) == (409, "conflict")
    assert "being deleted" in answer.error["message"]
