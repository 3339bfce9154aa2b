"""delayq server: a delayed job queue over gRPC, stored in Redis."""
