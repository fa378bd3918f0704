"""The table: keys, codec, commands, reads, events."""
