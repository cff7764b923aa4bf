"""oras:// benchmark (issue 29): `singpy pull oras://` against curl of the same blob, and `exec oras://` cached
against `exec X.sif`.

    make bench                                     # startup.py, pull.py, ..., then this
    .venv/bin/python benchmarks/pull_oras.py       # a ~200 MB SIF, 5 pull rounds, 30 exec rounds
    .venv/bin/python benchmarks/pull_oras.py --quick --no-write

Two measures, each run side by side, rounds interleaved, `sync` before each pull (the pull rounds alternate
their order; the exec rows are shuffled each round after two warm-ups, as pull.py's: pull_exec.measure_exec):

1. `singpy -q pull --no-https OUT.sif oras://HOST/big:v1` with an empty cache (a download into the cache, the
   digest check, the copy to OUT.sif) against `curl -sf -o OUT http://HOST/v2/big/blobs/DIGEST`, the same blob
   from the same registry (docker-registry on 127.0.0.1, plain HTTP), which checks nothing. Target: <= 1.1x.
2. `singpy exec oras://HOST/small:v1 true` with the SIF cached (one HEAD request: has the tag moved?) against
   `singpy exec SMALL.sif true`, the same SIF as a file. Target: <= 1.2x. The same by digest (no request),
   and `singpy exec docker://HOST/dsmall:latest true` of a cached busybox image (issue 31, the same target)
   against the same converted image pulled to a file (`exec D.sif`: its Docker environment scripts make it
   slower to run than SMALL.sif), over plain HTTP and over TLS (a second registry, its CA in SSL_CERT_FILE).
   The rows that send a request and their references are timed again, after the others, with both registries
   kept on one core and the commands on the other (pull_exec.registry_apart), as a registry on another machine
   never takes the launcher's core: shown beside the others, without a target.

The big SIF is a runnable busybox SIF (siftool, as tests.support.sifs makes it) plus a ~200 MB generic object
of random bytes; it is pushed with `singpy push`. As root the commands run as the test user `singpy-test`, in
directories it owns (as pull.py does). Prints the section; unless --no-write, writes it into
docs/performance.md (between its markers) and benchmarks/results/DATE-COMMIT-oras.json (pull_results).
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import startup
from pull import tool_versions
from pull_commands import PATH, Dirs, Series, base_env, make_dirs, remove, run, scratch
from pull_exec import APART, ExecRow, apart_rows, measure_apart, measure_exec
from pull_results import RunInfo, conditions, save_results, targets_table, write_section
from startup_records import Target
from startup_runner import Runner

from tests.support.oci import busybox_image
from tests.support.registry import RegistryServer, start_registry
from tests.support.sifs import siftool_sif

MB = 1 << 20
TARGETS = {"pull": 1.1, "exec": 1.2}
MARKERS = ("<!-- benchmarks/pull_oras.py: begin -->", "<!-- benchmarks/pull_oras.py: end -->")


def big_sif(workdir: Path, size: int) -> Path:
    """A runnable busybox SIF with `size` random bytes more (a generic object: downloaded, never read)."""
    small = siftool_sif(workdir)
    blob = workdir / "payload.bin"
    with open(blob, "wb") as out:
        for _ in range(size // MB):
            out.write(os.urandom(MB))
    big = workdir / "big.sif"
    big.write_bytes(small.read_bytes())
    subprocess.run(["siftool", "add", "--datatype", "7", str(big), str(blob)], check=True, stdout=subprocess.DEVNULL)
    blob.unlink()
    big.chmod(0o644)
    return big


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(MB):
            digest.update(chunk)
    return f"sha256:{digest.hexdigest()}"


def measure_pulls(runner: Runner, dirs: Dirs, commands: dict[str, list[str]], env: dict[str, str],
                  rounds: int) -> dict[str, Series]:
    """Each command's seconds over `rounds`, the order alternating; its output and the pull cache removed after."""
    series = {key: Series(key, key, " ".join(argv[:3])) for key, argv in commands.items()}
    keys = list(commands)
    run(runner, ["mkdir", "-m", "700", str(dirs.pull_cache)], env)
    for number in range(rounds):
        for key in keys if number % 2 == 0 else keys[::-1]:
            seconds, failed = run(runner, commands[key], env)
            if failed:
                raise SystemExit(f"benchmark command failed: {failed}")
            series[key].times.append(seconds)
            for path in (dirs.out / "big.sif", dirs.pull_cache / "sif", dirs.pull_cache / "refs"):
                remove(path)
    return series


def target(label: str, ours: float | None, theirs: float | None, goal: float) -> Target:
    ratio = ours / theirs if ours and theirs else None
    return {"target": f"{label} ≤ {goal}×", "value": f"{ratio:.2f}×" if ratio else "n/a",
            "met": None if ratio is None else ratio <= goal, "margin": f"{goal - ratio:+.2f}×" if ratio else ""}


def exec_rows(runner: Runner, singpy: str, registry: RegistryServer, small: Path,
              env: dict[str, str], tls: RegistryServer | None = None) -> list[ExecRow]:
    """`exec X.sif` and the cached oras:// (tag, digest) and docker:// (tag) forms of the same image, cached once."""
    tag = f"oras://{registry.host}/small:v1"
    digest = f"oras://{registry.host}/small@{manifest_digest(registry.url, 'small', 'v1')}"
    registry.upload(busybox_image(), "dsmall")  # issue 31: the same check for a docker:// image by tag
    docker = f"docker://{registry.host}/dsmall:latest"
    rows = [ExecRow("sif", "exec X.sif true", [singpy, "exec", str(small), "true"], "singpy exec X.sif true")]
    for key, label, ref in (("oras-tag", "exec oras://X:tag true (cached, one HEAD request)", tag),
                            ("oras-digest", "exec oras://X@sha256 true (cached, no request)", digest),
                            ("docker-tag", "exec docker://X:tag true (cached, one HEAD request)", docker)):
        rows.append(ExecRow(key, label, [singpy, "exec", "--no-https", ref, "true"], label))
        run(runner, rows[-1].argv, env)  # cached once, untimed
    if tls is not None:  # issue 31: the same over HTTPS (its CA in SSL_CERT_FILE, as a site's private CA)
        tls.upload(busybox_image(), "dsmall")
        label = "exec docker://X:tag true over TLS (cached, one HEAD request)"
        rows.append(ExecRow("docker-tag-tls", label, [singpy, "exec", f"docker://{tls.host}/dsmall:latest", "true"],
                            label))
        run(runner, rows[-1].argv, env)
    # The docker:// rows' reference: the same converted image as a file (X.sif is another image, whose run costs
    # less: no Docker environment scripts to source), pulled to the user's directory.
    docker_sif = small.parent / "dsmall.sif"
    run(runner, [singpy, "-q", "pull", "--no-https", str(docker_sif), docker], env)
    rows.append(ExecRow("docker-sif", "exec D.sif true (the docker:// image as a file)",
                        [singpy, "exec", str(docker_sif), "true"], "singpy exec D.sif true"))
    return rows


# Each row's reference (default: `exec X.sif`).
BASELINES = {"docker-tag": "docker-sif", "docker-tag-tls": "docker-sif"}


def benchmark(workdir: Path, singpy: str, *, size: int, pull_rounds: int, exec_rounds: int,
              as_root: bool) -> tuple[list[str], dict[str, Any], RunInfo]:
    account = startup.choose_account(as_root)
    info = startup.machine()
    dirs = make_dirs(workdir, account)
    runner = Runner(account.uid, account.gid, account.user, account.home, str(dirs.user), PATH)
    big = big_sif(workdir, size)
    small = dirs.user / "small.sif"
    small.write_bytes(siftool_sif(workdir).read_bytes())
    os.chown(small, account.uid, account.gid)
    env = {**base_env(dirs), "SINGPY_CACHEDIR": str(dirs.exec_cache)}
    with start_registry(workdir / "registry") as registry, \
            start_registry(workdir / "registry-tls", tls=True) as tls_registry:  # the TLS row's
        env["SSL_CERT_FILE"] = tls_registry.ca_file or ""
        print(f"pushing {big.stat().st_size // MB} MB to {registry.host} ...", file=sys.stderr)
        for sif, name in ((big, "big"), (small, "small")):
            subprocess.run([singpy, "-q", "push", "--no-https", str(sif), f"oras://{registry.host}/{name}:v1"],
                           check=True, env={**os.environ, "SINGPY_CACHEDIR": str(workdir / "root-cache")})
        out = dirs.out / "big.sif"
        pulls = measure_pulls(runner, dirs, {
            "singpy": [singpy, "-q", "pull", "--no-https", str(out), f"oras://{registry.host}/big:v1"],
            "curl": ["curl", "-sf", "-o", str(out), f"{registry.url}/v2/big/blobs/{sha256(big)}"],
        }, {**base_env(dirs), "SINGPY_CACHEDIR": str(dirs.pull_cache)}, pull_rounds)
        rows = exec_rows(runner, singpy, registry, small, env, tls_registry)
        measure_exec(runner, rows, env, exec_rounds, seed=1)
        apart = apart_rows(rows, ("sif", "oras-tag", "docker-sif", "docker-tag", "docker-tag-tls"))
        measure_apart(runner, apart, env, exec_rounds, 1, (registry.pid, tls_registry.pid))
        rows += apart
    info["loadavg_end"] = os.getloadavg()
    commit, dirty = startup.git_commit()
    run_info = RunInfo(machine=info, tools=tool_versions(), now=datetime.datetime.now(datetime.UTC), commit=commit,
                       dirty=dirty, who=account.describe(), rounds=pull_rounds, exec_rounds=exec_rounds)
    lines, document = render(pulls, rows, size)
    return [MARKERS[0], "## `oras://` pulls and cached runs (issue 29)", "",
            "Generated by `benchmarks/pull_oras.py` (run by `make bench`); what the figures mean and the runs so "
            "far are in [docs/pull.md](pull.md#speed).", "", *conditions(run_info), *lines, MARKERS[1]], \
        document, run_info


def render(pulls: dict[str, Series], rows: list[ExecRow], size: int) -> tuple[list[str], dict[str, Any]]:
    """The tables (medians) and the targets of one run, and its JSON document."""
    ours, curl = pulls["singpy"].median, pulls["curl"].median
    by_key = {row.key: row for row in rows}
    lines = ["| measure | singpy | reference | ratio |", "|---|---:|---:|---:|",
             f"| `pull oras://` of {size // MB} MB vs `curl` of the blob, {len(pulls['curl'].times)} rounds | "
             f"{ours or 0:.3f} s | {curl or 0:.3f} s | **{(ours or 0) / (curl or 1):.2f}×** |"]
    found = [target(f"pull oras:// of {size // MB} MB vs curl", ours, curl, TARGETS["pull"])]
    for row in rows:
        plain = row.key.removesuffix(APART)
        if plain == "sif" or plain in BASELINES.values():
            continue
        apart = plain != row.key  # informative: the registry kept off the launcher's core (no target)
        base = by_key[BASELINES.get(plain, "sif") + (APART if apart else "")]
        where = ", the registry on the other core" if apart else ""
        lines.append(f"| `{row.display}` vs `{base.display}`{where}, {len(row.times)} rounds | "
                     f"{row.median or 0:.1f} ms | {base.median or 0:.1f} ms | "
                     f"**{(row.median or 0) / (base.median or 1):.2f}×** |")
        if not apart:
            found.append(target(row.label, row.median, base.median, TARGETS["exec"]))
    lines += ["", *targets_table(found), ""]
    document = {"pull_s": {key: series.times for key, series in pulls.items()},
                "exec_ms": {row.key: row.times for row in rows}, "targets": found,
                "medians": {"pull_s": {key: series.median for key, series in pulls.items()},
                            "exec_ms": {row.key: row.median for row in rows}}}
    return lines, document


def manifest_digest(url: str, repository: str, tag: str) -> str:
    """The digest the registry gives the manifest of REPOSITORY:TAG (a HEAD request)."""
    import urllib.request

    request = urllib.request.Request(f"{url}/v2/{repository}/manifests/{tag}", method="HEAD",
                                     headers={"Accept": "application/vnd.oci.image.manifest.v1+json"})
    with urllib.request.urlopen(request, timeout=30) as response:
        return str(response.headers["Docker-Content-Digest"])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="singpy oras:// benchmark (issue 29)")
    parser.add_argument("--rounds", type=int, default=5, help="timed pull rounds of each (default 5)")
    parser.add_argument("--exec-rounds", type=int, default=30, help="timed exec rounds of each (default 30)")
    parser.add_argument("--quick", action="store_true", help="a ~20 MB SIF, 2 pull and 6 exec rounds")
    parser.add_argument("--as-root", action="store_true", help="run the commands as root (default: the test user)")
    parser.add_argument("--no-write", action="store_true", help="print only")
    args = parser.parse_args(argv)
    if (commands := startup.venv_commands()) is None:
        return 1
    singpy, python = commands
    startup.fresh_bytecode(python)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    size = 20 * MB if args.quick else 200 * MB
    with scratch("oras") as workdir:
        lines, document, run_info = benchmark(workdir, singpy, size=size,
                                              pull_rounds=2 if args.quick else args.rounds,
                                              exec_rounds=6 if args.quick else args.exec_rounds, as_root=args.as_root)
    section = "\n".join(lines) + "\n"
    print(section)
    if not args.no_write:
        doc = write_section(section, MARKERS)
        save_results(run_info, "oras", doc, {"date": run_info.now.isoformat(), "commit": run_info.commit,
                                             "dirty": run_info.dirty, "machine": run_info.machine,
                                             "tools": run_info.tools, **document}, quick=args.quick)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
