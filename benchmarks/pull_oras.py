"""oras:// benchmark (issue 29): `singpy pull oras://` against curl of the same blob, and `exec oras://` cached
against `exec X.sif`.

    make bench                                     # startup.py, pull.py, ..., then this
    .venv/bin/python benchmarks/pull_oras.py       # a ~200 MB SIF, 5 pull rounds, 30 exec rounds
    .venv/bin/python benchmarks/pull_oras.py --quick --no-write

Two measures, each run side by side, rounds interleaved (the order alternates), `sync` before each command:

1. `singpy -q pull --no-https OUT.sif oras://HOST/big:v1` with an empty cache (a download into the cache, the
   digest check, the copy to OUT.sif) against `curl -sf -o OUT http://HOST/v2/big/blobs/DIGEST`, the same blob
   from the same registry (docker-registry on 127.0.0.1, plain HTTP), which checks nothing. Target: <= 1.1x.
2. `singpy exec oras://HOST/small:v1 true` with the SIF cached (one HEAD request: has the tag moved?) against
   `singpy exec SMALL.sif true`, the same SIF as a file. Target: <= 1.2x. The same by digest (no request),
   and `singpy exec docker://HOST/dsmall:latest true` of a cached busybox image (issue 31, the same target).

The big SIF is a runnable busybox SIF (siftool, as tests.support.sifs makes it) plus a ~200 MB generic object
of random bytes; it is pushed with `singpy push`. As root the commands run as the test user `singpy-test`, in
directories it owns (as pull.py does). Prints the table; writes benchmarks/results/DATE-COMMIT-oras.json
unless --no-write.
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import json
import os
import signal
import statistics
import subprocess
import sys
from pathlib import Path

import startup
from pull_commands import PATH, base_env, make_dirs, remove, run, scratch
from startup_repo import REPO
from startup_runner import Runner

from tests.support.oci import busybox_image
from tests.support.registry import start_registry
from tests.support.sifs import siftool_sif

MB = 1 << 20
TARGETS = {"pull": 1.1, "exec": 1.2}


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


def timed_pair(runner: Runner, first: tuple[list[str], dict[str, str]], second: tuple[list[str], dict[str, str]],
               rounds: int, between: list[Path]) -> tuple[list[float], list[float]]:
    """Seconds of each command over `rounds`, alternating which goes first; `between` removed after each run."""
    times: tuple[list[float], list[float]] = ([], [])
    for number in range(rounds):
        order = (0, 1) if number % 2 == 0 else (1, 0)
        for which in order:
            argv, env = (first, second)[which]
            seconds, failed = run(runner, argv, env)
            if failed:
                raise SystemExit(f"benchmark command failed: {failed}")
            times[which].append(seconds)
            for path in between:
                remove(path)
    return times


def row(label: str, singpy: list[float], reference: list[float], target: float) -> dict[str, object]:
    ours, theirs = statistics.median(singpy), statistics.median(reference)
    return {"label": label, "singpy_median_s": round(ours, 4), "reference_median_s": round(theirs, 4),
            "ratio": round(ours / theirs, 3), "target": target, "met": ours / theirs <= target,
            "singpy_s": [round(t, 4) for t in singpy], "reference_s": [round(t, 4) for t in reference]}


def benchmark(workdir: Path, singpy: str, *, size: int, pull_rounds: int, exec_rounds: int,
              as_root: bool) -> list[dict[str, object]]:
    account = startup.choose_account(as_root)
    dirs = make_dirs(workdir, account)
    runner = Runner(account.uid, account.gid, account.user, account.home, str(dirs.user), PATH)
    big = big_sif(workdir, size)
    small = dirs.user / "small.sif"
    small.write_bytes(siftool_sif(workdir).read_bytes())
    os.chown(small, account.uid, account.gid)
    env = {**base_env(dirs), "SINGPY_CACHEDIR": str(dirs.exec_cache)}
    with start_registry(workdir / "registry") as registry:
        print(f"pushing {big.stat().st_size // MB} MB to {registry.host} ...", file=sys.stderr)
        for sif, name in ((big, "big"), (small, "small")):
            subprocess.run([singpy, "-q", "push", "--no-https", str(sif), f"oras://{registry.host}/{name}:v1"],
                           check=True, env={**os.environ, "SINGPY_CACHEDIR": str(workdir / "root-cache")})
        blob = f"{registry.url}/v2/big/blobs/{sha256(big)}"
        out = dirs.out / "big.sif"
        pull_env = {**base_env(dirs), "SINGPY_CACHEDIR": str(dirs.pull_cache)}
        pull = ([singpy, "-q", "pull", "--no-https", str(out), f"oras://{registry.host}/big:v1"], pull_env)
        curl = (["curl", "-sf", "-o", str(out), blob], base_env(dirs))
        run(runner, ["mkdir", "-m", "700", str(dirs.pull_cache)], pull_env)
        singpy_pull, curl_pull = timed_pair(runner, pull, curl, pull_rounds, [out, dirs.pull_cache / "sif",
                                                                             dirs.pull_cache / "refs"])
        reference = f"oras://{registry.host}/small:v1"
        by_digest = f"oras://{registry.host}/small@{manifest_digest(registry.url, 'small', 'v1')}"
        for cached_ref in (reference, by_digest):  # cached once, untimed
            run(runner, [singpy, "exec", "--no-https", cached_ref, "true"], env)
        as_file = ([singpy, "exec", str(small), "true"], env)
        exec_tag, exec_file = timed_pair(runner, ([singpy, "exec", "--no-https", reference, "true"], env), as_file,
                                         exec_rounds, [])
        exec_digest, exec_file2 = timed_pair(runner, ([singpy, "exec", "--no-https", by_digest, "true"], env),
                                             as_file, exec_rounds, [])
        registry.upload(busybox_image(), "dsmall")  # issue 31: the same check for a docker:// image by tag
        docker = f"docker://{registry.host}/dsmall:latest"
        run(runner, [singpy, "exec", "--no-https", docker, "true"], env)  # cached once, untimed
        exec_docker, exec_file3 = timed_pair(runner, ([singpy, "exec", "--no-https", docker, "true"], env),
                                             as_file, exec_rounds, [])
    return [row(f"pull oras:// of {size // MB} MB vs curl of the blob", singpy_pull, curl_pull, TARGETS["pull"]),
            row("exec oras://X:tag (cached, one HEAD request) true vs exec X.sif true", exec_tag, exec_file,
                TARGETS["exec"]),
            row("exec oras://X@sha256 (cached, no request) true vs exec X.sif true", exec_digest, exec_file2,
                TARGETS["exec"]),
            row("exec docker://X:tag (cached, one HEAD request) true vs exec X.sif true", exec_docker, exec_file3,
                TARGETS["exec"])]


def manifest_digest(url: str, repository: str, tag: str) -> str:
    """The digest the registry gives the manifest of REPOSITORY:TAG (a HEAD request)."""
    import urllib.request

    request = urllib.request.Request(f"{url}/v2/{repository}/manifests/{tag}", method="HEAD",
                                     headers={"Accept": "application/vnd.oci.image.manifest.v1+json"})
    with urllib.request.urlopen(request, timeout=30) as response:
        return str(response.headers["Docker-Content-Digest"])


def report(rows: list[dict[str, object]]) -> str:
    lines = ["| measure | singpy (median s) | reference (median s) | ratio | target |", "|---|---|---|---|---|"]
    for item in rows:
        mark = "met" if item["met"] else "MISSED"
        lines.append(f"| {item['label']} | {item['singpy_median_s']} | {item['reference_median_s']} | "
                     f"{item['ratio']}x | <= {item['target']}x ({mark}) |")
    return "\n".join(lines)


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
        rows = benchmark(workdir, singpy, size=size, pull_rounds=2 if args.quick else args.rounds,
                         exec_rounds=6 if args.quick else args.exec_rounds, as_root=args.as_root)
    load = os.getloadavg()
    print(report(rows))
    print(f"\nload average at the end: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f} ({os.cpu_count()} CPUs)")
    if not args.no_write:
        commit, dirty = startup.git_commit()
        now = datetime.datetime.now(datetime.UTC)
        out = REPO / "benchmarks" / "results" / (f"{now.strftime('%Y-%m-%d')}-{commit}{'-dirty' if dirty else ''}"
                                                 f"-oras{'-quick' if args.quick else ''}.json")
        out.write_text(json.dumps({"commit": commit, "dirty": dirty, "when": now.isoformat(), "loadavg": load,
                                   "rows": rows}, indent=1) + "\n")
        print(f"wrote {out.relative_to(REPO)}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
