"""The dashboard's server over real HTTP on 127.0.0.1, against the real api handler: what it shows,
what it refuses, and how an action is confirmed and sent."""

from __future__ import annotations

import re
import time
from typing import TYPE_CHECKING

from fleetkeeper.model import ReplicaStatus
from tests.api.test_terminate_replica import with_replicas
from tests.support.dashboard import csrf_of
from tests.support.local_process import eventually
from tests.support.specs import hello_spec

if TYPE_CHECKING:
    from fleetkeeper.cli.http import ApiClient


def create(api: ApiClient, name: str, spec: dict[str, object]) -> None:
    api.request("POST", "/v1/services", {"name": name, "spec": spec})


def test_the_login_link_works_once_for_a_session_cookie_no_script_can_read(api: ApiClient, dashboard) -> None:  # type: ignore[no-untyped-def]
    running, visitor = dashboard()
    link = running.login_url()
    fresh = type(visitor)(visitor.base)
    answer = fresh.log_in(link)
    assert answer.status == 303 and answer.headers["Location"] == "/"
    cookie = answer.headers["Set-Cookie"]
    assert "HttpOnly" in cookie and "SameSite=Strict" in cookie and "Path=/" in cookie
    assert link.split("code=")[1] not in cookie  # the session is not the code
    assert fresh.get("/").status == 200
    again = type(visitor)(visitor.base).log_in(link)
    assert again.status == 403 and "used already" in again.text
    assert type(visitor)(visitor.base).log_in(f"{visitor.base}/login?code=guessed").status == 403


def test_without_the_session_nothing_but_the_assets_is_served(api: ApiClient, dashboard) -> None:  # type: ignore[no-untyped-def]
    create(api, "web", hello_spec())
    _running, visitor = dashboard()
    stranger = type(visitor)(visitor.base)
    for path in ("/", "/fragments/services", "/services/web", "/fragments/services/web/state"):
        answer = stranger.get(path)
        assert answer.status == 401, path
        assert "web" not in re.sub(r"<title>.*?</title>", "", answer.text).replace("login link", ""), path
    assert stranger.get("/static/dashboard.js").status == 200
    assert stranger.get("/static/anything-else.js").status == 401 or stranger.get("/static/x").status == 404
    forged = type(visitor)(visitor.base, cookie=visitor.cookie.split("=")[0] + "=not-a-session")  # type: ignore[union-attr]
    assert forged.get("/").status == 401


def test_a_request_for_another_host_is_refused_before_anything(api: ApiClient, dashboard) -> None:  # type: ignore[no-untyped-def]
    create(api, "web", hello_spec())
    _running, visitor = dashboard()
    port = visitor.authority.split(":")[1]
    for host in (f"rebound.example:{port}", f"localhost:{port}", "127.0.0.1", f"127.0.0.1:{int(port) + 1}"):
        answer = visitor.get("/", Host=host)
        assert answer.status == 403, host
        assert "Host header" in answer.text and "web" not in answer.text
    assert visitor.get("/login?code=x", Host=f"rebound.example:{port}").status == 403


def test_every_answer_has_a_strict_policy_and_the_pages_no_inline_script_or_style(api: ApiClient, dashboard) -> None:  # type: ignore[no-untyped-def]
    create(api, "web", hello_spec(envs={"GREETING": "<script>alert(1)</script>"}))
    api.request("PUT", "/v1/services/web", {"spec": hello_spec(envs={"GREETING": "<b>two</b>"})})
    _running, visitor = dashboard()
    for path in ("/", "/services/web", "/services/web/diff?from=1&to=2", "/fragments/services/web/plots", "/nope"):
        answer = visitor.get(path)
        policy = answer.headers["Content-Security-Policy"]
        assert "script-src 'self'" in policy and "default-src 'none'" in policy and "frame-ancestors 'none'" in policy
        assert answer.headers["X-Frame-Options"] == "DENY" and answer.headers["Referrer-Policy"] == "same-origin"
        assert re.findall(r"<script(?![^>]*\bsrc=)", answer.text) == [], path
        assert not re.search(r"\sstyle=|\son[a-z]+=", answer.text), path
        assert "<script>alert" not in answer.text and "<b>two" not in answer.text, path
    diff = visitor.get("/services/web/diff?from=1&to=2").text
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in diff and "&lt;b&gt;two&lt;/b&gt;" in diff


def test_the_services_table_sorts_filters_and_shows_each_service(api: ApiClient, dashboard) -> None:  # type: ignore[no-untyped-def]
    create(api, "web", hello_spec(replicas=3))
    create(api, "api", hello_spec(replicas=1))
    _running, visitor = dashboard()

    def rows(query: str) -> list[str]:
        return re.findall(r'<tr class="service" data-name="([^"]+)"', visitor.get(f"/fragments/services?{query}").text)

    eventually(lambda: rows("sort=name") == ["api", "web"], 10, what="both services listed")
    assert rows("sort=name&order=desc") == ["web", "api"]
    assert rows("sort=name&q=we") == ["web"]
    assert rows("sort=name&q=nothing-matches") == []
    table = visitor.get("/fragments/services?sort=name&q=web").text
    assert "0 / 3" in table and "v1" in table and "NO_REPLICA" in table
    page = visitor.get("/?sort=name&q=web").text
    assert 'data-fragment="/fragments/services?sort=name&amp;order=asc&amp;q=web"' in page


def test_a_service_page_shows_replicas_versions_a_diff_events_and_plots(api: ApiClient, dashboard) -> None:  # type: ignore[no-untyped-def]
    create(api, "web", hello_spec())
    api.request("PUT", "/v1/services/web", {"spec": hello_spec(envs={"MODE": "fast"})})
    _running, visitor = dashboard()
    page = visitor.get("/services/web").text
    assert 'data-version="2"><td>v2 <span class="current">current</span>' in page
    assert 'data-reason="Updated"' in page and 'data-reason="Created"' in page
    assert 'class="plot plot-rate"' in page and 'class="plot plot-replicas"' in page
    assert "read-only" in page and 'action="/services/web/rollback"' not in page
    diff = visitor.get("/services/web/diff?from=1&to=2").text
    assert '<span class="add">+  &quot;envs&quot;: {</span>' in diff or "MODE" in diff
    assert visitor.get("/services/web/diff?from=1&to=9").status == 404
    assert visitor.get("/services/nope").status == 404


def test_an_action_needs_allow_actions(api: ApiClient, dashboard) -> None:  # type: ignore[no-untyped-def]
    create(api, "web", hello_spec())
    api.request("PUT", "/v1/services/web", {"spec": hello_spec(envs={"MODE": "fast"})})
    _running, visitor = dashboard()
    session_token = "x"
    answer = visitor.post(
        "/services/web/rollback", {"csrf": session_token, "version": "1", "generation": "2", "confirmed": "yes"}
    )
    assert answer.status == 403 and "read-only" in answer.text
    assert api.request("GET", "/v1/services/web").body["target_version"] == 2


def test_an_action_is_confirmed_then_sent_with_this_pages_origin_and_token(api: ApiClient, dashboard) -> None:  # type: ignore[no-untyped-def]
    create(api, "web", hello_spec())
    api.request("PUT", "/v1/services/web", {"spec": hello_spec(envs={"MODE": "fast"})})
    _running, visitor = dashboard(allow_actions=True)
    page = visitor.get("/services/web").text
    csrf = csrf_of(page)
    generation = str(api.request("GET", "/v1/services/web").body["generation"])
    form = {"csrf": csrf, "version": "1", "generation": generation}

    assert visitor.post("/services/web/rollback", form, origin=None).status == 403
    assert visitor.post("/services/web/rollback", form, origin="http://127.0.0.1:1").status == 403
    assert visitor.post("/services/web/rollback", {**form, "csrf": "0" * 64}).status == 403
    other = type(visitor)(visitor.base, cookie=visitor.cookie)
    assert (
        other.request(
            "POST", "/services/web/rollback", None, {"Origin": visitor.base, "Content-Type": "text/plain"}
        ).status
        == 415
    )

    question = visitor.post("/services/web/rollback", form)
    assert question.status == 200 and "Roll web back from v2 to v1?" in question.text
    assert api.request("GET", "/v1/services/web").body["target_version"] == 2  # nothing sent yet
    done = visitor.post("/services/web/rollback", {**form, "csrf": csrf_of(question.text), "confirmed": "yes"})
    assert done.status == 303 and done.headers["Location"] == "/services/web?done=rollback&version=1"
    assert api.request("GET", "/v1/services/web").body["target_version"] == 1
    assert "rolled back to v1" in visitor.get(done.headers["Location"]).text

    # The generation the user confirmed is sent as If-Match: a change since is the API's 412, shown.
    stale = visitor.post("/services/web/rollback", {**form, "version": "2", "confirmed": "yes"})
    assert stale.status == 412 and api.request("GET", "/v1/services/web").body["target_version"] == 1


def test_scaling_a_fixed_count_service_makes_a_version_with_the_new_count(api: ApiClient, dashboard) -> None:  # type: ignore[no-untyped-def]
    create(api, "web", hello_spec(replicas=2))
    _running, visitor = dashboard(allow_actions=True)
    page = visitor.get("/services/web").text
    assert 'id="scale-form"' in page
    generation = str(api.request("GET", "/v1/services/web").body["generation"])
    form = {"csrf": csrf_of(page), "replicas": "4", "generation": generation}
    question = visitor.post("/services/web/scale", form)
    assert "Scale web to 4 replica(s)?" in question.text
    done = visitor.post("/services/web/scale", {**form, "confirmed": "yes"})
    assert done.status == 303
    view = api.request("GET", "/v1/services/web").body
    assert view["spec"]["service"]["replicas"] == 4 and view["target_version"] == 2
    assert visitor.post("/services/web/scale", {**form, "replicas": "abc", "confirmed": "yes"}).status == 400


def test_a_confirmed_terminate_asks_for_that_replica_to_go(api: ApiClient, dashboard) -> None:  # type: ignore[no-untyped-def]
    create(api, "web", hello_spec())
    with_replicas("web", ReplicaStatus.READY, ReplicaStatus.READY)
    _running, visitor = dashboard(allow_actions=True)
    page = visitor.get("/services/web").text
    assert 'class="action terminate-form" data-replica="0"' in page and 'data-replica="1"><input' in page
    uid = str(api.request("GET", "/v1/services/web").body["uid"])
    form = {"csrf": csrf_of(page), "replica": "1", "uid": uid}

    question = visitor.post("/services/web/terminate", form)
    assert question.status == 200 and "Terminate replica 1 of web (v1, READY)?" in question.text
    assert all(r["terminate_requested_at"] is None for r in api.request("GET", "/v1/services/web").body["replicas"])
    done = visitor.post("/services/web/terminate", {**form, "csrf": csrf_of(question.text), "confirmed": "yes"})
    assert done.status == 303 and done.headers["Location"] == "/services/web?done=terminate&replica=1"
    replicas = {r["replica_id"]: r for r in api.request("GET", "/v1/services/web").body["replicas"]}
    assert replicas[1]["terminate_requested_at"] is not None and replicas[0]["terminate_requested_at"] is None
    events = api.request("GET", "/v1/services/web/events").body["events"]
    assert [e["replica_id"] for e in events if e["reason"] == "TerminationRequested"] == [1]
    after = visitor.get(done.headers["Location"]).text
    assert "terminating replica 1: the reconciler drains it and replaces it" in after
    assert 'data-replica="1"><input' not in after  # asked for already: no button

    again = visitor.post("/services/web/terminate", {**form, "confirmed": "yes"})
    assert again.headers["Location"] == "/services/web?done=terminate-going&replica=1"
    unknown = visitor.post("/services/web/terminate", {**form, "replica": "7", "confirmed": "yes"})
    assert unknown.status == 404 and "has no replica 7 (its replicas: 0, 1)" in unknown.text
    assert visitor.post("/services/web/terminate", {**form, "replica": "7"}).status == 404  # not even asked
    other = visitor.post("/services/web/terminate", {**form, "replica": "0", "uid": "another", "confirmed": "yes"})
    assert other.status == 409 and "deleted and made again" in other.text
    assert visitor.post("/services/web/terminate", {**form, "replica": "x", "confirmed": "yes"}).status == 400
    assert api.request("GET", "/v1/services/web").body["replicas"][0]["terminate_requested_at"] is None


def test_terminate_is_refused_without_allow_actions_or_the_csrf_token(api: ApiClient, dashboard) -> None:  # type: ignore[no-untyped-def]
    create(api, "web", hello_spec())
    with_replicas("web", ReplicaStatus.READY)
    uid = str(api.request("GET", "/v1/services/web").body["uid"])
    _running, reader = dashboard()
    assert "terminate-form" not in reader.get("/services/web").text
    refused = reader.post("/services/web/terminate", {"csrf": "x", "replica": "0", "uid": uid, "confirmed": "yes"})
    assert refused.status == 403 and "read-only" in refused.text

    _running, visitor = dashboard(allow_actions=True)
    csrf = csrf_of(visitor.get("/services/web").text)
    form = {"replica": "0", "uid": uid, "confirmed": "yes"}
    assert visitor.post("/services/web/terminate", form).status == 403
    assert visitor.post("/services/web/terminate", {**form, "csrf": "0" * 64}).status == 403
    assert visitor.post("/services/web/terminate", {**form, "csrf": csrf}, origin=None).status == 403
    assert api.request("GET", "/v1/services/web").body["replicas"][0]["terminate_requested_at"] is None
    # The same form with this session's token is taken: the refusals were the token's and the Origin's.
    assert visitor.post("/services/web/terminate", {**form, "csrf": csrf}).status == 303
    assert api.request("GET", "/v1/services/web").body["replicas"][0]["terminate_requested_at"] is not None


def test_the_list_says_when_the_api_cannot_be_reached(api: ApiClient, dashboard) -> None:  # type: ignore[no-untyped-def]
    create(api, "web", hello_spec())
    running, visitor = dashboard()
    eventually(lambda: "web" in visitor.get("/fragments/services").text, 10, what="listed")
    api.base_url = "http://127.0.0.1:9"  # the dashboard's client: nothing answers there now
    api.retries = 1
    time.sleep(0.5)
    eventually(
        lambda: "could not list the services" in visitor.get("/fragments/services").text, 10, what="problem shown"
    )
    assert running.url.startswith("http://127.0.0.1:")
