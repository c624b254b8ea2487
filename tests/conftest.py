"""Fixtures shared by several test modules."""

import os
import subprocess
import sys
import textwrap

import pytest
import torch


def pytest_configure(config):
    """Under pytest-xdist (``make test`` runs a worker per core), each worker and the processes its tests start run
    torch on one thread unless OMP_NUM_THREADS says otherwise: two threads a worker would put twice as many threads
    as cores, and torch's OpenMP threads spin while they wait, so they slow each other down (the suite took 504 s on
    two workers of two threads against 419 s on two of one, and 649 s without workers)."""
    if hasattr(config, "workerinput") and "OMP_NUM_THREADS" not in os.environ:  # (workerinput: on xdist's workers)
        os.environ["OMP_NUM_THREADS"] = "1"
        torch.set_num_threads(1)


@pytest.fixture
def one_thread():
    """torch on one thread for the test: tiny models run fastest so, and two threads on a busy two-core machine
    spin for ages. Modules of tiny models take it for every test with ``pytestmark``."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session", autouse=True)
def children_keep_temp_files_here(tmp_path_factory):
    """The processes tests start (torchrun's agents, Chromium) leave temporary folders of their own behind; pointing
    their TMPDIR into pytest's base folder keeps those with the test's other files, which pytest rotates, instead of
    piling up in the system's /tmp run after run."""
    folder = tmp_path_factory.mktemp("children-tmp")
    patch = pytest.MonkeyPatch()
    patch.setenv("TMPDIR", str(folder))
    yield folder
    patch.undo()


@pytest.fixture
def held_elsewhere():
    """Lock a folder from another process, as a training there would; the process ends with the test."""
    holders = []

    def hold(folder):
        proc = subprocess.Popen([sys.executable, "-c", textwrap.dedent("""
            import fcntl, os, sys, time
            fcntl.flock(os.open(sys.argv[1], os.O_RDONLY), fcntl.LOCK_EX | fcntl.LOCK_NB)  # (held: no wait)
            print("held", flush=True)
            time.sleep(600)
        """), str(folder)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        holders.append(proc)
        if proc.stdout.readline() != "held\n":
            pytest.fail(f"could not hold {folder}: {proc.communicate(timeout=60)[1]}")

    yield hold
    for proc in holders:
        proc.kill()
        proc.wait()



@pytest.fixture
def finished_meanwhile(monkeypatch):
    """Make a task module's ``ensure_writable_dir`` also write ``name`` (text ``content``) into the folder it makes,
    as another process's run would have done, started into the same new folder and finished between the task's
    first check and its lock. Call with (module, name, content)."""
    from attnlab.files import ensure_writable_dir

    def patch(module, name, content):
        def made_and_taken(path):
            made = ensure_writable_dir(path)
            (made / name).write_text(content)
            return made

        monkeypatch.setattr(module, "ensure_writable_dir", made_and_taken)

    return patch
