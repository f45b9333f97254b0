"""The scenario format and its files: schema, loader, which files are scenarios, the built-in
catalog, templates, the strict reading, message patterns, programs, and expectations checked
against a run's verdicts."""
