"""The dashboard's gate (fleetkeeper.dashboard.gate): login codes, sessions and their CSRF tokens, the
Origin and Host it accepts."""

from __future__ import annotations

from fleetkeeper.dashboard.gate import Gate


def test_a_login_code_is_spent_by_its_first_use_and_each_session_has_its_own_csrf_token() -> None:
    gate = Gate("127.0.0.1", 8471)
    code = gate.new_login_code()
    first = gate.log_in(code)
    assert first is not None and gate.log_in(code) is None
    second = gate.log_in(gate.new_login_code())
    assert second is not None and second != first
    assert gate.session_of(first) == first and gate.session_of("forged") is None and gate.session_of(None) is None
    assert gate.csrf_token(first) != gate.csrf_token(second)
    origin = ["http://127.0.0.1:8471"]
    assert gate.refuse_write(first, origin, gate.csrf_token(first)) is None
    assert gate.refuse_write(first, origin, gate.csrf_token(second)) is not None
    assert gate.refuse_write(first, ["http://127.0.0.1:8000"], gate.csrf_token(first)) is not None
    assert gate.refuse_write(first, ["null"], gate.csrf_token(first)) is not None
    assert gate.refuse_write(first, [], gate.csrf_token(first)) is not None
    assert gate.refuse_host(["127.0.0.1:8471"]) is None
    assert gate.refuse_host(["localhost:8471"]) is not None and gate.refuse_host([]) is not None
