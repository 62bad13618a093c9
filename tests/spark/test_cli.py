"""`headwater analytics`: flags checked before Spark starts, and the session's package settings."""

from __future__ import annotations

from pathlib import Path

import pyspark
import pytest

from headwater.cli import main as headwater_main
from spark_streaming.options import Trigger
from spark_streaming.source import packages, session_conf

pytestmark = pytest.mark.spark


@pytest.mark.parametrize(
    ("argv", "complaint"),
    [
        (["traffic", "--sink", "parquet"], "--sink parquet needs --output"),
        (["traffic", "--sink", "mqtt"], "--sink mqtt needs --checkpoint"),
        (["top_publishers", "--output-mode", "update"], "job top_publishers writes final rows"),
        (["traffic", "--window", "1 fortnight"], "--window: not a duration"),
        (["device_silence", "--silence", "90 seconds"], "not a multiple of --window"),
    ],
)
def test_bad_flags_exit_2_naming_the_flag(
    argv: list[str], complaint: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert headwater_main(["analytics", *argv, "--bootstrap", "127.0.0.1:9"]) == 2
    assert complaint in capsys.readouterr().err


def test_bootstrap_comes_from_the_environment_or_a_flag(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    monkeypatch.delenv("HEADWATER_KAFKA_BOOTSTRAP", raising=False)
    monkeypatch.chdir(tmp_path)  # no dev cluster's .headwater here to find a Kafka in
    assert headwater_main(["analytics", "traffic"]) == 2
    err = capsys.readouterr().err
    assert "pass --bootstrap, set HEADWATER_KAFKA_BOOTSTRAP, or start a dev cluster" in err


def test_trigger_flag() -> None:
    assert Trigger.parse("available-now") == Trigger(available_now=True)
    assert Trigger.parse("processing-time=30 seconds") == Trigger(interval="30 seconds")
    with pytest.raises(SystemExit):
        headwater_main(["analytics", "traffic", "--trigger", "sometimes"])


def test_connectors_match_pyspark_and_ivy_lives_in_the_headwater_cache(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("HEADWATER_CACHE", str(tmp_path))
    conf = session_conf("local[2]")
    assert conf["spark.jars.packages"] == ",".join(packages())
    assert all(p.endswith(":" + pyspark.__version__) for p in packages())
    assert conf["spark.jars.ivy"] == str(tmp_path / "ivy")
    settings = Path(conf["spark.jars.ivySettings"]).read_text()
    assert "repo1.maven.org" in settings and ".m2" not in settings
