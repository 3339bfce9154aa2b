"""Side-by-side benchmark of delayq, BullMQ and arq (issue 5); run with `make bench`."""
