"""The compose stack (docker/docker-compose.yml) on this machine: what `make compose-up` and
`make compose-down` run, and what tests/e2e/test_compose_stack.py starts the stack with.

`up()` does whatever is missing, in order, each step a no-op when already done:
* a Docker engine: one that answers is used; else, as root, Debian's `dockerd` is started by hand
  (no systemd here), its log in `.headwater/compose/dockerd.log`;
* the Debian base of every image (`HEADWATER_BASE_IMAGE`): Debian's official image if present or
  pullable, else `headwater-base:bookworm`, made by `debootstrap --variant=minbase` from the
  mirror apt already uses and `docker import`ed;
* `docker/.env`: random Redis and Grafana passwords and the chosen base, written once and kept;
* `docker/local-ca/`: this machine's own CAs (/usr/local/share/ca-certificates), trusted by the
  builds, so that a network whose proxy re-signs TLS works from inside them too;
* the images (`docker compose build`, cached) and the stack, detached.
It returns once every front-end's health check (`GET /ready`) passes and HAProxy answers an MQTT
CONNECT on the published port, then prints the endpoints and where the dev CA's certificate was
copied. `down()` removes the stack's containers and networks, its volumes only when asked.

Every command goes through `Stack.compose`, so the project name, compose file and env file are
those of one stack: the test's stack is another project (other ports, subnet and volumes) and
never touches a user's.
"""

from __future__ import annotations

import argparse
import os
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from headwater.errors import HeadwaterError, MissingProgramError, ServiceError
from headwater.services.readiness import wait_until

ROOT = Path(__file__).resolve().parents[1]
DOCKER_DIR = ROOT / "docker"
COMPOSE_FILE = DOCKER_DIR / "docker-compose.yml"
ENV_FILE = DOCKER_DIR / ".env"
STATE_DIR = ROOT / ".headwater" / "compose"
LOCAL_CA_DIR = DOCKER_DIR / "local-ca"
HOST_CA_DIR = Path("/usr/local/share/ca-certificates")
OFFICIAL_BASE = "debian:bookworm-slim"
LOCAL_BASE = "headwater-base:bookworm"
SUITE = "bookworm"
FRONTENDS = ("frontend1", "frontend2", "frontend3")
DEFAULT_PORTS = {
    "HEADWATER_MQTT_PORT": 1883,
    "HEADWATER_MQTTS_PORT": 8883,
    "HEADWATER_WS_PORT": 8080,
    "HEADWATER_PROMETHEUS_PORT": 9090,
}
MQTT_CONNECT = bytes.fromhex("100e00044d5154540402003c0002") + b"hw"
"""CONNECT, MQTT 3.1.1, clean session, keep-alive 60, client id "hw": the readiness probe."""


class DockerError(ServiceError):
    """A docker command failed; the message carries its output."""


def docker(
    *args: str, timeout: float = 600, check: bool = True
) -> subprocess.CompletedProcess[str]:
    """Run `docker ARGS`; a failure raises DockerError with the command's output."""
    if shutil.which("docker") is None:
        raise MissingProgramError("docker is required: make compose-up installs Debian's docker.io")
    result = subprocess.run(
        ["docker", *args], capture_output=True, text=True, timeout=timeout, check=False
    )
    if check and result.returncode != 0:
        output = (result.stdout + result.stderr).strip()
        raise DockerError(f"docker {' '.join(args)} failed:\n{output}")
    return result


# -- the engine and the base image ----------------------------------------------------------------


def engine_answers() -> bool:
    return (
        shutil.which("docker") is not None
        and docker("info", timeout=30, check=False).returncode == 0
    )


def ensure_engine(log: Path = STATE_DIR / "dockerd.log") -> None:
    """Use the engine that answers, else start `dockerd` (as root) and wait for it."""
    if engine_answers():
        return
    dockerd = shutil.which("dockerd") or shutil.which("dockerd", path="/usr/sbin:/usr/bin")
    if dockerd is None or os.geteuid() != 0:
        raise MissingProgramError(
            "no Docker engine answers: start one (or run `make compose-up` as root, which "
            "installs Debian's docker.io and starts dockerd)"
        )
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("ab") as output:
        subprocess.Popen(  # detached: the engine outlives this command, as a service would
            [dockerd], stdout=output, stderr=output, stdin=subprocess.DEVNULL,
            start_new_session=True,
        )  # fmt: skip
    wait_until(engine_answers, what=f"dockerd (log: {log})", timeout=60, interval=0.5)


def has_image(name: str) -> bool:
    return docker("image", "inspect", name, timeout=30, check=False).returncode == 0


def apt_mirror(sources: Path = Path("/etc/apt")) -> str:
    """The Debian mirror apt uses: the first `URIs:` (deb822) or `deb` line naming one."""
    files = [sources / "sources.list", *sorted((sources / "sources.list.d").glob("*"))]
    for path in files:
        if not path.is_file() or path.suffix not in {".list", ".sources", ""}:
            continue
        for line in path.read_text().splitlines():
            words = line.split()
            if line.startswith("URIs:") and len(words) > 1 and "security" not in words[1]:
                return words[1]
            if words[:1] == ["deb"] and "security" not in line:
                return next(word for word in words[1:] if "://" in word)
    return "http://deb.debian.org/debian"


def build_local_base(name: str = LOCAL_BASE) -> None:
    """Debian bookworm, minbase, from the local mirror, imported as image `name` (~1 minute)."""
    if shutil.which("debootstrap", path="/usr/sbin:/usr/bin:/sbin") is None:
        if os.geteuid() != 0:
            raise MissingProgramError("debootstrap is required: apt-get install debootstrap")
        apt = ["apt-get", "install", "-y", "-q", "debootstrap"]
        subprocess.run(apt, check=True, env={**os.environ, "DEBIAN_FRONTEND": "noninteractive"})
    with tempfile.TemporaryDirectory(prefix="headwater-rootfs-", dir="/var/tmp") as rootfs:
        argv = ["debootstrap", "--variant=minbase", SUITE, rootfs, apt_mirror()]
        result = subprocess.run(argv, capture_output=True, text=True, check=False)
        if result.returncode != 0:
            raise ServiceError(f"{' '.join(argv)} failed:\n{result.stdout[-2000:]}{result.stderr}")
        tar = subprocess.Popen(["tar", "-C", rootfs, "-c", "."], stdout=subprocess.PIPE)
        imported = subprocess.run(
            ["docker", "import", "-c", "ENV LANG=C.UTF-8", "-c", 'CMD ["bash"]', "-", name],
            stdin=tar.stdout, capture_output=True, text=True, check=False,
        )  # fmt: skip
        tar.wait()
        if imported.returncode != 0 or tar.returncode != 0:
            raise ServiceError(f"docker import of {rootfs} failed: {imported.stderr.strip()}")


def choose_base_image() -> str:
    """Debian's official image where it is here or a registry gives it, else the local one."""
    if has_image(OFFICIAL_BASE):
        return OFFICIAL_BASE
    if docker("pull", OFFICIAL_BASE, timeout=120, check=False).returncode == 0:
        return OFFICIAL_BASE
    if not has_image(LOCAL_BASE):
        print(f"headwater: no registry answers: building {LOCAL_BASE} with debootstrap")
        build_local_base(LOCAL_BASE)
    return LOCAL_BASE


# -- the env file ---------------------------------------------------------------------------------


def read_env(path: Path) -> dict[str, str]:
    values = {}
    for line in path.read_text().splitlines() if path.is_file() else []:
        name, sep, value = line.partition("=")
        if sep and not line.lstrip().startswith("#"):
            values[name.strip()] = value.strip()
    return values


def ensure_env_file(path: Path, base_image: str, extra: Mapping[str, object] = {}) -> None:
    """Give `path` random passwords where it has none (a password set is kept), and set
    `base_image` and `extra` (replacing what it said)."""
    values = read_env(path)
    passwords = {
        "REDIS_PASSWORD": secrets.token_hex(16),
        "GRAFANA_ADMIN_PASSWORD": secrets.token_hex(12),
    }
    missing: dict[str, object] = {
        name: value for name, value in passwords.items() if not values.get(name)
    }
    forced = {"HEADWATER_BASE_IMAGE": base_image, **extra}
    missing |= {name: value for name, value in forced.items() if values.get(name) != str(value)}
    if missing:
        path.parent.mkdir(parents=True, exist_ok=True)
        kept = [line for line in (path.read_text().splitlines() if path.is_file() else [])]
        kept = [line for line in kept if line.partition("=")[0].strip() not in missing]
        added = [f"{name}={value}" for name, value in missing.items()]
        path.write_text("\n".join([*kept, *added]) + "\n")
        path.chmod(0o600)


# -- the stack ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Stack:
    """One compose project: its name, compose file and env file."""

    project: str = "headwater"
    env_file: Path = ENV_FILE
    compose_file: Path = COMPOSE_FILE
    profiles: Sequence[str] = field(default_factory=tuple)

    def compose(self, *args: str, timeout: float = 1800, check: bool = True) -> str:
        base = ["compose", "-p", self.project, "-f", str(self.compose_file)]
        base += ["--env-file", str(self.env_file)]
        base += [word for profile in self.profiles for word in ("--profile", profile)]
        return docker(*base, *args, timeout=timeout, check=check).stdout

    def env(self) -> dict[str, str]:
        return read_env(self.env_file)

    def port(self, name: str) -> int:
        return int(self.env().get(name, DEFAULT_PORTS[name]))

    def container(self, service: str) -> str:
        return self.compose("ps", "-a", "-q", service).strip()

    def health(self, service: str) -> str:
        container = self.container(service)
        if not container:
            return "missing"
        state = docker("inspect", "-f", "{{.State.Status}} {{if .State.Health}}"
                       "{{.State.Health.Status}}{{end}}", container).stdout.split()  # fmt: skip
        if state and state[0] in {"exited", "dead"}:
            raise ServiceError(
                f"{service} has stopped:\n{self.compose('logs', '--tail', '30', service)}"
            )
        return state[-1] if state else "missing"

    def healthy(self, services: Sequence[str] = FRONTENDS) -> bool:
        return all(self.health(service) == "healthy" for service in services)

    def wait_ready(self, timeout: float = 600) -> None:
        """Every front-end passes `GET /ready` and HAProxy answers a CONNECT with CONNACK 0."""
        wait_until(self.healthy, what="the front-ends' /ready", timeout=timeout, interval=1)
        port = self.port("HEADWATER_MQTT_PORT")
        wait_until(lambda: connack(port), what=f"MQTT on 127.0.0.1:{port}", timeout=60)

    def copy_ca(self, target: Path) -> Path:
        """The dev CA's certificate, out of the `certs` volume (never its key)."""
        target.parent.mkdir(parents=True, exist_ok=True)
        docker("cp", f"{self.container('certs-init')}:/certs/ca.crt", str(target))
        return target

    def up(self, build: bool = True, timeout: float = 900) -> None:
        if build:
            self.compose("build", timeout=3600)
        self.compose("up", "-d", "--remove-orphans", timeout=timeout)
        self.wait_ready(timeout)

    def down(self, volumes: bool = False) -> None:
        self.compose("down", "--remove-orphans", *(["--volumes"] if volumes else []))


def connack(port: int, host: str = "127.0.0.1") -> bool:
    """True if an MQTT CONNECT to host:port gets CONNACK with return code 0."""
    try:
        with socket.create_connection((host, port), timeout=3) as sock:
            sock.sendall(MQTT_CONNECT)
            reply = sock.recv(4)
            sock.sendall(b"\xe0\x00")  # DISCONNECT
    except OSError:
        return False
    return reply == b"\x20\x02\x00\x00"


def stage_local_cas(source: Path = HOST_CA_DIR, target: Path = LOCAL_CA_DIR) -> None:
    """Copy this machine's own CA certificates into the build context (docker/local-ca/)."""
    for cert in sorted(source.glob("**/*.crt")) if source.is_dir() else []:
        copy = target / cert.name
        if not copy.is_file() or copy.read_bytes() != cert.read_bytes():
            shutil.copyfile(cert, copy)


def prepare(stack: Stack, extra_env: Mapping[str, object] = {}) -> None:
    """The engine, the base image, the env file and the local CAs: all `up` needs but images."""
    ensure_engine()
    stage_local_cas()
    base = stack.env().get("HEADWATER_BASE_IMAGE", "")
    if not (base and has_image(base)):
        base = choose_base_image()
    ensure_env_file(stack.env_file, base, extra_env)


def endpoints(stack: Stack, ca: Path) -> str:
    mqtt, mqtts = stack.port("HEADWATER_MQTT_PORT"), stack.port("HEADWATER_MQTTS_PORT")
    ws, prometheus = stack.port("HEADWATER_WS_PORT"), stack.port("HEADWATER_PROMETHEUS_PORT")
    return "\n".join([
        f"headwater: the stack '{stack.project}' is up ({stack.compose_file})",
        f"  MQTT            127.0.0.1:{mqtt}",
        f"  MQTT over TLS   127.0.0.1:{mqtts}   (CA: {ca})",
        f"  MQTT over WS    ws://127.0.0.1:{ws}/mqtt",
        f"  Prometheus      http://127.0.0.1:{prometheus}",
        f"  e.g. mosquitto_sub -h 127.0.0.1 -p {mqtts} --cafile {ca} -t '#' -v",
        "  stop: make compose-down (VOLUMES=1: also the data)",
    ])  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m headwater.compose")
    parser.add_argument("command", choices=("up", "down"))
    parser.add_argument("--volumes", action="store_true", help="down: remove the volumes too")
    args = parser.parse_args(argv)
    stack = Stack()
    started = time.monotonic()
    try:
        if args.command == "down":
            if engine_answers():
                stack.down(args.volumes)
            return 0
        prepare(stack)
        stack.up()
        ca = stack.copy_ca(STATE_DIR / "ca.crt")
    except (HeadwaterError, subprocess.SubprocessError) as exc:
        print(f"headwater: error: {exc}", file=sys.stderr)
        return 1
    print(endpoints(stack, ca))
    print(f"  ({time.monotonic() - started:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
