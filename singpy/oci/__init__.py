"""OCI images: references, registries, layouts and archives, layers, and their conversion to SIF.

Leaves that know nothing of the launch: `singpy.oci.pull` is the one
orchestrator, and nothing here is imported by `singpy exec` of a sandbox or
SIF (tests/unit/test_hot_path_imports.py).
"""
