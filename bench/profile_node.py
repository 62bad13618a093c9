"""Run one Headwater node under a profiler: ``python -m bench.profile_node --out F -- ARGS``.

``ARGS`` are ``python -m frontend``'s.  The node runs in this process exactly as ``frontend``
runs it.  The profile covers a *window*: SIGUSR2 writes what was collected since the previous
SIGUSR2 (or the start) to ``F`` in pstats format, with the top functions as text in ``F.txt``,
and starts collecting afresh; the benchmark sends one at the start of a measured window (that
profile is the warm-up's, overwritten) and one at its end.  The node's exit writes a last one.

yappi, when installed, profiles every thread (the event loop *and* the Kafka producer/consumer
threads, whose Python code holds the GIL too) on CPU time; otherwise cProfile profiles the event
loop thread only, on wall time.  SIGUSR1 writes every thread's stack to the node's log.
"""

from __future__ import annotations

import argparse
import cProfile
import faulthandler
import io
import pstats
import signal
import sys
from pathlib import Path
from types import FrameType

from frontend.node import main as node_main

TOP = 40


class Window:
    """The profiler, and writing out what it collected since the last write."""

    def __init__(self, out: Path, use_yappi: bool) -> None:
        self.out = out
        self.use_yappi = use_yappi
        self.profile = cProfile.Profile()

    def start(self) -> None:
        if self.use_yappi:
            import yappi

            yappi.set_clock_type("cpu")
            yappi.start(builtins=True, profile_threads=True)
        else:
            self.profile = cProfile.Profile()
            self.profile.enable()

    def write(self) -> None:
        """Save what was collected, then collect afresh."""
        if self.use_yappi:
            import yappi

            yappi.stop()
            yappi.get_func_stats().save(str(self.out), type="pstat")
            threads = io.StringIO()
            yappi.get_thread_stats().print_all(out=threads)
            yappi.clear_stats()
            self.summarize("yappi (all threads, CPU time)", threads.getvalue())
        else:
            self.profile.disable()
            self.profile.dump_stats(self.out)
            self.summarize("cProfile (event-loop thread only, wall time)", "")
        self.start()

    def stop(self) -> None:
        self.write()
        if self.use_yappi:
            import yappi

            yappi.stop()
        else:
            self.profile.disable()

    def summarize(self, how: str, extra: str) -> None:
        text = io.StringIO()
        text.write(f"profiler: {how}\n{extra}\n")
        stats = pstats.Stats(str(self.out), stream=text)
        stats.sort_stats("tottime").print_stats(TOP)
        stats.sort_stats("cumulative").print_stats(TOP)
        self.out.with_suffix(self.out.suffix + ".txt").write_text(text.getvalue())


def yappi_available() -> bool:
    try:
        import yappi  # noqa: F401
    except ImportError:
        return False
    return True


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.profile_node")
    parser.add_argument("--out", required=True, type=Path, help="pstats file to write")
    parser.add_argument("--profiler", choices=("auto", "yappi", "cprofile"), default="auto")
    parser.add_argument("node_args", nargs=argparse.REMAINDER)
    args = parser.parse_args()
    node_args = args.node_args[1:] if args.node_args[:1] == ["--"] else args.node_args
    use_yappi = args.profiler == "yappi" or (args.profiler == "auto" and yappi_available())
    args.out.parent.mkdir(parents=True, exist_ok=True)
    window = Window(args.out, use_yappi)

    def on_usr2(_sig: int, _frame: FrameType | None) -> None:
        window.write()

    faulthandler.register(signal.SIGUSR1, all_threads=True)
    signal.signal(signal.SIGUSR2, on_usr2)
    window.start()
    try:
        return node_main(node_args)
    finally:
        window.stop()


if __name__ == "__main__":
    sys.exit(main())
