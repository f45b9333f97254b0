"""One run: the plan, the supervisor (the run's life), what a scenario needs of the machine,
which case starts first."""
