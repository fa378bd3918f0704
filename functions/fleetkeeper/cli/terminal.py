"""Text from elsewhere made safe to print on a terminal.

A replica's output is written by whatever the service runs (and by anyone who can make it log a
request line). Printed raw, an escape sequence in it is obeyed by the reader's terminal: it can move
the cursor and rewrite what was printed before, set the window title, write to the clipboard
(OSC 52) or, on some terminals, answer back into the shell's input. `printable` removes every
escape sequence whole (so no stray `[31m` is left) and then every other control character: C0 but
TAB (and newline where lines are kept), DEL, and C1 (U+0080-U+009F, which some terminals read as
8-bit CSI/OSC introducers).
"""

from __future__ import annotations

import re

# ESC sequences, matched whole (ECMA-48): CSI "ESC [ params intermediates final", OSC and the other
# string controls (DCS, SOS, PM, APC) up to their terminator (BEL or ST) or the end of the text, and
# the short "ESC intermediates final" forms. Their 8-bit C1 forms likewise.
_ESCAPES = re.compile(
    r"\x1b\[[0-?]*[ -/]*[@-~]?"
    r"|\x9b[0-?]*[ -/]*[@-~]?"
    r"|(?:\x1b[\]PX^_]|[\x90\x98\x9d\x9e\x9f])[^\x07\x1b\x9c]*(?:\x07|\x1b\\|\x9c)?"
    r"|\x1b[ -/]*[0-~]?"
)
_CONTROLS_BUT_TAB = re.compile(r"[\x00-\x08\x0a-\x1f\x7f-\x9f]")
_CONTROLS_BUT_TAB_AND_NEWLINE = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def printable(text: str, *, keep_newlines: bool = False) -> str:
    """`text` without escape sequences and control characters (TAB kept; newlines too if asked)."""
    text = _ESCAPES.sub("", text)
    controls = _CONTROLS_BUT_TAB_AND_NEWLINE if keep_newlines else _CONTROLS_BUT_TAB
    return controls.sub("", text)
