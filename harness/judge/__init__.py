"""From what was seen to verdicts: the typed observation, classification, diagnosis, the faults'
effects and plan edits, and the readers of stderr and native stacks. Below the scenario format:
it imports only core/ and net/."""
