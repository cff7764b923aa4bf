"""Apptainer's flag variables as the env-flag tests read them (tests/unit/test_env_flags.py, and
tests/integration/test_env_flags.py on the real command): the rows of tests/data/apptainer_envkeys.tsv (command,
flag, its variables' keys), a value for each flag that takes one, and the flags whose variable singpy does not read
as the table says (PENDING: strict xfail)."""

from __future__ import annotations

from pathlib import Path

TABLE = Path(__file__).parent.parent / "data" / "apptainer_envkeys.tsv"
# A value for each flag that takes one (what the variable and the flag are both given).
SAMPLES = {"--bind": "/a:/b", "--mount": "type=bind,src=/a,dst=/b", "--no-mount": "home", "--home": "/h",
           "--pwd": "/w", "--cwd": "/w", "--overlay": "o.img", "--hostname": "box", "--network": "none",
           "--network-args": "IP=10.0.0.2", "--dns": "1.1.1.1", "--add-caps": "CAP_NET_RAW",
           "--drop-caps": "CAP_CHOWN", "--shell": "/bin/ash", "--app": "foo", "--env-file": "vars.env",
           "--authfile": "auth.json", "--config": "/x.conf", "--arch": "arm64", "--name": "x.sif",
           "--dir": "/images", "--signal": "KILL", "--runscript-timeout": "1m",
           "--workdir": "/work", "--scratch": "/scratch", "--no-env": "FOO",  # issue 28's
           "--netns-path": "/run/netns/x", "--security": "seccomp:p.json", "--fusemount": "host:prog /m",
           "--apply-cgroups": "limits.toml", "--cpus": "1.5", "--cpu-shares": "512", "--cpuset-cpus": "0-1",  # cgroups
           "--cpuset-mems": "0", "--memory": "1G", "--memory-reservation": "512M", "--memory-swap": "2G",
           "--pids-limit": "10", "--blkio-weight": "100", "--blkio-weight-device": "/dev/sda:100", "--user": "alice",
           "--section": "post", "--library": "https://library.example.org", "--arch-variant": "v7",
           "--mksquashfs-args": "-comp xz", "--containlibs": "/lib/libz.so.1"}
# Flags singpy has whose variables live in a file this change could not edit (reported to the lead).
PENDING: set[tuple[str, str]] = set()  # flags whose variable is not read yet (strict xfail): none
# Apptainer's --cpus reads APPTAINER_CPU_SHARES, --cpu-shares' variable (a slip: a share count is no CPU count);
# singpy's --cpus reads APPTAINER_CPUS instead (strict xfail: this table would have it copy the slip).
PENDING |= {(command, "--cpus") for command in ("exec", "run", "shell", "instance start")}
# build's --mount is not parsed from APPTAINER_MOUNT: the variable reaches the launcher of %post and %test as it is,
# which reads it there (reading it in build too would give each mount twice); tests/integration/test_build_flags.py.
PENDING |= {("build", "--mount")}
# Flags whose variables no parser reads: singpy.oci.auth and singpy.oci.store read them where they act, and name
# the one that was set (singpy.cli.flagvars). Their cases: tests/integration/test_registry_flags.py (Apptainer's
# spellings of DOCKER_PASSWORD beside the flag), test_cache_trust.py and test_build_recipe_errors.py (each TMPDIR
# variable named in its refusal), test_oras.py and test_pull.py (SINGPY_DOCKER_USERNAME/_PASSWORD).
READ_WHERE_THEY_ACT = {"--docker-username", "--docker-password", "--tmpdir"}


def table_rows() -> list[tuple[str, str, list[str]]]:
    rows = []
    for line in TABLE.read_text().splitlines():
        if line and not line.startswith("#"):
            command, flag, _short, keys, _source = line.split("\t")
            rows.append((command, flag, keys.split(",")))
    return rows
