"""The main benchmark's pure parts added for issue 14: the targets' verdict (met / missed and by
how much), the paced runs' figures from their reports, the worker-scaling share of messages that
crossed workers, and the report around them."""

from __future__ import annotations

import datetime

from bench.fanin import PublisherReport, SubscriberReport
from bench.paced import fill
from bench.report import Environment, render
from bench.scenarios import Result, Settings
from bench.targets import bound_text, judge, ratio_text
from bench.worker_scaling import crossed_share, section


def result(key: str, broker: str, variant: str = "", **figures: float) -> Result:
    r = Result(key, broker, broker, variant)
    for name, value in figures.items():
        setattr(r, name, value)
    return r


def paced(key: str, lost: int, p99: float, offered: float = 20_000.0) -> Result:
    r = result(key, "headwater", p99_ms=p99, acked=1000, offered=offered, scheduled_rate=20_000)
    r.lost = lost
    return r


def lookup(results: list[Result]):  # type: ignore[no-untyped-def]
    found = {(r.scenario, r.variant, r.broker): r for r in results}
    return lambda key, variant, broker: found.get((key, variant, broker))


def test_ratio_text_says_how_short() -> None:
    assert ratio_text(0.31, 0.5) == (False, "0.31x, target 0.5x: short by 38%")
    assert ratio_text(0.6, 0.5) == (True, "0.60x, target 0.5x: met")


def test_bound_text_says_how_far_over() -> None:
    assert bound_text("p99", 41.2, 20) == (False, "p99 41.20 ms, target <= 20 ms: 2.1x over")
    assert bound_text("p99", 2.0, 3)[0]
    assert bound_text("p99", 3.06, 3) == (False, "p99 3.06 ms, target <= 3 ms: over by 2%")


def test_targets_judged_on_the_run() -> None:
    results = [
        result("fanin-qos0", "headwater", "flood", delivered=60_000),
        result("fanin-qos0", "mosquitto", "flood", delivered=100_000),
        result("fanin-qos1", "headwater", "flood", delivered=10_000),
        result("fanin-qos1", "mosquitto", "flood", delivered=40_000),
        result("fanout-qos0", "headwater", "flood", delivered=500, expected=10, received=10),
        result("fanout-qos0", "mosquitto", "flood", delivered=300),
        paced("paced-qos1", 0, 4.0),
        paced("cluster-paced-qos1", 3, 41.2),
        result("latency-qos0", "headwater", p99_ms=2.5),
        result("latency-qos1", "headwater", p99_ms=3.5),
    ]
    qos0, qos1, pacing, fanout, latency = judge(lookup(results), 1000.0, 20_000.0)
    assert qos0.met and not qos1.met and fanout.met
    assert "short by 50%" in qos1.checks[0].text
    assert pacing.checks[0].met and not pacing.checks[1].met and not pacing.met
    assert "lost 3 of 1,000 PUBACKed, target 0" in pacing.checks[1].text
    assert "2.1x over" in pacing.checks[1].text
    assert not latency.met
    assert [c.met for c in latency.checks] == [True, False, False]
    assert "not measured" in latency.checks[-1].text


def test_paced_behind_schedule_is_not_met() -> None:
    results = [paced("paced-qos1", 0, 1.0, 18_000), paced("cluster-paced-qos1", 0, 1.0)]
    _, _, pacing, _, _ = judge(lookup(results), 1000.0, 20_000.0)
    assert not pacing.checks[0].met and "90.0% of the schedule" in pacing.checks[0].text
    assert pacing.checks[1].met


def test_fanout_loss_misses_the_target() -> None:
    results = [
        result("fanout-qos0", "headwater", "flood", delivered=500, expected=100, received=90),
        result("fanout-qos0", "mosquitto", "flood", delivered=300),
    ]
    fanout = judge(lookup(results), 1000.0, 20_000.0)[3]
    assert not fanout.met and "lost 10 of 100" in fanout.checks[0].text


def test_paced_figures_from_reports() -> None:
    pubs = [
        PublisherReport("a", 10, [0, 1, 2, 3], 10, False, sent_window=8),
        PublisherReport("b", 10, list(range(10)), 10, False, sent_window=8),
    ]
    sub = SubscriberReport(received=14, seen={"a": {0, 1, 2}, "b": set(range(10))})
    sub.duplicates, sub.received_window, sub.p99_ms = 1, 12, 5.0
    r = fill(Result("paced-qos1", "headwater", "Headwater"), pubs, sub, 2.0, 16.0, 40)
    assert (r.sent, r.acked, r.lost, r.received, r.duplicates) == (20, 14, 1, 13, 1)
    assert r.offered == 8.0 and r.delivered == 6.0 and r.schedule_share == 0.5
    assert r.loss == 1 / 14
    assert any("6 sent and never PUBACKed" in n for n in r.notes)
    assert any("50.0% of their schedule" in n and "50.0% over the whole" in n for n in r.notes)


def stats(received: int, sent: int) -> dict[str, dict[str, int]]:
    return {
        "messages_received_by_qos": {"0": received, "1": 0},
        "messages_sent_by_qos": {"0": sent, "1": 0},
    }


def test_crossed_share_is_what_other_workers_received() -> None:
    before = [stats(0, 0), stats(0, 0)]
    after = [stats(300, 0), stats(100, 400)]
    share, text = crossed_share(before, after)
    assert share == 0.75
    assert "worker 1: received 300 from publishers, sent 0" in text
    assert crossed_share(before, before) == (None, "")


def test_report_renders_new_rows_and_sections() -> None:
    results = [
        paced("paced-qos1", 0, 4.0),
        result("paced-qos1", "mosquitto", p99_ms=1.0, acked=5, sent=5, scheduled_rate=5),
        result("workers", "headwater-w1", "fanin-qos0 flood", delivered=100.0),
        result("workers", "headwater-w2", "fanin-qos0 flood", delivered=150.0),
    ]
    results[1].lost = 0
    results[3].cross_worker = 0.5
    env = Environment("python -m bench", datetime.datetime.now(datetime.UTC), "k", {}, "0")
    text = render(results, Settings(), env, ["how"])
    assert "| 8 | fan-in QoS 1, 4 pub -> 1 sub, paced |" in text
    assert "## Worker scaling (#10)" in text and "| 1.50x | 50% |" in text
    assert "### Paced QoS 1 fan-in (#8, #9)" in text
    assert "### The earlier issue's targets" in text


def test_workers_section_when_the_nodes_did_not_start() -> None:
    failed = Result("workers", "headwater", "Headwater", ok=False, error="no --workers flag")
    lines = section([failed], (1, 2))
    assert lines[0] == "## Worker scaling (#10)" and "Failed: no --workers flag" in lines
