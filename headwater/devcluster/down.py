"""`headwater dev down`: stop the cluster recorded in a state directory.

If the `dev up` process is alive it gets SIGTERM and stops its own children in order. Whatever is
still alive afterwards (because `dev up` had died, or did not finish in time) is stopped group by
group, newest first. Processes are recognised by pid and start time, never by pid alone.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path
from typing import TextIO

from headwater.devcluster.state import read_state, remove_state
from headwater.services.process import ProcessIdentity, terminate_group


def _wait_gone(identity: ProcessIdentity, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while identity.alive():
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.1)
    return True


def run_down(state_dir: Path, out: TextIO = sys.stdout, timeout: float = 120.0) -> int:
    """Stop the recorded cluster; 0 whether or not anything was running."""
    state = read_state(state_dir)
    if state is None:
        print(f"headwater: no dev cluster recorded in {state_dir}", file=out)
        return 0
    parent = state.parent.identity
    if parent.alive():
        print(f"headwater: stopping dev up (pid {parent.pid})...", file=out, flush=True)
        os.kill(parent.pid, signal.SIGTERM)
        _wait_gone(parent, timeout)
    leftovers = [child for child in state.children if child.identity.alive()]
    for child in reversed(leftovers):
        print(f"headwater: stopping leftover {child.name} (pid {child.pid})", file=out, flush=True)
        terminate_group(child.identity)
    remove_state(state_dir)
    print("headwater: dev cluster is down", file=out)
    return 0
