"""DelayQueueService, one module per RPC family; service.py composes them."""
