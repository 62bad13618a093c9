"""Issue 14's targets, judged on the figures of the run that measured them.

Each target is checked row by row (a scenario and, for throughput, its variant); a row missing
from the run is *not measured*, which leaves its target unmet.  Where a check is missed, the text
says by how much: a ratio short of its target by the share missing ("0.31x, target 0.5x: short by
38%"), a latency over its bound by the factor ("p99 41.2 ms, target 20 ms: 2.1x over").

Ratios compare messages delivered per second at the subscribers (Headwater / mosquitto, both of
this run); the figures are the rows' own, whether or not the other broker collapsed.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from bench.scenarios import SCENARIOS, Result

Lookup = Callable[[str, str, str], "Result | None"]
"""(scenario key, variant, broker) -> that run's result, if the run has it."""

FANIN_RATIO = 0.5
FANOUT_RATIO = 1.5
PACED_P99_MS = 20.0
LATENCY_P99_MS = 3.0
LATENCY_RATE = 1_000.0
SCHEDULE_SHARE = 0.99
"""A paced run whose publishers sent less than this share of the schedule was not paced at the
target's rate."""
VARIANT_NAMES = {"flood": "open loop", "bounded": "bounded", "": ""}


@dataclass(slots=True)
class Check:
    row: str
    met: bool
    text: str


@dataclass(slots=True)
class Target:
    title: str
    checks: list[Check] = field(default_factory=list)

    @property
    def met(self) -> bool:
        return bool(self.checks) and all(c.met for c in self.checks)


def row_name(key: str, variant: str) -> str:
    sc = SCENARIOS[key]
    name = f"{sc.number} {sc.title}"
    return f"{name}, {VARIANT_NAMES[variant]}" if VARIANT_NAMES.get(variant) else name


def ratio_text(value: float, target: float) -> tuple[bool, str]:
    if value >= target:
        return True, f"{value:.2f}x, target {target:g}x: met"
    return False, f"{value:.2f}x, target {target:g}x: short by {1 - value / target:.0%}"


def bound_text(what: str, value: float, bound: float) -> tuple[bool, str]:
    if value <= bound:
        return True, f"{what} {value:.2f} ms, target <= {bound:g} ms: met"
    over = value / bound
    by = f"{over:.1f}x over" if over >= 1.5 else f"over by {over - 1:.0%}"
    return False, f"{what} {value:.2f} ms, target <= {bound:g} ms: {by}"


def failed(result: Result | None, broker: str) -> str | None:
    """Why ``result`` cannot be judged, or None."""
    if result is None:
        return f"{broker} not measured in this run"
    if not result.ok:
        first = result.error.splitlines()[0][:100] if result.error else "?"
        return f"{broker} failed: {first}"
    return None


def ratio_check(
    get: Lookup, key: str, variant: str, target: float, with_loss: bool = False
) -> Check | None:
    """Headwater / mosquitto on one row; None if neither ran it."""
    head, other = get(key, variant, "headwater"), get(key, variant, "mosquitto")
    if head is None and other is None:
        return None
    name = row_name(key, variant)
    why = failed(head, "Headwater") or failed(other, "mosquitto")
    if why is not None:
        return Check(name, False, f"NOT met: {why}")
    assert head is not None and other is not None
    if not other.delivered:
        return Check(name, True, "mosquitto delivered nothing: met")
    met, text = ratio_text(head.delivered / other.delivered, target)
    text = f"Headwater {head.delivered:,.0f}/s, mosquitto {other.delivered:,.0f}/s: {text}"
    if with_loss:
        lost = max(0, head.expected - head.received)
        if lost > 0:
            met = False
            text += (
                f"; but Headwater lost {lost:,} of {head.expected:,} ({head.loss:.2%}), target 0"
            )
        else:
            text += f"; nothing lost ({head.received:,} of {head.expected:,})"
    return Check(name, met, text if met else f"NOT met: {text}")


def paced_check(get: Lookup, key: str, rate: float) -> Check:
    head = get(key, "", "headwater")
    name = row_name(key, "")
    why = failed(head, "Headwater")
    if why is not None:
        return Check(name, False, f"NOT met: {why}")
    assert head is not None
    lost = head.lost or 0
    parts, met = [], True
    if lost:
        met = False
        parts.append(f"lost {lost:,} of {head.acked:,} PUBACKed, target 0")
    else:
        parts.append(f"lost 0 of {head.acked:,} PUBACKed")
    p99_met, p99 = bound_text("p99", head.p99_ms, PACED_P99_MS)
    met &= p99_met
    parts.append(p99 if not p99_met else f"p99 {head.p99_ms:.2f} ms")
    share = head.schedule_share
    sent = f"{share:.1%} of the schedule sent in the window ({head.offered:,.0f}/s offered)"
    if share < SCHEDULE_SHARE:
        met = False
        sent += f", target {SCHEDULE_SHARE:.0%}: short by {1 - share:.1%}"
    parts.append(sent)
    if rate != 20_000:
        parts.append(f"run at {rate:,.0f} msg/s, the target is at 20,000")
        met = False
    return Check(name, met, ("met: " if met else "NOT met: ") + "; ".join(parts))


def latency_check(get: Lookup, key: str, rate: float) -> Check | None:
    head = get(key, "", "headwater")
    if head is None:
        return None
    name = row_name(key, "")
    why = failed(head, "Headwater")
    if why is not None:
        return Check(name, False, f"NOT met: {why}")
    met, text = bound_text("p99", head.p99_ms, LATENCY_P99_MS)
    if rate != LATENCY_RATE:
        met = False
        text += f" (run at {rate:,.0f} msg/s, the target is at {LATENCY_RATE:,.0f})"
    return Check(name, met, text if met else f"NOT met: {text}")


def judge(get: Lookup, rate: float, paced_rate: float) -> list[Target]:
    """Every issue-14 target, with its checks on this run's rows."""

    def ratios(key: str, target: float, loss_in: str = "") -> list[Check]:
        found = [ratio_check(get, key, v, target, v == loss_in) for v in ("flood", "bounded")]
        return [c for c in found if c is not None]

    qos0 = Target(
        f"QoS 0 fan-in >= {FANIN_RATIO:g}x mosquitto on one node", ratios("fanin-qos0", FANIN_RATIO)
    )
    qos1 = Target(f"QoS 1 unpaced (open loop) fan-in >= {FANIN_RATIO:g}x mosquitto")
    check = ratio_check(get, "fanin-qos1", "flood", FANIN_RATIO)
    qos1.checks = [check] if check is not None else []
    paced = Target(
        f"QoS 1 fan-in paced at 20,000 msg/s: 0 lost, p99 <= {PACED_P99_MS:g} ms, on one node "
        "and across nodes",
        [paced_check(get, k, paced_rate) for k in ("paced-qos1", "cluster-paced-qos1")],
    )
    fanout = Target(
        f"QoS 0 fan-out >= {FANOUT_RATIO:g}x mosquitto with nothing lost (loss 0 open loop)",
        ratios("fanout-qos0", FANOUT_RATIO, loss_in="flood"),
    )
    keys = ("latency-qos0", "latency-qos1", "cluster-latency-qos0", "cluster-latency-qos1")
    found = [latency_check(get, k, rate) for k in keys]
    latency = Target(
        f"p99 at 1,000 msg/s <= {LATENCY_P99_MS:g} ms for QoS 0 and QoS 1, one node and across "
        "nodes",
        [c for c in found if c is not None],
    )
    if len(latency.checks) < len(keys):
        missing = [k for k, c in zip(keys, found, strict=True) if c is None]
        latency.checks.append(Check(", ".join(missing), False, "NOT met: not measured in this run"))
    return [qos0, qos1, paced, fanout, latency]


def render(get: Lookup, rate: float, paced_rate: float) -> list[str]:
    targets = judge(get, rate, paced_rate)
    met = sum(t.met for t in targets)
    lines = [
        "## Targets",
        "",
        f"Issue 14's targets, each judged on the figures of this run ({met} of {len(targets)} "
        "met). Ratios are of messages delivered per second, Headwater / mosquitto.",
        "",
    ]
    for t in targets:
        lines.append(f"- **{t.title}: {'met' if t.met else 'NOT met'}.**")
        if not t.checks:
            lines.append("  - not measured in this run")
        lines += [f"  - {c.row}: {c.text}" for c in t.checks]
    return lines
