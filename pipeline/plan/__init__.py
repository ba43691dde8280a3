"""The plan layer: a spec resolved into what each variant builds and serves.

``types`` (the plan's records, a leaf every later layer may import), ``planner`` (``make_plan``: the
variants as written, the LoRA decision, the variants it changes as decided), ``speculative`` (the
resolved method config), ``memory`` and ``resources`` (what a plan needs of GPUs and hosts), ``adapters``
(what the planner reads of adapter folders), ``head_training`` (the train-heads stage), and
``preflight`` (``validate``'s checks of the files).
"""
