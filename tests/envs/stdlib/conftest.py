import pytest


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "slow: minutes of CPU (deselect with -m 'not slow')")
