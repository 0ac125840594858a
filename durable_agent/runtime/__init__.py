"""Temporal wiring: server discovery, the embedded dev server, worker assembly."""
