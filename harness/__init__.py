"""torchdist-harness: fault-injection test harness for PyTorch distributed start-up.

A scenario (YAML) flows one way through a few rooms:
load (``harness.loader``) -> plan (``harness.plan``) -> launch + supervise (``harness.launch``,
ranks run ``harness.worker``) -> classify (``harness.classify``) -> expect (``harness.expect``).
Front doors: the pytest plugin (``harness.pytest_plugin``) and the CLI (``harness.cli``).
"""

__version__ = "0.1.0"
