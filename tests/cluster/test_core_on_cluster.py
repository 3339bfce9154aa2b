"""The core e2e suite, unchanged, against a server on a 3-master Redis Cluster."""

from tests.e2e.test_delivery import *  # noqa: F403
from tests.e2e.test_enqueue_stream import (  # the ones on the shared server fixture
    test_each_batch_is_answered_by_its_id_and_stored,
    test_idempotency_keys_hold_across_batches_of_one_stream,
    test_the_stream_stays_open_between_batches,
)
from tests.e2e.test_lifecycle import *  # noqa: F403
from tests.e2e.test_streams_and_replicas import *  # noqa: F403

__all__ = [
    "test_each_batch_is_answered_by_its_id_and_stored",
    "test_idempotency_keys_hold_across_batches_of_one_stream",
    "test_the_stream_stays_open_between_batches",
]
