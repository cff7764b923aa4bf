"""A cached tag's check sent ahead: `exec docker://X:TAG` and `oras://X:TAG` ask the registry while the launcher
goes on (issue 31).

singpy.cli.actions calls `send_ahead` as soon as the command line is parsed, before the launcher imports the
launch (~8 ms): when singpy.oci.quickhead's one request would check the tag of a cached image, the connection is
opened (and the TLS handshake begun) before the cache is looked at, the request sent after, and singpy.oci.pull
(or singpy.oci.oras) waits for its answer where it would have asked: the same digest compared, the same
warnings and errors, the same deadline. What overlaps is the registry's side (connecting, its handshake, its
time to answer), never a decision: the cached SIF runs only once the answer says the tag still names it. An
image that is not cached gets no request from here (the connection begun is closed); `settle` closes a check
nobody asked for (an error came first).
"""

from __future__ import annotations

TYPE_CHECKING = False  # see singpy.record: `typing` is not loaded at run time
if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

    from singpy.oci.pull import PullOptions
    from singpy.oci.ref import Reference


def prepare_early(words: Sequence[str], env: Mapping[str, str]) -> None:
    """`prepare` before anything is parsed: by the tuned console script as soon as its bundle serves
    (singpy.cli.launcher.TEMPLATE), else at the start of singpy.cli.main; 4-6 ms sooner than `prepare` after
    the parse (the helper it starts is on the longest path of a TLS run, docs/performance.md). When a word of
    the command line is a docker:// or oras:// image by tag after a run, exec, shell or test word, and none of
    the flags that rule out a check over TLS is written. A guess: `prepare` with the parsed command line confirms
    it or releases the helper; singpy.cli.main releases it for any other command."""
    first = next((index for index, word in enumerate(words) if word.startswith(("docker://", "oras://"))), None)
    if (first is None or "@" in words[first] or not _FAST.intersection(words[:first])
            or _NO_TLS_FLAGS.intersection(words)):
        return
    try:
        from singpy.oci import _tlscheck  # type: ignore[attr-defined]  # a C extension, built by make setup
    except ImportError:
        return
    from singpy.oci.quicktls import trust_variables

    _tlscheck.prepare(*trust_variables(env))


_FAST = frozenset(("run", "exec", "shell", "test"))  # singpy.cli.main.FAST_COMMANDS
_NO_TLS_FLAGS = frozenset(("--docker-login", "--no-https", "--nohttps"))


def prepare(text: str, options: PullOptions, env: Mapping[str, str]) -> None:
    """Over TLS, the check's helper started now (singpy.oci._tlscheck.prepare: a process that loads OpenSSL and
    makes its context, ~6 ms of CPU on the other core), when the command line names an image by tag that
    `send_ahead` would check over https; `send_ahead` hands it the check, or releases it. Where it would not,
    one started by `prepare_early` is released now (killed and reaped)."""
    if options.login or not text.startswith(("docker://", "oras://")) or "@" in text or not _https(options, env):
        release()
        return  # no check, or none over TLS ("@": by digest, or a reference the check would not take)
    try:
        from singpy.oci import _tlscheck  # type: ignore[attr-defined]  # a C extension, built by make setup
    except ImportError:
        return
    from singpy.oci.quicktls import trust_variables

    _tlscheck.prepare(*trust_variables(env))


def send_ahead(text: str, options: PullOptions, env: Mapping[str, str], home: str) -> bool:
    """Start the check of image `text` (docker:// or oras://, by tag) if the cache holds the image and the quick
    check would be asked (not with --docker-login: it asks for a password first); whether it started."""
    if options.login or not text.startswith(("docker://", "oras://")):
        return False
    from singpy.errors import SingpyError

    early = None
    try:
        ref, key = _parsed(text)
        if ref.digest:
            return False  # by digest: no request at all, or the full client's (nor the quick client's imports)
        from singpy.oci import quickhead

        early = quickhead.send(ref, ref.manifest_reference, https=_https(options, env), env=env, home=home)
        if early is None or not _cached(ref, key, options, env, home):
            return False  # not cached: the full client pulls it
        quickhead.expect(early)
        early = None
        return True
    except (SingpyError, OSError):
        return False  # a malformed reference, a cache refused...: said where the image is pulled, as ever
    finally:
        if early is not None:  # begun, not expected
            early.close()
        release()


def settle() -> None:
    """Close any check sent ahead that was not asked for."""
    from singpy.oci import quickhead

    quickhead.abandon()
    release()


def release() -> None:
    """A helper `prepare` started and no check took: killed and reaped (none is left to the container's
    program as a child it never made)."""
    import sys

    threaded = sys.modules.get("singpy.oci._tlscheck")
    if threaded is not None and threaded.pending():
        from singpy import console

        console.debug("the TLS context begun ahead is not used: released")
        threaded.release()


def _parsed(text: str) -> tuple[Reference, str]:
    """The reference, and the name the cache remembers it under (as pull.cached_image and oras.cached_sif)."""
    if text.startswith("oras://"):
        from singpy.oci import oras

        ref = oras.parse_ref(text)
        return ref, oras.shown(ref)
    from singpy.oci.ref import parse

    ref = parse(text)
    return ref, str(ref)


def _cached(ref: Reference, key: str, options: PullOptions, env: Mapping[str, str], home: str) -> bool:
    from singpy.oci import lookedup, pull, store

    return bool(lookedup.known(store.location(env, home), key, str(pull._platform(options)), remember=True)[1])


def _https(options: PullOptions, env: Mapping[str, str]) -> bool:
    from singpy.oci.pull import nohttps

    return options.https and not nohttps(env)
