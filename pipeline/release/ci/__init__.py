"""What specdeploy writes for CI systems: one record of a run (records.py), as JUnit XML (junit.py) and
as the Markdown of GitHub's step summary (summary.py)."""
