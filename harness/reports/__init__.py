"""What is written and read after runs: the JSON session report, the HTML report, diff and
compare, the evidence folders."""
