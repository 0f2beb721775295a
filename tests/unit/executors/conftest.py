"""A local Ray shared by the executor tests, and the checks that no Ray process outlives a test."""

from __future__ import annotations

import os
import time

import psutil
import pytest

ray = pytest.importorskip("ray")  # not installed on the GPU test machine (`make gpu-check`)

MARKER = "SKIPSEARCH_RAY_TEST"


def tagged_processes(tag: str) -> list[str]:
    """Live processes other than this one that carry `tag`: Ray's, if it left any behind."""
    found = []
    for process in psutil.process_iter(["pid", "name", "status"]):
        if process.pid == os.getpid() or process.info["status"] == psutil.STATUS_ZOMBIE:
            continue
        try:
            if process.environ().get(MARKER) == tag:
                found.append(f"{process.pid} {process.info['name']}")
        except (psutil.AccessDenied, psutil.NoSuchProcess, psutil.ZombieProcess):
            continue
    return found


def assert_ray_gone(tag: str) -> None:
    assert not ray.is_initialized()
    deadline = time.monotonic() + 10  # processes told to stop may take a moment to exit
    while (left := tagged_processes(tag)) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert left == []
