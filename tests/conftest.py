"""Fixtures shared by several test modules."""

import pytest
import torch


@pytest.fixture
def one_thread():
    """torch on one thread for the test: tiny models run fastest so, and two threads on a busy two-core machine
    spin for ages. Modules of tiny models take it for every test with ``pytestmark``."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
