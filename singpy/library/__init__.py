"""`library://` images and the remotes that name their libraries (Apptainer's `remote` and the Sylabs
library protocol, as github.com/apptainer/container-library-client speaks it).

`ref.py` parses references; `remotes.py` reads and writes Apptainer's `remote.yaml`; `web.py` is the one
HTTP(S) door (no redirect followed with the library's token to another host; the proxy variables
honoured); `endpoint.py` discovers an endpoint's services and checks tokens; `client.py` speaks the
library's routes; `pull.py` downloads into the cache (sealed as a pulled SIF) and to a file; `push.py`
uploads (`multipart.py`: a large file in parts). Leaves that know nothing of the launch: may import `oci/`
(the cache layout, TLS, proxies), `image/`, `host/` and the root; nothing here is on `singpy exec`'s path
of a SIF or sandbox.
"""
