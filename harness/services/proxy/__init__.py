"""The fault proxy: a user-space TCP proxy whose faults ("toxics") are switched on and off while
a run goes on (:mod:`.server` has the whole picture; ``python -m harness.services.proxy``)."""
