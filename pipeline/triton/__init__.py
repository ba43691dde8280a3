"""Triton side of specdeploy: the model-repository emitter, config validation and launchers.

* ``repository``: writes ``triton_repo/<variant>/`` (ensemble, preprocessing, tensorrt_llm,
  postprocessing, tensorrt_llm_bls) from a :class:`~pipeline.plan.types.VariantPlan`.
* ``contract``: every tensor of NVIDIA's ``inflight_batcher_llm`` models, the one table the
  configs are built from; ``configs`` / ``pbtxt``: the ``config.pbtxt`` files as protobuf
  messages, and their checks.
* ``launch_cpu``: the real tritonserver 2.51 from the nvidia-pytriton wheel, on CPU, with the
  reference ``tensorrtllm`` backend.
* ``launch_gpu``: the mpirun command line for a GPU host (one rank per GPU).
"""
