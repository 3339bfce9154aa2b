"""Enqueue throughput with auth on versus off, measured in the same run (issue 9)."""
