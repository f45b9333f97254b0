"""Inside the processes the harness starts: the harness's own rank (worker), the warm start
(fork server), the observer of processes it did not write and its site hook (``_site``), the
spawning parent."""
