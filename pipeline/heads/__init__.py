"""Training and shipping speculative-decoding heads for the embedded model.

* ``prompts``  prompt sets in pipeline/data/prompts/ (chat written for the project, code cut
  from the Python standard library), deterministic train / held-out split
* ``data``     self-distillation data: the base model's greedy answers + final hidden states,
  cached in ``<cache>/heads-data/``
* ``medusa``   Medusa ResBlocks (head i -> token t+2+i), trained on cached features
* ``eagle``    EAGLE-1 drafter (fc + one Llama layer, TensorRT-LLM 1.2 format), trained on cached features
* ``vocab``    the vocabulary subset used by the training softmax
* ``evaluate`` top-1 per depth and an offline greedy acceptance estimate on held-out prompts
* ``export``   the shipped folders in heads/ (small, sha256 manifest)
* ``expand``   shipped Medusa ResBlocks -> standard FasterDecoding folder (lm_heads from the base)
* ``train``    ``specdeploy train-heads`` end to end

The feature conventions (post-norm hidden state, Medusa t+2+i, EAGLE embedding-first) are
documented at the top of ``medusa.py`` and ``eagle.py``.
"""
