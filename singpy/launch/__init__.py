"""The launch: request -> plan -> executor -> payload.

Owns the typed request (`request.py`), the planner (`planner.py`, pure: the
request, the conf and the host facts become a frozen `singpy.plan.LaunchPlan`),
the executor's top (`launch.py`: plan, then run in order) and its phases
(`phases.py`: namespaces, image, root, mounts), the payload process and the
supervisors (`process.py`, `pidns.py`), shared containers of a job step and
instances (`jobs.py`, `shared.py`, `holder.py`, their socket and messages in
`rendezvous.py`, `instance.py`) and the network plan (`network.py`).

May import: `singpy.layers`, `singpy.env`, `singpy.host`, `singpy.image`,
`singpy.gpu`, `singpy.mounts`, `singpy.kernel`, `singpy.config` and the base
at the root; never `singpy.cli`. Inside the folder, from the top: launch ->
shared -> holder -> pidns -> phases -> process, shared and holder ->
rendezvous; planner -> jobs -> request.
"""
