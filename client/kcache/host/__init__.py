"""Host safety: how kcache lives inside someone else's process (DESIGN.md, "Living inside
someone else's process").

The ground floor of the client: what kind of process this is (:mod:`.process_roles`), which
modules have finished importing (:mod:`.after_import`), the one fail-open boundary
(:mod:`.failopen`), the one registry of replaced attributes (:mod:`.patching`), the locks a
node's processes share (:mod:`.node_lock`) and the launcher that started the job
(:mod:`.launchers`). Imports nothing of kcache but itself.
"""
