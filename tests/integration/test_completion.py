"""`singpy completion bash|zsh|fish`: what a user gets when pressing Tab (issue 11).

The bash script is sourced into a real bash, which completes command lines as it would on a terminal
(COMP_WORDS/COMP_CWORD, the function `complete` registered). zsh and fish are not installed here: their
scripts are checked for the commands and flags they must offer.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import Singpy, assert_one_fatal

REPO = Path(__file__).resolve().parents[2]

CASES = [
    (["singpy", "ex"], "0 exec"),
    (["singpy", "exec", "--bi"], "0 --bind"),
    (["singpy", "-v", "exec", "--no-h"], "0 --no-home --no-https"),
    (["singpy", "--config", "my.conf", "pul"], "0 pull"),
    (["singpy", "pu"], "0 pull push"),
    (["singpy", "cache", "c"], "0 clean"),
    (["singpy", "cache", "clean", "--d"], "0 --days --dry-run"),
    (["singpy", "pull", "--ar"], "0 --arch --arch-variant"),
    (["singpy", "run", "--runs"], "0 --runscript-timeout"),
    (["singpy", "exec", "--runs"], "0 "),  # a flag of run alone, as Apptainer registers it
    (["singpy", "exec", "--docker-"], "0 --docker-login"),  # not the hidden --docker-username/--docker-password
    (["singpy", "pull", "--docker-"], "0 --docker-login"),
    (["singpy", "exec", "image.sif"], "1 "),  # no flag asked for: bash completes file names (-o default)
]


def complete_in_bash(script: str, words: list[str]) -> str:
    program = script + ('COMP_WORDS=("$@"); COMP_CWORD=$(( ${#COMP_WORDS[@]} - 1 )); COMPREPLY=(); _singpy; '
                        'echo "$? ${COMPREPLY[*]}"; complete -p singpy')
    done = subprocess.run(["bash", "-c", program, "bash", *words], capture_output=True, text=True, timeout=30,
                          check=True)
    reply, registered = done.stdout.splitlines()
    assert registered == "complete -o default -F _singpy singpy"
    return reply


@pytest.mark.parametrize(("words", "expected"), CASES, ids=[" ".join(words) for words, _ in CASES])
def test_bash_completes_commands_flags_and_files(as_user: Singpy, words: list[str], expected: str) -> None:
    script = as_user.ok("completion", "bash")
    assert complete_in_bash(script, words) == expected


def test_zsh_and_fish_scripts_offer_every_command_and_flag(as_user: Singpy) -> None:
    zsh = as_user.ok("completion", "zsh")
    assert zsh.startswith("#compdef singpy\n") and "bashcompinit" in zsh and "_singpy()" in zsh
    fish = as_user.ok("completion", "fish")
    offered = fish.splitlines()[1].split("-a ", 1)[1].strip("'").split()
    assert {"exec", "run", "shell", "pull", "build", "inspect", "cache", "help", "completion"} <= set(offered)
    assert "complete -c singpy -n '__fish_seen_subcommand_from exec' -l bind" in fish
    assert "complete -c singpy -n '__fish_seen_subcommand_from cache && __fish_seen_subcommand_from clean' -l days" \
        in fish


def test_unknown_shell_is_a_usage_error(as_user: Singpy) -> None:
    assert_one_fatal(as_user.run("completion", "tcsh"), "unknown shell: tcsh", code=1)
    assert_one_fatal(as_user.run("completion", "bsh"), "unknown shell: bsh (did you mean bash?)", code=1)


def test_completion_alone_lists_the_shells(singpy: Singpy) -> None:
    """`singpy completion` without a shell (issue 26): the shells it has a script for, not a usage error."""
    assert [line.split()[0] for line in singpy.ok("completion").splitlines()] == ["bash", "zsh", "fish"]


@pytest.mark.skipif(not (REPO / ".venv" / "bin" / "singpy").exists(), reason="needs the clone's .venv (make setup)")
def test_make_install_installs_bash_completion(as_user: Singpy, tmp_path: Path) -> None:
    """Where bash-completion loads it from on first Tab: PREFIX/share/bash-completion/completions/singpy
    (PREFIX/share is in XDG_DATA_DIRS for /usr/local; ~/.local/share is its user directory)."""
    if Path(sys.executable).parent != REPO / ".venv" / "bin":
        pytest.skip("the suite runs outside the clone's .venv: `make install` would use another one")
    done = subprocess.run(["make", "-s", "-C", str(REPO), "install", f"PREFIX={tmp_path}"], capture_output=True,
                          text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    installed = (tmp_path / "share" / "bash-completion" / "completions" / "singpy").read_text()
    assert installed == as_user.ok("completion", "bash")
    assert complete_in_bash(installed, ["singpy", "exec", "--bi"]) == "0 --bind"
