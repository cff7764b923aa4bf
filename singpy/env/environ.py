"""The container environment, built by Apptainer's rules.

Precedence, lowest first (Apptainer's action script and its docs,
"Environment and Metadata"):

1. a base environment: HOME, the default PATH, LANG=C under --cleanenv, and
   the APPTAINER_/SINGULARITY_ variables describing the container;
2. the image's `/.singularity.d/env/*.sh` up to 99-base.sh, in lexical order;
3. injected variables: `SINGULARITYENV_X` < `APPTAINERENV_X` < `SINGPYENV_X`
   < `--env-file` < `--env` (singpy.env.envfile reads the files); `__SINGPY_`
   names (ACTION_SCRIPT's own) are refused with a warning, as HOME is;
4. LD_LIBRARY_PATH ends with /.singularity.d/libs (where --nv/--rocm put the
   host's GPU libraries; 99-base.sh's rule, applied to every image), unless
   injected empty (`--env LD_LIBRARY_PATH=`): it stays empty then, as with
   Apptainer, step 7 included. When /.singularity.d/libs is all it holds, and the directory
   has entries (or is missing: Apptainer tests `[ "$(cd DIR && echo *)" = "*" ]`)
   or PREPEND_LD_LIBRARY_PATH / APPEND_LD_LIBRARY_PATH is set, the container's
   default library directories go first (`/sbin/ldconfig -Nv | /bin/sed ...`,
   Apptainer 1.5), so that its own libraries win over the host's;
5. PATH rules: `..ENV_PREPEND_PATH`, `..ENV_APPEND_PATH`, then `..ENV_PATH`,
   each evaluated like an injected value, so `$PATH` in them is the image's
   (Apptainer's 99-runtimevars.sh);
6. the image's env scripts after 99-base.sh (`99-zz.sh`): they see and may change all of the above;
7. when LD_LIBRARY_PATH is not empty: /.singularity.d/libs32 when that
   directory has entries in the container (--compat32's 32-bit builds; the
   loader skips a library of the wrong class); last, PREPEND_LD_LIBRARY_PATH
   and APPEND_LD_LIBRARY_PATH, ordinary variables set by the image or
   injected, are put at either end. As Apptainer's action script, this looks
   at the container, not at the launch's own flags: a command joining an
   instance started with --compat32 gets it too;
8. host variables, only where nothing above set the same name (skipped with
   --cleanenv, except TERM and the proxy variables). PATH, LD_LIBRARY_PATH and
   the SINGULARITY_/APPTAINER_/SINGPY_/__SINGPY_ variables never pass;
9. `singpy shell` exports SHELL, the shell it starts, over all of the above.

When the image has env scripts, steps 2 and 6 need a shell inside the
container: `ACTION_SCRIPT` does steps 2-8 there. Otherwise `final_env` does
them here, with the same result and without starting a shell.
"""

from __future__ import annotations

from singpy.constants import DEFAULT_PATH, ENV_DIR, LIBS32_DIR, LIBS_DIR
from singpy.record import Record

TYPE_CHECKING = False  # see singpy.record
if TYPE_CHECKING:  # collections.abc (with collections, operator, keyword...) costs ~1.5 ms of every exec
    from collections.abc import Iterable, Mapping

INJECT_PREFIXES = ("SINGULARITYENV_", "APPTAINERENV_", "SINGPYENV_")  # later wins
RUNTIME_PREFIXES = ("SINGULARITY_", "APPTAINER_", "SINGPY_")
ALWAYS_PASSED = (
    "TERM", "http_proxy", "HTTP_PROXY", "https_proxy", "HTTPS_PROXY", "no_proxy", "NO_PROXY",
    "all_proxy", "ALL_PROXY", "ftp_proxy", "FTP_PROXY",
)
NEVER_PASSED = ("PATH", "LD_LIBRARY_PATH")
# Injection may not replace these (Apptainer: "Overriding HOME environment variable ... is not permitted").
PROTECTED = ("HOME", "SINGULARITY_SHELL", "APPTAINER_SHELL", "SINGULARITY_APPNAME", "APPTAINER_APPNAME")
# ACTION_SCRIPT's own variables: one injected or passed from the host would change what the script does.
INTERNAL_PREFIX = "__SINGPY_"
# The image's last env script sourced before injection (Apptainer injects right after it).
BASE_SCRIPT = "99-base.sh"


class EnvPlan(Record):
    """The inputs of the precedence above, each already filtered."""

    base: tuple[tuple[str, str], ...]  # step 1
    injected: tuple[tuple[str, str], ...]  # step 3, in precedence order (later wins)
    prepend_path: str = ""  # step 4
    append_path: str = ""
    path: str = ""  # replaces PATH when set
    host: tuple[tuple[str, str], ...] = ()  # step 6 candidates
    evaluate: bool = False  # injected values are evaluated once by the container's shell (not --no-eval)
    shell: str = ""  # step 7: SHELL, set inside the container by singpy.launch.process for `singpy shell`
    timer: bool = False  # --runscript-timeout: ACTION_SCRIPT exits 255 on the watchdog's SIGUSR1 (launch.scripttimer)


def is_valid_name(name: str) -> bool:
    """A name a POSIX shell can hold (no `re`: it is not loaded at start-up)."""
    return name.isascii() and name.isidentifier()


def is_protected(name: str) -> bool:
    """Whether injection (prefixes, --env, --env-file) may not set `name`: Apptainer's protected names, and
    the action script's own."""
    return name in PROTECTED or name.startswith(INTERNAL_PREFIX)


def injected_from_host(host_env: Mapping[str, str]) -> tuple[dict[str, str], list[str]]:
    """Variables the host asks to inject via prefixes; also returns warnings.

    A name set through two prefixes with different values is a warning in
    Apptainer's words (`SINGULARITYENV_X and APPTAINERENV_X have different
    values, using the latter`); the later prefix wins.
    """
    found: dict[str, str] = {}
    set_by: dict[str, str] = {}
    warnings = []
    for prefix in INJECT_PREFIXES:
        for key, value in host_env.items():
            if key.startswith(prefix) and is_valid_name(key[len(prefix):]):
                name = key[len(prefix):]
                if is_protected(name):
                    warnings.append(f"overriding {name} environment variable with {key} is not permitted")
                    continue
                if found.get(name, value) != value:
                    warnings.append(f"{set_by[name]} and {key} have different values, using the latter")
                found[name], set_by[name] = value, key
    return found, warnings


def host_passthrough(host_env: Mapping[str, str], *, cleanenv: bool, keep: Iterable[str] = (),
                     blocked: Iterable[str] = ()) -> dict[str, str]:
    """Host variables that may reach the container (step 6).

    `blocked`: --no-env's names, kept out as Apptainer keeps them out (its
    alwaysOmitKeys): TERM and the proxy variables pass all the same, and an
    injected APPTAINERENV_X or --env X still sets X.
    """
    kept = set(keep).difference(blocked)
    omitted = set(blocked).difference(ALWAYS_PASSED)
    return {key: value for key, value in host_env.items()
            if key in kept or (_is_passed(key) and key not in omitted and (not cleanenv or key in ALWAYS_PASSED))}


def _is_passed(key: str) -> bool:
    if key in NEVER_PASSED or key.startswith((*RUNTIME_PREFIXES, *INJECT_PREFIXES, INTERNAL_PREFIX)):
        return False
    return is_valid_name(key)


def split_path_rules(injected: dict[str, str]) -> tuple[dict[str, str], dict[str, str]]:
    """Move PREPEND_PATH / APPEND_PATH / PATH out of the injected variables."""
    rules: dict[str, str] = {key: injected.pop(key) for key in ("PREPEND_PATH", "APPEND_PATH", "PATH")
                             if key in injected}
    return injected, rules


def final_env(plan: EnvPlan, image_env: Mapping[str, str] | None = None, *,
              libs: str = LIBS_DIR, libs32: str = LIBS32_DIR, run_ldconfig: bool = True) -> dict[str, str]:
    """Steps 1-6 in Python, for an image whose env scripts set `image_env` (often nothing); run in the container,
    where `libs` and `libs32` are looked at (step 5). Without `run_ldconfig` (a --security filter, applied at
    the exec: the image's ldconfig would run before it) the container's default directories are not asked."""
    env = dict(plan.base)
    env.update(image_env or {})
    env.update(plan.injected)
    path = env.get("PATH", DEFAULT_PATH)
    if plan.prepend_path:
        path = f"{plan.prepend_path}:{path}"
    if plan.append_path:
        path = f"{path}:{plan.append_path}"
    env["PATH"] = plan.path or path
    env["LD_LIBRARY_PATH"] = "" if emptied_library_path(plan) else library_path(env, libs, libs32,
                                                                                   run_ldconfig=run_ldconfig)
    for key, value in plan.host:
        env.setdefault(key, value)
    if plan.shell:
        env["SHELL"] = plan.shell
    return env


def emptied_library_path(plan: EnvPlan) -> bool:
    """Whether LD_LIBRARY_PATH was injected empty (`--env LD_LIBRARY_PATH=`): Apptainer's injection comes after
    99-base.sh appended /.singularity.d/libs, and appends it only to a value that is not empty."""
    return any(key == "LD_LIBRARY_PATH" and not value for key, value in plan.injected)


def split_scripts(env_scripts: tuple[str, ...]) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The env scripts (in the lexical order of their names) sourced up to 99-base.sh, and those after (step 6);
    one that is a link elsewhere in the image (singpy.image.scripts) counts by the name it leads to there."""
    late = next((index for index, path in enumerate(env_scripts)
                 if path.rpartition("/")[0] == ENV_DIR and path.rpartition("/")[2] > BASE_SCRIPT), len(env_scripts))
    return env_scripts[:late], env_scripts[late:]


def library_path(env: Mapping[str, str], libs: str, libs32: str, *, run_ldconfig: bool = True) -> str:
    """Steps 4 and 7: the LD_LIBRARY_PATH of `env` (image and injected), as ACTION_SCRIPT makes it."""
    prepend, append = env.get("PREPEND_LD_LIBRARY_PATH", ""), env.get("APPEND_LD_LIBRARY_PATH", "")
    value = with_libs_dir(env.get("LD_LIBRARY_PATH", ""))
    if value == LIBS_DIR and (prepend or append or not _looks_empty(libs)):
        dirs = ldconfig_dirs() if run_ldconfig else ""
        value = f"{dirs}:{value}" if dirs else value
    value = with_libs_dir(value, libs32 if has_entries(libs32) else "")
    value = f"{prepend}:{value}" if prepend else value
    return f"{value}:{append}" if append else value


def _looks_empty(directory: str) -> bool:
    """Apptainer's `[ "$(cd DIR 2>/dev/null && echo *)" = "*" ]`: a directory without visible entries (a missing
    one is not: `cd` fails and prints nothing)."""
    import os  # loaded by the interpreter already: no cost

    return os.path.isdir(directory) and not has_entries(directory)


def ldconfig_dirs() -> str:
    """The container's library directories, colon-separated, as Apptainer's action script finds them:
    `$( (/sbin/ldconfig -Nv | /bin/sed '/^\\t/d;s/:.*//') 2>/dev/null )`, joined by `echo` (blanks split).

    Run in the container, in the payload's process (no shell: an image without
    /bin/sh). Apptainer's pipeline prints nothing without /bin/sed, or with a
    musl ldconfig (none, or silent): nor does this. sed's part is done here.
    """
    import os

    if not os.access("/bin/sed", os.X_OK):
        return ""
    output = _run_for_output("/sbin/ldconfig", "-Nv")
    words = []
    for line in output.splitlines():
        if not line.startswith("\t"):  # sed: /^\t/d (a library's line), then s/:.*// (the " (from ...)" part)
            words += [word for word in line.partition(":")[0].replace("\t", " ").split(" ") if word]
    return ":".join(words)


def _run_for_output(*argv: str) -> str:
    """The standard output of `argv` (its errors go nowhere, as ACTION_SCRIPT's `2>&-`); "" when it can't run.

    posix_spawn, not fork: glibc's vfork-style spawn copies none of the launcher's page tables (~1.6 ms less
    per `--nv` launch here than forking the interpreter: benchmarks/README.md), and its child runs nothing of
    Python's between the spawn and the exec, only the two descriptor actions. With no environment: ldconfig
    needs none, and the host's may hold names posix_spawn refuses ("=x")."""
    import os

    from singpy.host.hostfiles import spawn_reading  # loaded already: every launch reads singpy.conf with it

    try:
        _, output = spawn_reading(list(argv), {}, 1, ((os.POSIX_SPAWN_CLOSE, 2),))
    except OSError:  # no such program, or no process to spare: nothing found, as a failed pipeline finds nothing
        return ""
    return output.decode(errors="surrogateescape")


def with_libs_dir(value: str, libs32: str = "") -> str:
    """`value` ending with LIBS_DIR unless it has it, then `libs32` likewise (Apptainer appends it last)."""
    value = value if LIBS_DIR in value.split(":") else f"{value}:{LIBS_DIR}" if value else LIBS_DIR
    return value if not libs32 or libs32 in value.split(":") else f"{value}:{libs32}"


def has_entries(directory: str) -> bool:
    """Whether `directory` is a directory with an entry not starting with "." (what the action script's glob
    sees; Apptainer's test: `[ "$(cd DIR && echo *)" != "*" ]`)."""
    import os  # loaded by the interpreter already: no cost

    try:
        with os.scandir(directory) as entries:
            return any(not entry.name.startswith(".") for entry in entries)
    except OSError:
        return False


def needs_shell(plan: EnvPlan) -> bool:
    """Whether an injected value or a PATH rule must be evaluated by a shell ($VAR, `cmd`, backslashes)."""
    values = [value for _, value in plan.injected] + [plan.prepend_path, plan.append_path, plan.path]
    return plan.evaluate and any(mark in value for value in values for mark in _EVALUATED)


_EVALUATED = ("$", "`", "\\")


def double_quoted_body(value: str) -> str:
    """`value` made safe to write between double quotes in shell code, meaning what it says there.

    Inside double quotes a backslash escapes the next character, so escape
    pairs are kept as written (`\\$` stays a dollar sign); a `"` of its own
    would end the quotes, and a last, unpaired backslash would escape the
    closing one: both are escaped. The result always ends inside the quotes.
    """
    out = []
    index, end = 0, len(value)
    while index < end:
        char = value[index]
        if char == "\\":
            pair = value[index:index + 2]
            out.append(pair if len(pair) == 2 else "\\\\")
            index += 2
            continue
        out.append('\\"' if char == '"' else char)
        index += 1
    return "".join(out)


def evaluates_to(value: str) -> str:
    """The injected value whose evaluation (between double quotes, by ACTION_SCRIPT) is `value` itself.

    Inside double quotes a backslash escapes `\\`, `$` and a backquote, and
    `double_quoted_body` keeps such pairs as written. A `"` needs nothing: that
    function escapes it. Values that are someone else's text, not the user's
    (a CDI spec's env), are injected this way, literal as CDI and OCI set them.
    """
    return "".join(f"\\{char}" if char in _EVALUATED else char for char in value)


def shell_env(plan: EnvPlan, env_scripts: tuple[str, ...] = ()) -> dict[str, str]:
    """The environment the action shell starts with: base, plus data for ACTION_SCRIPT.

    `env_scripts` are the image's env scripts to source, as found in the image
    alone (singpy.image.scripts: plain paths, no space or glob character).

    Values travel as variables, never spliced into shell code, so their content
    is safe; the names were checked with `is_valid_name`. Only with `evaluate`
    is an injected value put between double quotes in code the shell evaluates,
    as Apptainer's injection script does, made by `double_quoted_body` unable
    to end those quotes: `$HOME` and `$(cmd)` in a value are then expanded
    inside the container, and no value can run code outside `$(...)` or break
    the script (a value that is not valid shell text between double quotes
    ends the launch with one FATAL line, evaluated in a subshell that alone
    dies of it).
    """
    env = dict(plan.base)
    early, late = split_scripts(env_scripts)
    env["__SINGPY_ENV_SCRIPTS"] = " ".join(early)
    env["__SINGPY_LATE_SCRIPTS"] = " ".join(late)
    if emptied_library_path(plan):
        env["__SINGPY_NOLIBS"] = "1"
    if plan.timer:
        env["__SINGPY_TIMER"] = "1"
    env["__SINGPY_INJECT"] = " ".join(key for key, _ in plan.injected)
    if plan.evaluate:
        env["__SINGPY_EVAL"] = "1"
    quoted = double_quoted_body if plan.evaluate else str
    env.update({f"__SINGPY_I_{key}": quoted(value) for key, value in plan.injected})
    host = [(key, value) for key, value in plan.host if key not in env]  # a base name is always set
    env["__SINGPY_HOST"] = " ".join(key for key, _ in host)
    env.update({f"__SINGPY_H_{key}": value for key, value in host})
    env.update({"__SINGPY_PREPEND": quoted(plan.prepend_path), "__SINGPY_APPEND": quoted(plan.append_path),
                "__SINGPY_PATH": quoted(plan.path), "__SINGPY_SHELL": plan.shell})
    return env


# Run as: /bin/sh -c ACTION_SCRIPT singpy PAYLOAD [ARGS...], with shell_env(). Host names are
# unset first so that what the shell sets for itself (busybox's HOSTNAME, PS4) does not
# count as "set by the image" when the host values are restored at the end. The script
# opens no file: its errors go nowhere (2>&-), never to a /dev/null the image may have
# redirected (`/dev -> /tmp/x` puts the host's /tmp there), and the env scripts are the
# list checked in the image, read with globbing off (`set -f`) so a name stays one word.
# They are sourced in two runs (the module's steps 2 and 6), by a loop written twice: a
# function call would hide the positional parameters ("$@", the payload) from them.
# After an OCI image's env script (10-docker2singularity.sh), the parts of the default PATH
# its PATH lacks are appended, as Apptainer's action script does (`fixpath`).
# The script's own lists are split on spaces whatever IFS an env script or an injected IFS
# left: that IFS is kept aside (x and its value; empty: unset), given to each later script
# and back before the exec; the host's IFS passes like any host variable, where none set one.
_SOURCE_SCRIPTS = r"""
set -f
for __f in $@LIST@; do
    set +f
    @RESTORE_IFS@
    . "$__f"
    @SAVE_IFS@
    case "$__f" in */10-docker2singularity.sh|*/10-docker.sh)
        for __n in @DEFAULT_PATH_WORDS@; do
            case ":$PATH:" in *":$__n:"*) ;; *) PATH="${PATH:+$PATH:}$__n" ;; esac
        done
        export PATH ;;
    esac
done
set +f"""
_SAVE_IFS = '__SINGPY_IFS=; [ -z "${IFS+x}" ] || __SINGPY_IFS=x$IFS'
_RESTORE_IFS = 'case $__SINGPY_IFS in x*) IFS=${__SINGPY_IFS#x} ;; *) unset IFS ;; esac'

ACTION_SCRIPT = r"""
[ -z "$__SINGPY_TIMER" ] || trap 'exit 255' USR1
unset __SINGPY_TIMER
for __n in $__SINGPY_HOST; do
    unset "$__n" 2>&-
done""" + _SOURCE_SCRIPTS.replace("@LIST@", "__SINGPY_ENV_SCRIPTS").replace("    @RESTORE_IFS@\n", "") \
    .replace("    @SAVE_IFS@\n", "") + r"""
@SAVE_IFS@
IFS=' '
__singpy_value() {  # __v := the value held by variable $2, evaluated unless --no-eval; $1 names it
    eval "__v=\${$2}"
    [ -n "$__SINGPY_EVAL" ] || return 0
    if ! (eval "__f() { : \"$__v\"; }") 2>&- || ! __v=$(eval "printf '%s.' \"$__v\""); then
        echo "FATAL:   can't evaluate $1: not valid shell text between double quotes (see --no-eval)" >&2
        exit 255
    fi
    __v=${__v%.}
}
for __n in $__SINGPY_INJECT; do
    __singpy_value "$__n" "__SINGPY_I_$__n"
    eval "export $__n=\"\$__v\""
    unset "__SINGPY_I_$__n"
done
case " $__SINGPY_INJECT " in *" IFS "*) __SINGPY_IFS=x$IFS; IFS=' ' ;; esac
if [ -z "$__SINGPY_NOLIBS" ]; then  # not emptied by injection: 99-base.sh's /.singularity.d/libs
    case ":$LD_LIBRARY_PATH:" in
        *:@LIBS_DIR@:*) ;;
        ::) LD_LIBRARY_PATH=@LIBS_DIR@ ;;
        *) LD_LIBRARY_PATH="$LD_LIBRARY_PATH:@LIBS_DIR@" ;;
    esac
fi
if [ "$LD_LIBRARY_PATH" = @LIBS_DIR@ ]; then  # Apptainer 1.5's set_default_ld_library_path (module docstring)
    __v=$PREPEND_LD_LIBRARY_PATH$APPEND_LD_LIBRARY_PATH
    [ -d @LIBS_DIR@/ ] || __v=1  # (the directory looked at is always written "@LIBS_DIR@/": tests replace it)
    for __f in @LIBS_DIR@/*; do [ -e "$__f" ] || [ -L "$__f" ] && __v=1; break; done
    if [ -n "$__v" ]; then
        __v=$( (/sbin/ldconfig -Nv | /bin/sed '/^\t/d;s/:.*//') 2>&-)
        __n=
        unset IFS  # split at blanks, as Apptainer's `echo $__dirs__`
        set -f
        for __f in $__v; do __n=$__n$__f:; done
        set +f
        IFS=' '
        LD_LIBRARY_PATH=$__n$LD_LIBRARY_PATH
    fi
fi
export LD_LIBRARY_PATH
# The PATH rules: all three evaluated against the image's PATH before any applies, as Apptainer does.
__v=
[ -z "$__SINGPY_PREPEND" ] || __singpy_value PREPEND_PATH __SINGPY_PREPEND
__SINGPY_PREPEND=$__v
__v=
[ -z "$__SINGPY_APPEND" ] || __singpy_value APPEND_PATH __SINGPY_APPEND
__SINGPY_APPEND=$__v
__v=
[ -z "$__SINGPY_PATH" ] || __singpy_value PATH __SINGPY_PATH
__SINGPY_PATH=$__v
[ -n "$__SINGPY_PREPEND" ] && PATH="$__SINGPY_PREPEND:$PATH"
[ -n "$__SINGPY_APPEND" ] && PATH="$PATH:$__SINGPY_APPEND"
[ -n "$__SINGPY_PATH" ] && PATH="$__SINGPY_PATH"
export PATH""" + _SOURCE_SCRIPTS.replace("@LIST@", "__SINGPY_LATE_SCRIPTS").replace("@RESTORE_IFS@", _RESTORE_IFS) \
    .replace("@SAVE_IFS@", _SAVE_IFS) + r"""
IFS=' '
if [ -n "$LD_LIBRARY_PATH" ]; then  # Apptainer adds nothing to an empty one
    for __f in @LIBS32_DIR@/*; do  # an entry (not the unmatched pattern): --compat32's directory ends it too
        [ -e "$__f" ] || [ -L "$__f" ] || break
        case ":$LD_LIBRARY_PATH:" in *:@LIBS32_DIR@:*) ;; *) LD_LIBRARY_PATH="$LD_LIBRARY_PATH:@LIBS32_DIR@" ;; esac
        break
    done
    [ -z "$PREPEND_LD_LIBRARY_PATH" ] || LD_LIBRARY_PATH=$PREPEND_LD_LIBRARY_PATH:$LD_LIBRARY_PATH
    [ -z "$APPEND_LD_LIBRARY_PATH" ] || LD_LIBRARY_PATH=$LD_LIBRARY_PATH:$APPEND_LD_LIBRARY_PATH
fi
case $__SINGPY_IFS in x*) ;; *) unset IFS ;; esac  # set by neither: the host's may pass below
for __n in $__SINGPY_HOST; do
    eval "[ -n \"\${$__n+x}\" ] || export $__n=\"\${__SINGPY_H_$__n}\"; unset __SINGPY_H_$__n"
done
case $__SINGPY_IFS in x*) IFS=${__SINGPY_IFS#x} ;; esac
[ -z "$__SINGPY_SHELL" ] || export SHELL="$__SINGPY_SHELL"
unset -f __singpy_value
unset __f __n __v __SINGPY_ENV_SCRIPTS __SINGPY_LATE_SCRIPTS __SINGPY_NOLIBS __SINGPY_INJECT __SINGPY_EVAL \
    __SINGPY_HOST __SINGPY_PREPEND __SINGPY_APPEND __SINGPY_PATH __SINGPY_SHELL __SINGPY_IFS
if ! __f=$(command -v "$1" 2>&-); then
    echo "FATAL:   \"$1\": executable file not found in \$PATH" >&2
    exit 255
fi
unset __f
trap - USR1
exec "$@"
"""
ACTION_SCRIPT = ACTION_SCRIPT.replace("@SAVE_IFS@", _SAVE_IFS).replace("@LIBS32_DIR@", LIBS32_DIR) \
    .replace("@LIBS_DIR@", LIBS_DIR).replace("@DEFAULT_PATH_WORDS@", DEFAULT_PATH.replace(":", " "))


# Names whose values --dry-run does not print (without --verbose): a plan shown in a bug
# report or a CI log must not leak an API token the host environment happened to carry.
SECRET_MARKS = ("TOKEN", "SECRET", "PASSWORD", "PASSWD", "PASSPHRASE", "KEY", "CREDENTIAL")
REDACTED = "<redacted>"


def looks_secret(name: str) -> bool:
    upper = name.upper()
    return any(mark in upper for mark in SECRET_MARKS)


def redact_secrets(env_data: dict[str, object]) -> None:
    """Replace, in place, the values of secret-looking names in an EnvPlan's JSON data (--dry-run)."""
    for field in ("base", "injected", "host"):
        pairs = env_data.get(field)
        if isinstance(pairs, list):
            env_data[field] = [[pair[0], REDACTED] if looks_secret(str(pair[0])) else pair for pair in pairs]


def parse_env_option(values: Iterable[str]) -> dict[str, str]:
    """--env NAME=VALUE[,NAME=VALUE...] (a comma only separates before a NAME=)."""
    from singpy.errors import UsageError

    result: dict[str, str] = {}
    for value in values:
        last = None  # a comma continues a value only within one --env
        for item in value.split(","):
            name, sep, text = item.partition("=")
            if sep and is_valid_name(name):
                result[name], last = text, name
            elif last is not None:  # a comma inside a value: "--env A=x,y"
                result[last] += "," + item
            else:
                raise UsageError(f"bad --env value {item!r}: expected NAME=VALUE")
    return result
