"""The core e2e suite, unchanged, against a server on a 3-master Redis Cluster."""

from tests.e2e.test_delivery import *  # noqa: F403
from tests.e2e.test_lifecycle import *  # noqa: F403
from tests.e2e.test_streams_and_replicas import *  # noqa: F403
