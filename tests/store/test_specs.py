"""The cache of parsed version specs: it serves a text's own spec, never a stale or a refused one,
and it stays within its bounds."""

from __future__ import annotations

import json
import threading
from dataclasses import replace
from typing import Any

import pytest
from pydantic import ValidationError

from fleetkeeper.model import VersionRecord
from fleetkeeper.spec.service import ServiceSpec, stored_spec
from fleetkeeper.store.codec import state_from_items, version_from_item, version_item
from fleetkeeper.store.errors import CorruptItem
from fleetkeeper.store.specs import SpecCache, specs
from tests.support.specs import hello_spec


def _text(**envs: str) -> str:
    return json.dumps(hello_spec(envs=envs), sort_keys=True)


def _version_item(text: str) -> dict[str, Any]:
    record = VersionRecord(
        name="web", uid="u1", version=3, spec=ServiceSpec.model_validate(hello_spec()), mode="rolling", created_at="t"
    )
    return {**version_item(record), "spec": text}


def test_a_text_parses_to_its_own_spec_and_again_to_the_same_one() -> None:
    cache = SpecCache()
    first = cache.parsed(_text(BUILD="1"))
    assert first == stored_spec(_text(BUILD="1"))
    assert cache.parsed(_text(BUILD="1")) is first  # validated once
    assert len(cache) == 1


def test_a_changed_item_is_not_served_the_spec_it_held_before() -> None:
    """Versions are immutable, but an item rewritten under the same key must still read as it now is."""
    before = version_from_item(_version_item(_text(BUILD="1")))
    after = version_from_item(_version_item(_text(BUILD="2")))
    assert (before.uid, before.version) == (after.uid, after.version)
    assert before.spec.envs == {"BUILD": "1"}
    assert after.spec.envs == {"BUILD": "2"}


@pytest.mark.parametrize(
    "text",
    [
        "{not json",
        json.dumps({"run": "x"}),  # no service section
        json.dumps({**hello_spec(), "file_mounts": {}}),  # a field fleetkeeper does not know
    ],
)
def test_a_corrupt_spec_is_refused_every_time_and_never_kept(text: str) -> None:
    cache = SpecCache()
    for _ in range(2):
        with pytest.raises(ValidationError):
            cache.parsed(text)
    assert len(cache) == 0
    # Through the codec it is the service's CorruptItem, read after read.
    meta = {"PK": "SVC#web", "SK": "META", "name": "web", "uid": "u1", "generation": 1, "lifecycle": "ACTIVE"}
    meta |= {"target_version": 3, "latest_version": 3, "status": "READY", "created_at": "t", "updated_at": "t"}
    for _ in range(2):
        with pytest.raises(CorruptItem):
            state_from_items([meta, _version_item(text)])


def test_a_text_that_once_parsed_and_then_changed_to_a_corrupt_one_is_refused() -> None:
    good = _text(BUILD="1")
    version_from_item(_version_item(good))
    corrupt = good.replace('"run"', '"runn"')
    with pytest.raises(ValidationError):
        version_from_item(_version_item(corrupt))


def test_the_cache_keeps_at_most_its_number_of_specs_least_recently_used_going_first() -> None:
    cache = SpecCache(max_specs=3)
    texts = [_text(BUILD=str(n)) for n in range(5)]
    for text in texts[:3]:
        cache.parsed(text)
    kept = cache.parsed(texts[0])  # used again: the least recently used is now texts[1]
    cache.parsed(texts[3])
    cache.parsed(texts[4])
    assert len(cache) == 3
    assert cache.parsed(texts[0]) is kept  # still there
    assert cache.text_bytes == sum(len(text.encode()) for text in (texts[0], texts[3], texts[4]))


def test_the_cache_keeps_at_most_its_bytes_of_text_and_never_a_text_larger_than_them() -> None:
    small = [_text(BUILD=str(n)) for n in range(4)]
    budget = 2 * len(small[0].encode()) + 1
    cache = SpecCache(max_text_bytes=budget)
    for text in small:
        cache.parsed(text)
    assert len(cache) == 2
    assert cache.text_bytes <= budget
    large = _text(BUILD="x" * budget)
    assert cache.parsed(large).envs["BUILD"] == "x" * budget  # parsed, just not kept
    assert len(cache) == 2
    assert cache.text_bytes <= budget


def test_threads_reading_at_once_get_their_own_specs_and_the_bounds_hold() -> None:
    cache = SpecCache(max_specs=8)
    texts = [_text(BUILD=str(n)) for n in range(32)]
    wrong: list[str] = []

    def read(offset: int) -> None:
        for round_ in range(20):
            text = texts[(offset + round_) % len(texts)]
            if cache.parsed(text).envs["BUILD"] != json.loads(text)["envs"]["BUILD"]:
                wrong.append(text)

    threads = [threading.Thread(target=read, args=(n,)) for n in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert wrong == []
    assert len(cache) <= 8
    assert cache.text_bytes == sum(size for _, size in cache._specs.values())


def test_the_codec_reads_versions_through_the_process_cache() -> None:
    text = _text(BUILD="codec")
    record = version_from_item(_version_item(text))
    assert specs.parsed(text) is record.spec
    assert replace(record, spec=stored_spec(text)) == record
