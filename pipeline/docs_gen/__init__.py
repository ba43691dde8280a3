"""The documentation site's reference pages, generated from the code they describe.

Three pages under ``docs/reference/`` are never edited by hand: the spec reference (from the JSON
schema ``specdeploy schema`` prints, plus the loader's cross-field checks), the CLI reference (from
the argparse parsers ``specdeploy --help`` prints) and the Triton contract (from
:mod:`pipeline.triton.contract`). ``python -m pipeline.docs_gen`` writes them; ``--check`` says which
committed page is out of date (``make docs`` and the tests run it).

This package is a leaf: nothing in ``pipeline/`` imports it.
"""
