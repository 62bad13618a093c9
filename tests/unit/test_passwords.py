"""Password files: Mosquitto's own files accepted as they are, bad ones refused by line, and
`headwater passwd` writing files that keep every other line.

Files are made by Debian's ``/usr/bin/mosquitto_passwd`` (package ``mosquitto``, installed by
``make install``), run as a subprocess, so a change in Mosquitto's format shows up here.
"""

from __future__ import annotations

import base64
import hashlib
import logging
import shutil
import stat
import subprocess
from pathlib import Path

import pytest

from frontend.auth import Auth, AuthFileError, hash_password
from frontend.auth import passwords as passwords_module
from headwater import cli

MOSQUITTO_PASSWD = "mosquitto_passwd"
ACCEPTED, BAD_CREDENTIALS, NOT_AUTHORIZED = 0, 4, 5


def mosquitto_passwd(*args: str) -> None:
    program = shutil.which(MOSQUITTO_PASSWD) or f"/usr/bin/{MOSQUITTO_PASSWD}"
    assert Path(program).exists(), "mosquitto_passwd missing: `make install` (Debian: mosquitto)"
    subprocess.run([program, *args], check=True, capture_output=True, timeout=30)


def headwater_passwd(*args: str) -> int:
    return cli.main(["passwd", *args])


# -- files made by mosquitto_passwd ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("options", "prefix"),
    [([], "$7$101$"), (["-H", "sha512-pbkdf2"], "$7$101$"), (["-H", "sha512"], "$6$")],
    ids=["default", "sha512-pbkdf2", "sha512"],
)
def test_mosquitto_passwd_files_are_accepted(
    tmp_path: Path, options: list[str], prefix: str
) -> None:
    path = tmp_path / "passwords"
    mosquitto_passwd(*options, "-c", "-b", str(path), "alice", "correct horse")
    mosquitto_passwd(*options, "-b", str(path), "bob", "pässwörd")
    assert path.read_text().splitlines()[0].startswith(f"alice:{prefix}")
    auth = Auth(password_file=str(path))
    assert auth.check("alice", b"correct horse") == ACCEPTED
    assert auth.check("bob", "pässwörd".encode()) == ACCEPTED
    assert auth.check("alice", b"correct horse ") == BAD_CREDENTIALS
    assert auth.check("alice", "pässwörd".encode()) == BAD_CREDENTIALS
    assert auth.check("alice", None) == BAD_CREDENTIALS
    assert auth.check("mallory", b"correct horse") == BAD_CREDENTIALS
    assert auth.check(None, None) == NOT_AUTHORIZED
    assert auth.check(None, b"correct horse") == NOT_AUTHORIZED
    assert auth.denied_connects == 6


def test_hash_password_writes_exactly_what_mosquitto_passwd_writes(tmp_path: Path) -> None:
    path = tmp_path / "passwords"
    mosquitto_passwd("-c", "-b", str(path), "alice", "s3cret")
    mosquitto_passwd("-H", "sha512", "-b", str(path), "bob", "s3cret")
    for line, method in zip(
        path.read_text().splitlines(), ["sha512-pbkdf2", "sha512"], strict=True
    ):
        stored = line.partition(":")[2]
        salt = base64.b64decode(stored.split("$")[-2])
        assert len(salt) == 12
        assert hash_password("s3cret", method, 101, salt) == stored  # type: ignore[arg-type]


def test_without_password_file_everyone_is_accepted() -> None:
    auth = Auth()
    assert auth.check(None, None) == ACCEPTED
    assert auth.check("anyone", b"anything") == ACCEPTED


def test_unknown_user_costs_a_hash_too(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    path = tmp_path / "passwords"
    path.write_text(f"alice:{hash_password('pw')}\n")
    auth = Auth(password_file=str(path))
    hashed: list[bytes] = []
    real = passwords_module.PasswordHash.compute

    def counting(self: passwords_module.PasswordHash, password: bytes) -> bytes:
        hashed.append(password)
        return real(self, password)

    monkeypatch.setattr(passwords_module.PasswordHash, "compute", counting)
    assert auth.check("nobody", b"guess") == BAD_CREDENTIALS
    assert auth.check("alice", b"guess") == BAD_CREDENTIALS
    assert hashed == [b"guess", b"guess"]


@pytest.mark.parametrize(
    ("entries", "dearest"),
    [
        ([("sha512", 101)], ("sha512", 101)),
        ([("sha512", 101), ("sha512-pbkdf2", 7)], ("sha512-pbkdf2", 7)),
        (
            [("sha512-pbkdf2", 2000), ("sha512", 101), ("sha512-pbkdf2", 50)],
            ("sha512-pbkdf2", 2000),
        ),
    ],
    ids=["$6$ only", "$7$ beats $6$", "most iterations"],
)
def test_an_unknown_user_is_hashed_like_the_dearest_entry(
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    entries: list[tuple[passwords_module.Method, int]],
    dearest: tuple[str, int],
) -> None:
    """An unknown name costs what the file's costliest entry costs: timing cannot tell that it
    is unknown (a cheap default dummy would answer sooner than a dear user's check)."""
    path = tmp_path / "passwords"
    lines = [f"u{i}:{hash_password('pw', m, n)}" for i, (m, n) in enumerate(entries)]
    path.write_text("\n".join(lines) + "\n")
    auth = Auth(password_file=str(path))
    hashed: list[tuple[str, int]] = []
    real = passwords_module.PasswordHash.compute

    def recording(self: passwords_module.PasswordHash, password: bytes) -> bytes:
        hashed.append((self.method, self.iterations))
        return real(self, password)

    monkeypatch.setattr(passwords_module.PasswordHash, "compute", recording)
    assert auth.check("mallory", b"pw") == BAD_CREDENTIALS
    assert hashed == [dearest]


def test_blank_lines_and_comments_are_allowed(tmp_path: Path) -> None:
    path = tmp_path / "passwords"
    path.write_text(f"# users\n\n  # indented comment\nalice:{hash_password('pw')}\n\n")
    assert Auth(password_file=str(path)).check("alice", b"pw") == ACCEPTED


# -- files refused at load ------------------------------------------------------------------------

GOOD = hash_password("pw")
SALT_B64 = base64.b64encode(bytes(12)).decode()
HASH_B64 = base64.b64encode(bytes(64)).decode()


@pytest.mark.parametrize(
    ("bad_line", "says"),
    [
        (f"carol:{hashlib.sha256(b'pw').hexdigest()}", "headwater passwd"),  # the old format
        ("carol:plain-text-password", "mosquitto_passwd -U"),
        ("carol", "expected user:hash"),
        (":" + GOOD, "expected user:hash"),
        (f"carol:$5${SALT_B64}${HASH_B64}", "not a Mosquitto password hash"),
        (f"carol:$7$0${SALT_B64}${HASH_B64}", "iterations"),
        (f"carol:$7$many${SALT_B64}${HASH_B64}", "iterations"),
        (f"carol:$7$100001${SALT_B64}${HASH_B64}", "more than the 100000 allowed"),
        (f"carol:$7${SALT_B64}${HASH_B64}", "$7$<iterations>$<salt>$<hash>"),
        (f"carol:$6$101${SALT_B64}${HASH_B64}", "$6$<salt>$<hash>"),
        (f"carol:$6${base64.b64encode(bytes(16)).decode()}${HASH_B64}", "salt must decode to 12"),
        (f"carol:$6${SALT_B64}${base64.b64encode(bytes(32)).decode()}", "hash must decode to 64"),
        (f"carol:$6${SALT_B64}$not*base64", "hash is not valid base64"),
        (f"alice:{GOOD}", "already defined on line 2"),
    ],
)
def test_bad_lines_refuse_the_file_naming_the_line(
    tmp_path: Path, bad_line: str, says: str
) -> None:
    path = tmp_path / "passwords"
    path.write_text(f"# users\nalice:{GOOD}\n\n{bad_line}\nbob:{GOOD}\n")
    with pytest.raises(AuthFileError) as caught:
        Auth(password_file=str(path))
    assert str(caught.value).startswith(f"{path}:4: ")
    assert says in str(caught.value)


def test_unreadable_file_is_named(tmp_path: Path) -> None:
    missing = tmp_path / "nope"
    with pytest.raises(AuthFileError, match=f"^{missing}: cannot read"):
        Auth(password_file=str(missing))


def test_reload_keeps_old_passwords_when_the_new_file_is_bad(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "passwords"
    path.write_text(f"alice:{hash_password('old')}\n")
    auth = Auth(password_file=str(path))
    path.write_text(f"alice:{hash_password('new')}\nbob:{hashlib.sha256(b'x').hexdigest()}\n")
    with caplog.at_level(logging.INFO, logger="headwater.auth"):
        problems = auth.reload()
    assert len(problems) == 1 and problems[0].startswith(f"{path}:2: ")
    assert [r.levelno for r in caplog.records] == [logging.ERROR]
    assert auth.check("alice", b"old") == ACCEPTED
    path.write_text(f"alice:{hash_password('new')}\n")
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="headwater.auth"):
        assert auth.reload() == []
    assert [r.levelno for r in caplog.records] == [logging.INFO]
    assert auth.check("alice", b"new") == ACCEPTED
    assert auth.check("alice", b"old") == BAD_CREDENTIALS


# -- headwater passwd ---------------------------------------------------------------------------


def test_batch_create_makes_a_private_file_mosquitto_format(tmp_path: Path) -> None:
    path = tmp_path / "passwords"
    assert headwater_passwd("-c", "-b", str(path), "alice", "pw1") == 0
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert path.read_text().startswith("alice:$7$101$")
    assert headwater_passwd("-H", "sha512", "-b", str(path), "bob", "pw2") == 0
    assert path.read_text().splitlines()[1].startswith("bob:$6$")
    auth = Auth(password_file=str(path))
    assert (auth.check("alice", b"pw1"), auth.check("bob", b"pw2")) == (ACCEPTED, ACCEPTED)
    assert headwater_passwd("-I", "7", "-b", str(path), "dave", "pw4") == 0
    assert path.read_text().splitlines()[2].startswith("dave:$7$7$")
    assert Auth(password_file=str(path)).check("dave", b"pw4") == ACCEPTED
    assert headwater_passwd("-c", "-b", str(path), "carol", "pw3") == 0  # -c overwrites
    assert [line.partition(":")[0] for line in path.read_text().splitlines()] == ["carol"]


def test_passwd_refuses_iterations_beyond_the_ceiling(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    with pytest.raises(SystemExit):
        headwater_passwd("-I", "100001", "-c", "-b", str(tmp_path / "passwords"), "alice", "pw")
    assert "1..100000" in capsys.readouterr().err
    assert not (tmp_path / "passwords").exists()


def test_update_and_delete_keep_other_lines_in_order(tmp_path: Path) -> None:
    path = tmp_path / "passwords"
    mosquitto_passwd("-c", "-b", str(path), "alice", "a1")
    mosquitto_passwd("-b", str(path), "bob", "b1")
    bob = path.read_text().splitlines()[1]
    path.write_text(f"# the team\n{path.read_text()}# end\n")
    path.chmod(0o640)
    assert headwater_passwd("-b", str(path), "alice", "a2") == 0
    assert headwater_passwd("-b", str(path), "carol", "c1") == 0
    lines = path.read_text().splitlines()
    assert [line.partition(":")[0] for line in lines] == [
        "# the team",
        "alice",
        "bob",
        "# end",
        "carol",
    ]
    assert lines[2] == bob
    assert stat.S_IMODE(path.stat().st_mode) == 0o640
    auth = Auth(password_file=str(path))
    assert [auth.check("alice", b"a2"), auth.check("alice", b"a1")] == [ACCEPTED, BAD_CREDENTIALS]
    assert headwater_passwd("-D", str(path), "bob") == 0
    assert [line.partition(":")[0] for line in path.read_text().splitlines()] == [
        "# the team",
        "alice",
        "# end",
        "carol",
    ]
    assert Auth(password_file=str(path)).check("bob", b"b1") == BAD_CREDENTIALS


def test_prompted_password_is_asked_twice(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    path = tmp_path / "passwords"
    prompts: list[str] = []

    def answer(prompt: str = "") -> str:
        prompts.append(prompt)
        return "typed"

    monkeypatch.setattr("getpass.getpass", answer)
    assert headwater_passwd("-c", str(path), "alice") == 0
    assert prompts == ["Password: ", "Reenter password: "]
    assert Auth(password_file=str(path)).check("alice", b"typed") == ACCEPTED


@pytest.mark.parametrize(
    ("answers", "says"),
    [(["one", "two"], "passwords do not match"), ([""], "empty password")],
)
def test_prompting_refuses_mismatch_and_empty(
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    answers: list[str],
    says: str,
) -> None:
    path = tmp_path / "passwords"
    path.write_text(f"alice:{GOOD}\n")
    replies = iter(answers)
    monkeypatch.setattr("getpass.getpass", lambda prompt="": next(replies))
    assert headwater_passwd(str(path), "alice") == 1
    assert says in capsys.readouterr().err
    assert path.read_text() == f"alice:{GOOD}\n"


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["-b", "{dir}/missing", "alice", "pw"], "does not exist: use -c"),
        (["-b", "{dir}/passwords", "al:ice", "pw"], "must not contain ':'"),
        (["-D", "{dir}/passwords", "nobody"], "'nobody' is not in"),
    ],
)
def test_errors_exit_1_with_a_message(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, args: list[str], says: str
) -> None:
    (tmp_path / "passwords").write_text(f"alice:{GOOD}\n")
    assert headwater_passwd(*[arg.format(dir=tmp_path) for arg in args]) == 1
    err = capsys.readouterr().err
    assert err.startswith("headwater: error: ") and says in err
    assert not (tmp_path / "missing").exists()
    assert (tmp_path / "passwords").read_text() == f"alice:{GOOD}\n"


def test_convert_plain_text_file(tmp_path: Path) -> None:
    path = tmp_path / "passwords"
    path.write_text(f"# old file\nalice:plain1\nbob:{GOOD}\n")
    assert headwater_passwd("-U", str(path)) == 0
    lines = path.read_text().splitlines()
    assert lines[0] == "# old file" and lines[1].startswith("alice:$7$101$")
    assert lines[2] == f"bob:{GOOD}"  # already hashed: kept, not hashed twice
    auth = Auth(password_file=str(path))
    assert (auth.check("alice", b"plain1"), auth.check("bob", b"pw")) == (ACCEPTED, ACCEPTED)
