"""bench.profile's pure parts: reading py-spy's collapsed stacks, bucketing each sample by its
deepest matching frame, self samples per function, and the report's file section."""

from __future__ import annotations

from pathlib import Path

from bench.profile import (
    BEGIN,
    BUCKETS,
    END,
    OTHER,
    Reading,
    Rule,
    Window,
    bucket_of,
    function_of,
    parse_collapsed,
    parse_frame,
    summarise,
)
from bench.report import write_section

LOOP = "_run (asyncio/events.py:84)"
DATA = "MqttConnection.data_received (frontend/connection.py:274)"
DRAIN = "MqttConnection._drain (frontend/connection.py:355)"
PUMP = "KafkaLog._pump (router/log.py:353)"

COLLAPSED = "\n".join(
    [
        # decode: the codec under data_received
        f"{LOOP};{DATA};_Input.take (frontend/connection.py:172);Decoder.feed "
        "(mqttcore/codec.py:154);Decoder._decode_packets (mqttcore/codec.py:191) 40",
        # channel: handle_in, with the message constructor (no rule) below it
        f"{LOOP};{DATA};{DRAIN};Channel.handle_in (mqttcore/channel.py:210);"
        "Message.__init__ (<string>:2) 20",
        # produce: record.encode under the log's produce, under the channel's run
        f"{LOOP};{DATA};{DRAIN};MqttConnection.run (frontend/connection.py:383);"
        "Publishing.produce (frontend/publishing.py:95);KafkaLog.produce (router/log.py:300);"
        "encode (router/record.py:90) 15",
        # the partitioner has a rule of its own; router.route (no rule) falls to its caller
        f"{LOOP};{DATA};{DRAIN};MqttConnection.run (frontend/connection.py:383);"
        "KafkaLog.produce (router/log.py:298);Router.route (router/partitioner.py:60) 5",
        # reports: the delivery callback; its PUBACK write is the writes bucket (deeper)
        f"{LOOP};{PUMP};KafkaLog._serve_producer (router/log.py:371) 10",
        f"{LOOP};{PUMP};KafkaLog._serve_producer (router/log.py:374);KafkaLog._deliver_reports "
        "(router/log.py:395);Publishing._produce.<locals>.callback (frontend/publishing.py:110);"
        "_Output.write (frontend/connection.py:98) 4",
        # consume + decode, dispatch, template encoding
        f"{LOOP};{PUMP};LogReader.serve (router/reader.py:75);LogReader._decode "
        "(router/reader.py:156);decode (router/record.py:160) 8",
        f"{LOOP};{PUMP};Dispatcher.dispatch (router/dispatch.py:166);Dispatcher._dispatch_one "
        "(router/dispatch.py:180) 6",
        f"{LOOP};{PUMP};Dispatcher.dispatch (router/dispatch.py:166);MqttConnection.deliver "
        "(frontend/connection.py:320);Session.deliver (mqttcore/session.py:300);"
        "PublishTemplate.to_bytes (mqttcore/codec.py:580) 7",
        # other: the loop, the pump itself, a native frame
        f"{LOOP};{PUMP} 3",
        f"{LOOP} 2",
        "",
        "not a sample line",
    ]
)


def test_frames_are_split_into_function_and_file() -> None:
    assert parse_frame("Decoder.feed (mqttcore/codec.py:154)") == (
        "Decoder.feed",
        "mqttcore/codec.py",
    )
    assert parse_frame("f (a (b)/x.py)") == ("f (a (b)/x.py)", "")  # not our shape: kept whole
    assert parse_frame("<module> (spin.py)") == ("<module>", "spin.py")
    assert parse_frame("librdkafka.so") == ("librdkafka.so", "")
    assert function_of("Decoder.feed (mqttcore/codec.py:154)") == (
        "Decoder.feed (mqttcore/codec.py)"
    )


def test_collapsed_stacks_are_read_root_first_with_their_counts() -> None:
    stacks = parse_collapsed("a (x.py:1);b (y.py:2) 7\nc (z.py:3) 1\nbroken line\n\n")
    assert stacks == [(["a (x.py:1)", "b (y.py:2)"], 7), (["c (z.py:3)"], 1)]


def test_the_deepest_matching_frame_decides() -> None:
    frames = [LOOP, DATA, DRAIN, "Channel.handle_in (mqttcore/channel.py:210)"]
    assert bucket_of(frames) == "channel"
    assert bucket_of([*frames, "Message.__init__ (<string>:2)"]) == "channel"
    assert bucket_of([LOOP, PUMP]) == OTHER
    assert bucket_of(["PublishTemplate.__init__ (mqttcore/codec.py:560)"]) == "writes"
    assert bucket_of(["_decode_publish (mqttcore/codec.py:300)"]) == "decode"
    # a full path (py-spy --full-filenames) matches by its tail, a lookalike does not
    assert bucket_of(["LogReader.serve (/work/main/router/reader.py:75)"]) == "consume"
    assert bucket_of(["LogReader.serve (notrouter/reader.py:75)"]) == OTHER


def test_rules_match_exact_names_and_prefixes() -> None:
    rule = Rule("x", "router/log.py", ("Outbox.*", "KafkaLog.produce"))
    assert rule.matches("router/log.py", "Outbox.add")
    assert rule.matches("/abs/router/log.py", "KafkaLog.produce")
    assert not rule.matches("router/log.py", "KafkaLog.produce_more")
    assert not rule.matches("router/reader.py", "Outbox.add")
    assert Rule("y", "router/log.py").matches("router/log.py", "anything")


def test_summary_counts_every_sample_once() -> None:
    summary = summarise(COLLAPSED)
    assert summary.samples == 120
    assert summary.buckets == {
        "decode": 40,
        "channel": 20,
        "produce": 20,
        "reports": 10,
        "consume": 8,
        "dispatch": 6,
        "writes": 11,
        "other": 5,
    }
    assert set(summary.buckets) == {b.key for b in BUCKETS}
    assert sum(summary.buckets.values()) == summary.samples
    assert summary.share(summary.buckets["decode"]) == 40 / 120


def test_self_samples_rank_functions_without_line_numbers() -> None:
    summary = summarise(COLLAPSED + f"\n{LOOP};{PUMP};Dispatcher.dispatch "
                        "(router/dispatch.py:168);Dispatcher._dispatch_one "
                        "(router/dispatch.py:185) 30")  # fmt: skip
    top = summary.self_samples
    assert top[0] == ("Decoder._decode_packets (mqttcore/codec.py)", 40, "decode")
    assert top[1] == ("Dispatcher._dispatch_one (router/dispatch.py)", 36, "dispatch")
    assert top[-1][1] <= top[-2][1]
    assert sum(n for _, n, _ in top) == summary.samples


def test_an_empty_profile_summarises_to_nothing() -> None:
    summary = summarise("")
    assert summary.samples == 0
    assert summary.share(0) == 0.0
    assert all(n == 0 for n in summary.buckets.values())


def test_cpu_per_message() -> None:
    before = Reading(10, 0, 10, 1.0, 1.0, 0.5, at=100.0)
    after = Reading(200_010, 150_000, 200_010, 4.0, 3.0, 1.5, at=110.0)
    assert Window.between(before, after) == Window(
        200_000, 150_000, 200_000, 3.0, 2.0, 1.0, seconds=10.0
    )
    window = Window(200_000, 150_000, 200_000, 3.0, 2.0, 1.0, seconds=10.0)
    assert window.per_message_us(window.process_cpu) == 15.0
    assert Window(0, 0, 0, 1.0, 1.0, 0.0, seconds=10.0).per_message_us(1.0) == 0.0


REPORT = """# Benchmarks

## Details

| a | b |
|---|---|

- a note

<!-- sessions:begin -->
## Sessions
<!-- sessions:end -->
"""


def test_the_section_goes_after_details_then_replaces_itself(tmp_path: Path) -> None:
    path = tmp_path / "benchmarks.md"
    path.write_text(REPORT)
    write_section(path, f"{BEGIN}\n## Profile\nfirst\n{END}\n")
    text = path.read_text()
    assert text.index("- a note") < text.index(BEGIN) < text.index("<!-- sessions:begin -->")
    assert "\n\n<!-- sessions:begin -->" in text
    write_section(path, f"{BEGIN}\n## Profile\nsecond\n{END}\n")
    text = path.read_text()
    assert text.count(BEGIN) == 1 and text.count(END) == 1
    assert "second" in text and "first" not in text
    assert text.endswith("<!-- sessions:end -->\n")


def test_without_details_the_section_is_appended(tmp_path: Path) -> None:
    path = tmp_path / "benchmarks.md"
    path.write_text("# Benchmarks\n\nnothing yet\n")
    write_section(path, f"{BEGIN}\nx\n{END}\n")
    assert path.read_text() == f"# Benchmarks\n\nnothing yet\n\n{BEGIN}\nx\n{END}\n"
