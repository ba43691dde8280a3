"""The spec layer: the YAML a user writes, read once and validated at the edge.

``document`` (the spec's types and ``load_spec``), ``yaml_source`` (YAML with positions), ``presets`` and
``gpus`` (named models and GPU types), ``deploy`` (the ``deploy:`` section), ``json_schema`` (the spec's
JSON schema for editors).
"""
