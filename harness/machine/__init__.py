"""This machine: what it has (requirement kinds, torch, other interpreters) and what a run
takes of it (processes, state folders, ports, cgroups, output pipes, signals, the admission
gate)."""
