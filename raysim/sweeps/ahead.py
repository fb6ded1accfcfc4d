"""A Tune trial's rounds, run in a thread of their own while Tune's controller reads the trial's
last reports.

Tune's controller asks a trial for its next report only once it has taken in the last one (its
scheduler, callbacks and logs: about 10 ms a report on 2 vCPUs, ``benchmarks/RESULTS.md``), and
the trial would wait that long every round. Here the rounds go on meanwhile, and each call from
the controller takes every report made since the last (``take``). The rounds stop only where the
scheduler may stop the trial (``decides``): there they wait for the controller's next call, which
comes only if the scheduler let the trial go on. So a scheduler acts on the same reports, at the
same rounds, as it would one report at a time.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from typing import Any

#: most reports handed to the controller at once (it warns where one call takes it 0.5 s)
REPORTS_AT_ONCE = 20


class ReportsAhead:
    """Calls ``produce`` in a thread, one report after another, until a report says ``done``,
    ``produce`` raises, or ``stop``. After a report for which ``decides`` is true (called once
    per report, in order), the thread waits for the call to ``take`` that follows the one that
    handed that report on. ``waiting``: the report before the first (which the caller handed
    on itself) was one."""

    def __init__(
        self,
        produce: Callable[[], dict[str, Any]],
        decides: Callable[[dict[str, Any]], bool],
        waiting: bool = False,
    ) -> None:
        self._produce, self._decides = produce, decides
        #: (report, whether it decides), or the error that ended the thread
        self._reports: queue.Queue[tuple[dict[str, Any], bool] | BaseException] = queue.Queue()
        self._go = threading.Event()  # clear: waits for the controller's next call
        self._owed = waiting  # the next ``take`` lets the thread past a deciding report
        if not waiting:
            self._go.set()
        self._stopping = False
        self._failure: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="raysim-trial-rounds", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while True:
            self._go.wait()
            if self._stopping:
                return
            try:
                report = self._produce()
            except BaseException as e:  # noqa: BLE001 - handed to the controller by ``take``
                self._reports.put(e)
                return
            decides = self._decides(report)
            if decides:
                self._go.clear()  # before the report is seen, so that no later call is missed
            self._reports.put((report, decides))
            if report.get("done"):
                return

    def take(self) -> list[dict[str, Any]]:
        """The reports made since the last call: at least one (waited for), at most
        ``REPORTS_AT_ONCE``. An error raised by ``produce`` is raised here once the reports made
        before it were handed on."""
        if self._failure is not None:
            failure, self._failure = self._failure, None
            raise failure
        if self._owed:
            self._owed = False
            self._go.set()
        reports: list[dict[str, Any]] = []
        item = self._reports.get()
        while True:
            if isinstance(item, BaseException):
                if not reports:
                    raise item
                self._failure = item
                break
            report, decides = item
            reports.append(report)
            if decides:
                self._owed = True
                break
            if len(reports) >= REPORTS_AT_ONCE:
                break
            try:
                item = self._reports.get_nowait()
            except queue.Empty:
                break
        return reports

    def stop(self) -> None:
        """End the thread, after the round it is in."""
        self._stopping = True
        self._go.set()
        self._thread.join()
