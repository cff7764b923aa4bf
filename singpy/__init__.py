"""singpy: a Singularity/Apptainer-compatible container launcher.

Nothing is imported here: `singpy exec` is started thousands of times in job
arrays, and every import on its path costs start-up time.
"""

__version__ = "0.1.0"
# The Apptainer release whose behaviour singpy implements: what it answers as, when installed as `apptainer`
# or `singularity` (singpy.cli.version, docs/hpc.md).
APPTAINER_VERSION = "1.5.3"
