"""From what was seen to verdicts: the typed observation, classification, diagnosis,
expectations, the faults' effects and plan edits, and the readers of stderr and native stacks."""
