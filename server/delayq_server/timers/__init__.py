"""Background loops: promoter (due -> ready), reaper (expired leases), janitor (TTL, retention)."""
