"""How the image becomes the container's root, and the writable modes.

Owns the staging root and the two pivots (`rootfs.py`), the underlay where
the kernel refuses an overlay (`underlay.py`), the overlay choices of
--overlay, --writable and --writable-tmpfs (`overlay.py`, planned) and their
mounting (`overlayfs.py`), and --fakeroot's id maps (`fakeroot.py`).

May import: `singpy.host`, `singpy.image`, `singpy.mounts`, `singpy.kernel`,
`singpy.config` and the base at the root; never `singpy.launch` (one
exception left: `singpy.launch.process.fork_tied` forks the FUSE helpers and
the --fakeroot helper) or `singpy.cli`. Inside: rootfs -> underlay ->
staging (the staging paths and `remount`).
"""
