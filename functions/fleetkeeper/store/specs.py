"""Version specs as stored, each text validated once per process rather than on every read.

The reconciler reads every version of every service each run (a service keeps up to 50), and a
version's spec never changes once written. The cache does not rely on that, though: it is keyed by
a digest of the stored text itself, so a text that changed is validated afresh, and one that does
not validate raises every time (nothing is kept for it). The digest is 128 bits of BLAKE2b: a
collision, which would hand one version another's spec, is not a chance worth counting.

Bounded by entries and by text bytes, the least recently used going first, so a warm Lambda's memory
stays bounded whatever its services hold (a cached spec is about 3.5 KB plus its text: at most some
60 MB). 8192 specs are 160 services of 50 versions, or 1,000 of 8; a process that reads more specs
than that, in the same order every run, finds none of them here (a cycle longer than an LRU cache
evicts each entry before its next use) and pays a digest per version for nothing. A lock guards it:
a worker may load services in threads.
The ServiceSpec returned is shared by every version whose text is the same: it is frozen, and
nothing may change its dicts (envs, headers) in place.
"""

from __future__ import annotations

import hashlib
import threading
from collections import OrderedDict
from typing import TYPE_CHECKING

from fleetkeeper.spec.service import stored_spec

if TYPE_CHECKING:
    from fleetkeeper.spec.service import ServiceSpec

MAX_SPECS = 8192
MAX_TEXT_BYTES = 32 * 1024 * 1024


class SpecCache:
    def __init__(self, max_specs: int = MAX_SPECS, max_text_bytes: int = MAX_TEXT_BYTES) -> None:
        self.max_specs = max_specs
        self.max_text_bytes = max_text_bytes
        self._specs: OrderedDict[bytes, tuple[ServiceSpec, int]] = OrderedDict()
        self._text_bytes = 0
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._specs)

    @property
    def text_bytes(self) -> int:
        return self._text_bytes

    def parsed(self, text: str) -> ServiceSpec:
        """`stored_spec(text)`: the spec, or the ValidationError (a ValueError) a bad text raises."""
        data = text.encode()
        key = hashlib.blake2b(data, digest_size=16).digest()
        with self._lock:
            hit = self._specs.get(key)
            if hit is not None:
                self._specs.move_to_end(key)
                return hit[0]
        spec = stored_spec(text)
        size = len(data)
        if size > self.max_text_bytes:
            return spec
        with self._lock:
            if key not in self._specs:
                self._specs[key] = (spec, size)
                self._text_bytes += size
                while len(self._specs) > self.max_specs or self._text_bytes > self.max_text_bytes:
                    _, (_, dropped) = self._specs.popitem(last=False)
                    self._text_bytes -= dropped
        return spec


# The process's cache (a Lambda container's, across its invocations).
specs = SpecCache()
