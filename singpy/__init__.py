"""singpy: a Singularity/Apptainer-compatible container launcher.

Nothing is imported here: `singpy exec` is started thousands of times in job
arrays, and every import on its path costs start-up time.
"""

__version__ = "0.1.0"
