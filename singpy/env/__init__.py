"""The container's environment: the rules as data (`environ.py`) and --env-file (`envfile.py`).

May import: `singpy.host`, `singpy.kernel` and the base at the root; never
`singpy.launch`, `singpy.layers` or `singpy.cli`.
"""
