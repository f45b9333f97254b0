"""Shared vocabulary of every part (pure, no I/O of its own): the harness's errors, the
format's limits, outcome words, the worker protocol, rows, triggers, where a job's store is,
and the scan behind the registries that keep no list by hand."""
