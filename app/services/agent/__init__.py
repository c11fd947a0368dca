"""The tunnel agent's use cases (Liu et al.'s Client, Host and Target), one module per role.

- :mod:`~app.services.agent.client`: the mobile user's agent: request, verify, load, initiate; what
  its charon can do (:mod:`~app.services.agent.client_capabilities`), what it keeps on disk
  (:mod:`~app.services.agent.client_state`), and the user's devices
  (:mod:`~app.services.agent.client_devices`).
- :mod:`~app.services.agent.host`: the user's trusted machine: open, check, endorse, relay, revoke
  (:mod:`~app.services.agent.host_revocations`: revocations a Target has yet to confirm).
- :mod:`~app.services.agent.target`: the gateway: admit, negotiate, key, configure, revoke; what it
  admits (:mod:`~app.services.agent.target_admission`), its charon
  (:mod:`~app.services.agent.target_charon`) and what it loads there for a session
  (:mod:`~app.services.agent.target_loads`), its devices (:mod:`~app.services.agent.target_devices`),
  its sessions and leases (:mod:`~app.services.agent.target_sessions`), and what a rating or policy
  edit does to them (:mod:`~app.services.agent.target_edits`).
- :mod:`~app.services.agent.config`: the roles' YAML configuration; :mod:`~app.services.agent.timing`:
  the per-step timings a request's log line carries.
"""
