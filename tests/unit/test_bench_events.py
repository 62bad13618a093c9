"""``python -m bench events``: the ratios, the verdict and the section, from results given."""

from __future__ import annotations

import pytest

from bench.events import Run, geomean, ratios, render, verdict
from bench.throughput import Result, Settings


def results(key: str, side: str, rates: list[float], cpu_us: float = 600.0) -> list[Result]:
    return [Result(key, side, delivered=r, cpu_us=cpu_us, services_cpu=[0.2, 0.1]) for r in rates]


def a_run(on: list[float], off: list[float]) -> Run:
    run = Run(Settings(), len(on), "python -m bench events")
    run.results[("connect-clean", "on")] = results("connect-clean", "on", on, 630.0)
    run.results[("connect-clean", "off")] = results("connect-clean", "off", off)
    return run


def test_the_ratio_is_the_geometric_mean_of_the_rounds_own() -> None:
    run = a_run([900.0, 1100.0], [1000.0, 1000.0])
    assert ratios(run, "connect-clean") == [0.9, 1.1]
    assert geomean(ratios(run, "connect-clean")) == pytest.approx((0.9 * 1.1) ** 0.5)


def test_the_verdict_is_issue_24s_bound() -> None:
    assert verdict(a_run([960.0, 950.0], [1000.0, 1000.0]), "connect-clean").startswith("met")
    assert verdict(a_run([900.0, 950.0], [1000.0, 1000.0]), "connect-clean").startswith("NOT")


def test_the_section_shows_both_sides_and_the_ratios() -> None:
    section = render(a_run([950.0, 1000.0], [1000.0, 1000.0]))
    assert section.startswith("<!-- events:begin -->") and "<!-- events:end -->" in section
    row = next(line for line in section.splitlines() if line.startswith("| CONNECT then"))
    assert "975 per s, node 630 us a cycle, Kafka 20.0% of a core" in row
    assert "1,000 per s, node 600 us a cycle" in row
    assert "0.975 (0.950-1.000, 2 rounds)" in row and "1.050" in row and "met (>= 0.95)" in row
