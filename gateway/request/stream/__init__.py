"""Relaying a tier's answer to the client, and going on on the next tier when it fails or
degenerates midway (mid-stream failover, escalation, whole answers assembled).

See gateway/request/__init__.py for the order of the sub-packages."""
