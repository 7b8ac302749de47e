"""The service's fixtures (tests/service/conftest.py) for the trust-boundary tests."""

from tests.service.conftest import spaces, start_service  # noqa: F401
from tests.service.test_dashboard import browser  # noqa: F401
