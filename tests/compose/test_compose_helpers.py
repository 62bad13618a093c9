"""headwater.compose's pure parts: the mirror debootstrap uses is apt's, and docker/.env keeps
its passwords across runs while the base image follows what this machine has."""

from __future__ import annotations

from pathlib import Path

from headwater import compose


def test_the_mirror_is_the_one_apt_uses(tmp_path: Path) -> None:
    (tmp_path / "sources.list.d").mkdir()
    (tmp_path / "sources.list.d" / "debian.sources").write_text(
        "Types: deb\nURIs: http://mirror.example/debian\nSuites: bookworm\n\n"
        "Types: deb\nURIs: http://mirror.example/debian-security\nSuites: bookworm-security\n"
    )
    assert compose.apt_mirror(tmp_path) == "http://mirror.example/debian"
    (tmp_path / "sources.list").write_text(
        "deb [arch=amd64] http://old.example/debian bookworm main\n"
    )
    assert compose.apt_mirror(tmp_path) == "http://old.example/debian"


def test_the_env_file_keeps_passwords_and_follows_the_base(tmp_path: Path) -> None:
    env = tmp_path / ".env"
    compose.ensure_env_file(env, compose.OFFICIAL_BASE)
    first = compose.read_env(env)
    assert len(first["REDIS_PASSWORD"]) == 32 and first["GRAFANA_ADMIN_PASSWORD"]
    assert env.stat().st_mode & 0o077 == 0
    compose.ensure_env_file(env, compose.LOCAL_BASE, {"HEADWATER_MQTT_PORT": 11883})
    second = compose.read_env(env)
    assert second["REDIS_PASSWORD"] == first["REDIS_PASSWORD"]
    assert second["HEADWATER_BASE_IMAGE"] == compose.LOCAL_BASE
    assert compose.Stack(env_file=env).port("HEADWATER_MQTT_PORT") == 11883
