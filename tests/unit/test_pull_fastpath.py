"""The hand parser of `singpy pull` (singpy.cli.fastpull): what it accepts it reads exactly as typer does, and
everything else it leaves to typer."""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Any

import pytest

from singpy.cli import fastpull


def as_called(parsed: tuple[list[str], dict[str, str | bool]]) -> dict[str, Any]:
    """The keyword arguments fastpull.run gives pull_words for this parse."""
    words, values = parsed
    return {"words": words, **{key: bool(values.get(key)) for key in fastpull.BOOLEANS},
            **{key: str(values.get(key, "")) for key in fastpull.TEXTS}}


def typer_call(argv: list[str], env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> dict[str, Any] | int:
    """The pull_words arguments typer's `pull` command passes for ARGV in ENV (or its exit status)."""
    from singpy.cli import pull
    from singpy.cli.app import run_app

    for name in list(os.environ):
        if name.startswith(fastpull.PREFIXES):
            monkeypatch.delenv(name)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    calls: list[dict[str, Any]] = []
    monkeypatch.setattr(pull, "pull_words", lambda words, **kw: calls.append({"words": list(words), **kw}))
    status = run_app(["pull", *argv])
    return calls[0] if calls else status


SAME = [
    (["oras://h.org/a/b:1"], {}),
    (["out.sif", "oras://h.org/a/b:1"], {}),
    (["--force", "--no-https", "out.sif", "docker://h.org/a/b"], {}),
    (["-F", "--nohttps", "--name", "n.sif", "--dir=/d", "library://e/c/x:1"], {}),
    (["out.sif", "--arch", "arm64", "oras://h/x", "--force"], {}),  # interspersed, as click reads them
    (["--arch=amd64", "--arch", "arm64", "oras://h/x"], {}),  # the last one wins
    (["--name=", "oras://h/x"], {"APPTAINER_PULL_NAME": "env.sif"}),  # given empty: the variable is not read
    (["--", "oras://h/x"], {}),
    (["oras://h/x"], {"APPTAINER_NOHTTPS": "1", "SINGULARITY_PULLFOLDER": "/f", "SINGPY_FORCE": " Yes "}),
    (["oras://h/x"], {"APPTAINER_FORCE": "", "SINGULARITY_FORCE": "true", "APPTAINER_AUTH_FILE": "/a.json",
                      "SINGPY_AUTHFILE": "/b.json", "SINGPY_PULL_ARCH": "arm64", "APPTAINER_LIBRARY": "https://l"}),
    (["--docker-login", "oras://h/x"], {"SINGPY_NO_HTTPS": "off", "APPTAINER_DOCKER_LOGIN": "0"}),
    (["--disable-cache", "oras://h/x"], {}),
    (["oras://h/x"], {"APPTAINER_DISABLE_CACHE": "true"}),
    (["a", "b", "c"], {}),  # too many words: the body refuses them, the same way for both
]


@pytest.mark.parametrize(("argv", "env"), SAME)
def test_what_it_accepts_it_reads_as_typer(argv: list[str], env: dict[str, str],
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    parsed = fastpull.parse(argv, env)
    assert parsed is not None
    assert as_called(parsed) == typer_call(argv, env, monkeypatch)


LEFT_TO_TYPER = [
    (["--help"], {}), (["-h"], {}), ([], {}), (["--forse", "oras://h/x"], {}), (["--disable-caches", "oras://h/x"], {}),
    (["--name"], {}), (["--name", "--force", "oras://h/x"], {}), (["--force=1", "oras://h/x"], {}),
    (["-Fq", "oras://h/x"], {}), (["-", "oras://h/x"], {}), (["oras://h/x"], {"APPTAINER_FORCE": "maybe"}),
    (["oras://h/x"], {"SINGULARITY_NOHTTPS": "2"}),
]


@pytest.mark.parametrize(("argv", "env"), LEFT_TO_TYPER)
def test_anything_else_is_left_to_typer(argv: list[str], env: dict[str, str]) -> None:
    assert fastpull.parse(argv, env) is None


def test_it_knows_every_flag_of_the_typer_command() -> None:
    """A flag added to `pull` must be added to the hand parser too (or it would silently fall back), hidden ones
    too (--docker-username...); not Apptainer's deprecated -U, which changes nothing: typer parses it, and says it
    is deprecated."""
    import typer.main

    from singpy.cli.app import app

    command = typer.main.get_command(app).commands["pull"]  # type: ignore[attr-defined]
    shown = [param for param in command.params if param.name != "allow_unsigned"]
    names = {name for param in shown for name in (*param.opts, *param.secondary_opts)
             if name.startswith("-")} - {"--help", "-h"}
    assert names == set(fastpull.FLAGS)
    assert len(shown) == len(command.params) - 1  # -U
    variables = {param.name: sorted(param.envvar or []) for param in shown if param.name != "words"}
    assert variables == {dest: sorted(fastpull.variables(*keys)) for dest, keys in fastpull.ENV_KEYS.items()}


def test_a_pull_imports_no_typer(tmp_path: Any) -> None:
    """The fast path's point: `pull` of a reference that fails at once never imports typer (nor rich)."""
    code = ("import sys; from singpy.cli.main import main; status = main(['pull', '--no-https', 'x.sif', "
            "'oras://127.0.0.1:1/x:1']); print(status, 'typer' in sys.modules, 'rich' in sys.modules)")
    env = {**os.environ, "SINGPY_CACHEDIR": str(tmp_path / "cache"), "SINGPY_PULL_RETRIES": "0"}
    result = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True,
                            timeout=60)
    assert result.stdout.split() == ["255", "False", "False"], result.stderr
    assert result.stderr.count("FATAL:") == 1
    assert not (tmp_path / "x.sif").exists()
