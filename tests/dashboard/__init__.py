"""Browser tests of the dashboard (issue 14)."""
