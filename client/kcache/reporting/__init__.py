"""What a process tells its user about the cache: the exit report and ``kcache stats``
(:mod:`.report`), miss and unsound-key explanations (:mod:`.explanations`), torch's phase timers
(:mod:`.torch_phases`).

Stands on :mod:`kcache.transport` and below; the runtime hands it a process's counters at exit.
"""
