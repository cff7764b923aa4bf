"""What singpy.conf's tests expect (tests/unit/test_sysconf*.py): every directive's default, and the stock
apptainer.conf of Apptainer 1.4.5 that must carry over (and the directives of it singpy does not apply)."""


EXPECTED_DEFAULTS = {
    "bind path": (),
    "mount proc": True,
    "mount sys": True,
    "mount dev": "yes",
    "mount devpts": True,
    "mount home": True,
    "mount tmp": True,
    "mount hostfs": False,
    "mount slave": True,
    "user bind control": True,
    "allow pid ns": True,
    "config passwd": True,
    "config group": True,
    "config resolv_conf": True,
    "always use nv": False,
    "always use rocm": False,
    "use nvidia-container-cli": True,
    "nvidia-container-cli path": "",
    "ldconfig path": "/sbin/ldconfig",
    "root default capabilities": "full",
    "allow net users": (),
    "allow net networks": (),
    "network bridge name": "singpy0",
    "network bridge subnet": "10.22.0.0/16",
    "network ptp subnet": "10.23.0.0/16",
    "unsquash": False,
    "unsquash in background": True,
    "unsquash in background max size": 4096,
    "allow kernel extfs": True,
    "allow kernel squashfs": True,
    "allow ipc ns": True,
    "allow uts ns": True,
    "allow net groups": (),
    "enable fusemount": True,
    "allow netns paths": (),
    "enable overlay": "yes",
    "enable underlay": "yes",
    "avoid kernel features": (),
    "sessiondir max size": 64,
    "max loop devices": 256,
    "memory fs type": "tmpfs",
    "limit container owners": (),
    "limit container groups": (),
    "limit container paths": (),
    "allow container sif": True,
    "allow container encrypted": True,
    "allow container squashfs": True,
    "allow container extfs": True,
    "allow container dir": True,
}

# The directives of Apptainer 1.4.5's default apptainer.conf (pkg/util/apptainerconf/config.go, TemplateAsset rendered
# with the defaults), in its order; its comment lines are skipped like any other.
STOCK_APPTAINER_CONF = """\
# APPTAINER.CONF
allow setuid = yes
max loop devices = 256
allow ipc ns = yes
allow pid ns = yes
allow user ns = yes
allow uts ns = yes
config passwd = yes
config group = yes
config resolv_conf = yes
mount proc = yes
mount sys = yes
mount dev = yes
mount devpts = yes
mount home = yes
mount tmp = yes
mount hostfs = no
#bind path = /etc/apptainer/default-nsswitch.conf:/etc/nsswitch.conf
bind path = /etc/localtime
bind path = /etc/hosts
user bind control = yes
enable fusemount = yes
enable overlay = yes
enable underlay = yes
mount slave = yes
sessiondir max size = 64
#limit container owners = gmk, apptainer, nobody
allow container sif = yes
allow container encrypted = yes
allow container squashfs = yes
allow container extfs = yes
allow container dir = yes
# allow setuid-mount encrypted = yes
# allow setuid-mount squashfs = iflimited
# allow setuid-mount extfs = no
#allow net users = gmk, apptainer
always use nv = no
use nvidia-container-cli = no
always use rocm = no
root default capabilities = full
memory fs type = tmpfs
#cni configuration path =
mksquashfs procs = 0
shared loop devices = no
image driver =
download concurrency = 3
download part size = 5242880
download buffer size = 32768
systemd cgroups = yes
apptheus socket path = /run/apptheus/gateway.sock
allow monitoring = no
"""

# The stock file's directives singpy reads and does not apply (a note each at --verbose).
IGNORED_IN_STOCK = ["allow setuid", "allow user ns",
                    "mksquashfs procs", "shared loop devices", "image driver", "download concurrency",
                    "download part size", "download buffer size", "systemd cgroups", "apptheus socket path",
                    "allow monitoring"]
