"""The host as singpy sees it: facts, files, checks, site policy, the user's cache.

Owns `HostInfo` (`host.py`), the one door for host files named by a user or
an admin and the one PATH lookup (`hostfiles.py`), why a host refuses what
singpy needs (`hostcheck.py`), the site's limits (`policy.py`) and where the
user's cache is (`cachefiles.py`).

May import: `singpy.kernel`, `singpy.config` and the base at the root; never
a layer above (`singpy.launch`, `singpy.layers`, `singpy.env`, `singpy.cli`).
"""
