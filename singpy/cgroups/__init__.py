"""Resource limits: the container's cgroup (--apply-cgroups, --cpus, --memory, --pids-limit...), as Apptainer's.

Owns the limits as asked (`limits.py`: the flags and Apptainer's TOML file, the
OCI LinuxResources layout, checked as untrusted input), what they become in
the files of cgroup v1 and v2 (`files.py`), where the container's cgroup goes
on this host (`hierarchy.py`: root anywhere; a user only below a cgroup v2
subtree delegated to them), making, joining and removing it (`manager.py`)
and what an instance's cgroup reports (`stats.py`).

May import: `singpy.host` and the base at the root; never a layer above
(`singpy.launch` runs the cgroup around the container: `singpy.launch.limits`).
"""
