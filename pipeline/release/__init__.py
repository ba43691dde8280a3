"""The release layer: what a run leaves for people and machines downstream.

``manifest`` (the release manifest), ``kubernetes`` (the deployment manifests), ``report`` (the plan
as tables) and ``ci/`` (JUnit XML, step summaries, ``--json``).
"""
