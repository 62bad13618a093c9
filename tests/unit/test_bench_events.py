"""``python -m bench events``: the ratios, the interval, the verdict and the section, from results
given."""

from __future__ import annotations

import pytest

from bench.events import Run, geomean, interval, ratios, render, side_cell, verdict
from bench.throughput import Result, Settings


def results(key: str, side: str, rates: list[float], cpu_us: float = 600.0) -> list[Result]:
    return [
        Result(key, side, delivered=r, cycles=int(3 * r), cpu_us=cpu_us, services_cpu=[0.2, 0.1])
        for r in rates
    ]


def a_run(on: list[float], off: list[float], control: list[float] | None = None) -> Run:
    run = Run(Settings(), len(on), "python -m bench events")
    run.results[("connect-clean", "on")] = results("connect-clean", "on", on, 630.0)
    run.results[("connect-clean", "off")] = results("connect-clean", "off", off)
    run.results[("connect-clean", "control")] = results("connect-clean", "control", control or on)
    cycles = [int(3 * r) for r in on]
    run.written = {("connect-clean", "on"): [2 * cycles[0] - 600, 2 * cycles[1] + 600]}
    run.written[("connect-clean", "control")] = [2 * int(3 * r) for r in control or on]
    run.written[("connect-clean", "off")] = [0, 0]
    return run


def test_the_ratio_is_the_geometric_mean_of_the_rounds_own() -> None:
    run = a_run([900.0, 1100.0], [1000.0, 1000.0], [1000.0, 1000.0])
    # against off: both windows with events (on and control); against control: on alone
    assert ratios(run, "connect-clean") == pytest.approx([0.9**0.5, 1.1**0.5])
    assert geomean(ratios(run, "connect-clean")) == pytest.approx((0.9 * 1.1) ** 0.25)
    assert ratios(run, "connect-clean", "control") == [0.9, 1.1]


def test_the_interval_holds_the_mean_and_widens_with_the_spread() -> None:
    tight, loose = [0.97, 0.98, 0.99, 1.0] * 3, [0.8, 0.9, 1.05, 1.2] * 3
    for values in (tight, loose):
        low, high = interval(values)
        assert min(values) <= low < geomean(values) < high <= max(values)
    assert interval(loose)[1] - interval(loose)[0] > 3 * (interval(tight)[1] - interval(tight)[0])


def test_the_verdict_asks_the_whole_interval_to_hold_the_bound() -> None:
    assert verdict(a_run([960.0, 950.0], [1000.0, 1000.0]), "connect-clean").startswith("met")
    spread = a_run([900.0, 1020.0, 1020.0, 1020.0], [1000.0] * 4)
    assert verdict(spread, "connect-clean").startswith("not shown")
    assert verdict(a_run([900.0, 950.0], [1000.0, 1000.0]), "connect-clean").startswith("NOT")


def test_the_section_shows_every_side_and_the_ratios() -> None:
    section = render(a_run([950.0, 1000.0], [1000.0, 1000.0], [1000.0, 950.0]))
    assert section.startswith("<!-- events:begin -->") and "<!-- events:end -->" in section
    row = next(line for line in section.splitlines() if line.startswith("| CONNECT then"))
    cells = [cell.strip() for cell in row.split("|")[2:-1]]
    assert cells[0] == (
        "975 per s, node 630 us a cycle, Kafka 20.0% of a core, 0% stolen, 11,700 events "
        "written in 5,850 CONNECTs"
    )
    assert cells[1].startswith("1,000 per s, node 600 us a cycle")
    assert cells[1].endswith(" 0 events written in 6,000 CONNECTs")
    assert cells[2].startswith("975 per s")
    assert cells[3] == "0.975 (95%: 0.975-0.975, 2 rounds)"  # (950 x 1000) ** 0.5 / 1000 twice
    assert cells[4].startswith("1.000 (95%: 0.950-1.05")
    assert cells[5:] == ["1.025", "met (the interval >= 0.95)"]  # (630 x 600) ** 0.5 / 600


def test_a_side_says_the_median_share_of_cpu_time_stolen() -> None:
    rounds = results("connect-clean", "on", [1000.0, 1000.0, 1000.0])
    for r, stolen in zip(rounds, (0.02, 0.19, 0.05), strict=True):
        r.stolen = stolen
    assert ", Kafka 20.0% of a core, 5% stolen, 12 events" in side_cell(rounds, [12])
