"""The runner's numbers, for Prometheus: a listener of the runner's events
that counts them, and a collector a registry can take
(``registry.register(metrics)``).

    huddle_runner_attempts_failed_total{kind}   attempts that ended in an error
                                                the runner could not turn into
                                                a result (kind: the exception)
    huddle_runner_turns_taken_over_total        turns a worker took over after
                                                theirs stopped
    huddle_runner_retries_scheduled_total       transient failures retried later
    huddle_runner_turns_ended_total{status}     turns that ended, by status
    huddle_runner_spare_workers                 spare workers running now, in
                                                the place of workers whose
                                                tools wait for people
    huddle_runner_spares_exhausted_total        waits for people that found
                                                every spare lent (other turns
                                                waited: --spare-workers)
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from typing import TYPE_CHECKING

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from server.runner.events import EventType, RunnerEvent

if TYPE_CHECKING:
    from server.runner.worker import Crew

_ENDINGS = {
    EventType.TURN_COMPLETED,
    EventType.TURN_FAILED,
    EventType.TURN_CANCELLED,
}


class RunnerMetrics:
    """Counts runner events (add it to ``runner.listeners``); ``crew``: the
    workers whose spares it shows."""

    def __init__(self, crew: Crew | None = None) -> None:
        self.crew = crew
        self.failed: Counter[str] = Counter()
        self.taken_over = 0
        self.retries = 0
        self.ended: Counter[str] = Counter()

    def __call__(self, event: RunnerEvent) -> None:
        if event.type == EventType.ATTEMPT_FAILED:
            self.failed[str(event.data.get("kind", "Exception"))] += 1
        elif event.type == EventType.TURN_TAKEN_OVER:
            self.taken_over += 1
        elif event.type == EventType.RETRY_SCHEDULED:
            self.retries += 1
        elif event.type in _ENDINGS:
            self.ended[str(event.data.get("status", event.type.value))] += 1

    def collect(self) -> Iterator[Metric]:
        failed = CounterMetricFamily(
            "huddle_runner_attempts_failed",
            "Turn attempts that ended in an error the runner could not turn into a result",
            labels=["kind"],
        )
        for kind, count in sorted(self.failed.items()):
            failed.add_metric([kind], count)
        yield failed
        yield CounterMetricFamily(
            "huddle_runner_turns_taken_over",
            "Turns a worker took over after the worker running them stopped",
            value=self.taken_over,
        )
        yield CounterMetricFamily(
            "huddle_runner_retries_scheduled",
            "Transient model or tool failures scheduled for a retry",
            value=self.retries,
        )
        ended = CounterMetricFamily(
            "huddle_runner_turns_ended", "Turns that ended, by status", labels=["status"]
        )
        for status, count in sorted(self.ended.items()):
            ended.add_metric([status], count)
        yield ended
        if self.crew is not None:
            yield GaugeMetricFamily(
                "huddle_runner_spare_workers",
                "Spare workers running in the place of workers whose tools wait for people",
                value=self.crew.lent,
            )
            yield CounterMetricFamily(
                "huddle_runner_spares_exhausted",
                "Waits for people inside tools that found every spare worker lent",
                value=self.crew.exhausted,
            )
