"""Start-up progress of `flowc run` (serving), on stderr: which replicas are starting, which
are setting up their role (importing it, loading its model in `setup()`), which are ready.

It is told by the deployment itself (flowrt.deploy.launch's `progress(event, role, replica)`:
`planned`, `starting`, `setup_started`, `setup_ended`, `ready`), never by a timer. On a terminal
it draws a rich progress bar per role; elsewhere it writes one plain line per replica ready
(`replica ROLE#N ready after 2.31s`, counted from the first step it was seen to take: its
process started, under local; its `setup()` started, inproc). Once every replica
planned is ready it stops: what happens after (a restart, say) is the log's to tell.
"""

from __future__ import annotations

import time
from collections import Counter
from typing import Any, TextIO

MODES = ("bars", "lines", "off")
STATES = {"planned": "waiting", "starting": "starting", "setup_started": "setting up", "setup_ended": "set up", "ready": "ready"}


class Startup:
    """`progress` for open_deployment: bars (rich), lines or nothing (`mode`), on `stream`."""

    def __init__(self, stream: TextIO, mode: str, clock: Any = time.monotonic):
        if mode not in MODES:
            raise ValueError(f"progress mode is one of {', '.join(MODES)}, not {mode!r}")
        self.stream = stream
        self.mode = mode
        self.clock = clock
        self.states: dict[tuple[str, int], str] = {}
        self.began: dict[tuple[str, int], float] = {}  # when each replica was first seen starting or setting up
        self.done = False
        self.bars: Any = None  # rich.progress.Progress, once the first replica is planned
        self.tasks: dict[str, Any] = {}  # role -> its bar

    @classmethod
    def for_stream(cls, stream: TextIO, quiet: bool = False) -> Startup:
        """Bars on a terminal, lines elsewhere, nothing when `quiet`."""
        isatty = getattr(stream, "isatty", None)
        return cls(stream, "off" if quiet else "bars" if isatty is not None and isatty() else "lines")

    def __call__(self, event: str, role: str, replica: int) -> None:
        if self.done or self.mode == "off" or event not in STATES:
            return
        key = (role, replica)
        was_ready = self.states.get(key) == "ready"
        if event == "planned":
            self.states.setdefault(key, STATES[event])
        elif self.states.get(key) != "ready":  # (a replica's steps come by two ways, its stderr and the registry:
            self.states[key] = STATES[event]  # one that registered is ready whatever its stderr says after)
        if event in ("starting", "setup_started"):
            self.began.setdefault(key, self.clock())
        if self.mode == "lines":
            if event == "ready" and not was_ready:
                began = self.began.get(key)
                self.stream.write(
                    f"replica {role}#{replica} ready"
                    + (f" after {self.clock() - began:.2f}s" if began is not None else "")
                    + "\n"
                )
                self.stream.flush()
        else:
            self._draw(role)
        if event == "ready" and all(state == "ready" for state in self.states.values()):
            self.close()

    def _draw(self, role: str) -> None:
        if self.bars is None:
            from rich.console import Console
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

            self.bars = Progress(
                SpinnerColumn(finished_text="[green]✓[/]"),
                TextColumn("[bold]{task.description}"),
                BarColumn(),
                MofNCompleteColumn(),
                TextColumn("replicas ready"),
                TextColumn("[dim]{task.fields[detail]}"),
                TimeElapsedColumn(),
                console=Console(file=self.stream, force_terminal=True),
                redirect_stdout=False,  # (stdout is the URL's, and a call's events')
            )
            self.bars.start()
        keys = [key for key in self.states if key[0] == role]
        counts = Counter(self.states[key] for key in keys)
        detail = ", ".join(f"{n} {state}" for state, n in sorted(counts.items()) if state != "ready")
        if role not in self.tasks:
            self.tasks[role] = self.bars.add_task(role, total=len(keys), detail=detail)
        self.bars.update(self.tasks[role], total=len(keys), completed=counts["ready"], detail=detail)
        self.bars.refresh()  # (every step drawn as it happens, not only at the next tick)

    def close(self) -> None:
        """Stop drawing (every replica is ready, or the start failed)."""
        self.done = True
        if self.bars is not None:
            self.bars.stop()
            self.bars = None
