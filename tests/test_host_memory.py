"""seqtrain.host_memory: freed tensors are reused by the next step instead of being faulted in anew."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import textwrap

import pytest

from seqtrain.host_memory import _user_chose_allocator

glibc = pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="the settings are glibc malloc's")

# A training step in miniature: eight 24 MiB activations live at once, all freed at the end, five times over.
# Prints the minor page faults of each round and whether the settings were applied.
STEPS = textwrap.dedent(
    """
    import json, resource, sys
    import torch
    from seqtrain_cli._main import run_cli
    from seqtrain import host_memory

    def steps(argv):
        faults = []
        for _ in range(5):
            before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
            live = [torch.ones(6 * 1024 * 1024) for _ in range(8)]
            del live
            faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
        print(json.dumps({"applied": host_memory._applied, "faults": faults}))
        return 0

    run_cli("steps", steps, [])
    """
)


def run_steps(**env: str) -> dict:
    full = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_") and k != "GLIBC_TUNABLES"}
    full.update(env)
    out = subprocess.run(
        [sys.executable, "-c", STEPS], env=full, capture_output=True, text=True, timeout=120, check=True
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


@glibc
def test_console_scripts_reuse_freed_memory_instead_of_faulting_it_in_again():
    kept = run_steps()
    assert kept["applied"] is True
    first, later = kept["faults"][0], kept["faults"][1:]
    assert first > 8 * 6 * 1024 * 1024 * 4 // 4096 * 0.9  # 192 MiB touched once: ~49,000 pages
    # the same memory again: nothing new to fault in, but for a block or two where a small allocation landed
    assert sum(later) < 0.25 * first, kept


@glibc
def test_a_user_tuned_malloc_is_left_alone():
    # glibc's defaults hand memory back or keep it depending on what else lies on the heap; a user asking for
    # every block to be its own mapping gets it, so each round faults its memory in again
    tuned = run_steps(MALLOC_MMAP_THRESHOLD_="131072")
    assert tuned["applied"] is False
    assert min(tuned["faults"][1:]) > 0.9 * tuned["faults"][0], tuned

    assert run_steps(SEQTRAIN_KEEP_HOST_MEMORY="0")["applied"] is False


@pytest.mark.parametrize(
    "env, chosen",
    [
        ({}, None),
        ({"SEQTRAIN_KEEP_HOST_MEMORY": "1"}, None),
        ({"SEQTRAIN_KEEP_HOST_MEMORY": "0"}, "SEQTRAIN_KEEP_HOST_MEMORY"),
        ({"SEQTRAIN_KEEP_HOST_MEMORY": "off"}, "SEQTRAIN_KEEP_HOST_MEMORY"),
        ({"MALLOC_MMAP_THRESHOLD_": "131072"}, "MALLOC_MMAP_THRESHOLD_"),
        ({"MALLOC_ARENA_MAX": "2"}, None),  # arenas are another matter
        ({"GLIBC_TUNABLES": "glibc.malloc.hugetlb=1"}, "GLIBC_TUNABLES"),
        ({"GLIBC_TUNABLES": "glibc.rtld.nns=2"}, None),
        ({"LD_PRELOAD": "/usr/lib/x86_64-linux-gnu/libjemalloc.so.2"}, "LD_PRELOAD"),
        ({"LD_PRELOAD": "/opt/lib/libtcmalloc_minimal.so.4"}, "LD_PRELOAD"),
    ],
)
def test_which_environments_count_as_the_users_choice(env, chosen):
    assert _user_chose_allocator(env) == chosen
