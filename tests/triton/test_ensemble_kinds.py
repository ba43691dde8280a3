"""serving.ensemble: what serves the ensemble's name, and how a shared LoRA fine-tune's task id gets set.

python (the default): the BLS code with the ensemble's inputs, outputs and wiring, so a client that goes
away can be cancelled; triton: NVIDIA's platform ensemble. Server behaviour is in test_server_cancellation.py.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pipeline.triton import contract
from pipeline.triton.configs import BLS, BLS_STEPS_PARAMETER, RepositorySettings, all_configs, ensemble_steps
from pipeline.triton.pbtxt import parameters
from pipeline.triton.repository import model_steps, with_lora_task


def settings(ensemble: str, decoupled: bool = True, lookahead: bool = False) -> RepositorySettings:
    return RepositorySettings(
        ensemble_name="support",
        max_batch_size=4,
        decoupled=decoupled,
        lookahead=lookahead,
        preprocessing_instances=1,
        postprocessing_instances=1,
        max_queue_delay_microseconds=0,
        preprocessing_parameters={"tokenizer_dir": "tokenizer"},
        postprocessing_parameters={"tokenizer_dir": "tokenizer"},
        tensorrt_llm_parameters={"gpt_model_path": "/models/engine"},
        ensemble=ensemble,
    )


@pytest.mark.parametrize("lookahead", [False, True])
@pytest.mark.parametrize("decoupled", [True, False])
def test_the_python_ensemble_has_the_triton_ensembles_tensors_and_wiring(decoupled, lookahead):
    python = all_configs(settings("python", decoupled, lookahead))["support"]
    triton = all_configs(settings("triton", decoupled, lookahead))["support"]
    assert (python.backend, python.platform, triton.platform) == ("python", "", "ensemble")
    assert python.input == triton.input and python.output == triton.output  # the same client API
    # The same steps, every mapping kept: each outer name is an ensemble input or an internal tensor.
    assert model_steps(python, Path("repo")) == model_steps(triton, Path("repo"))
    assert python.model_transaction_policy.decoupled is decoupled
    # Non-decoupled Python models take one request per instance at a time: an instance per batch slot.
    assert python.instance_group[0].count == (1 if decoupled else 4)
    params = parameters(python)
    assert params["tensorrt_llm_model_name"] == "tensorrt_llm"
    assert params["specdeploy_forward_num_return_sequences"] == "true"  # as the ensemble's wiring does
    assert "lora_task_id" not in params


def test_the_bls_model_keeps_nvidias_inputs_and_drops_what_it_does_not_declare():
    configs = all_configs(settings("python", lookahead=True))
    steps = json.loads(parameters(configs[BLS])[BLS_STEPS_PARAMETER])
    # NVIDIA's BLS declares no Lookahead inputs: its preprocessing step reads none of them.
    look = {name.upper() for name in contract.LOOKAHEAD_CLIENT_INPUTS}
    assert not look & set(steps[0]["inputs"])
    assert look <= set(ensemble_steps(settings("python", lookahead=True))[0][1])
    assert "specdeploy_forward_num_return_sequences" not in parameters(configs[BLS])


def test_a_shared_fine_tunes_python_models_set_its_task_id_and_share_preprocessing():
    plain, tuned = all_configs(settings("python")), all_configs(with_lora_task(settings("python"), 7))
    assert tuned["preprocessing"] == plain["preprocessing"]  # so the group's fine-tunes share one
    for model in ("support", BLS):
        assert parameters(tuned[model])["lora_task_id"] == "7"
        (_, llm, _) = model_steps(tuned[model], Path("repo"))
        assert llm[1]["lora_task_id"] == "lora_task_id"  # what the model sets, unless the client sent one


def test_with_triton_ensemble_the_fine_tunes_preprocessing_sets_its_task_id():
    tuned = all_configs(with_lora_task(settings("triton"), 7))
    pre = tuned["preprocessing"]
    assert parameters(pre)["lora_task_id"] == "7"
    assert {"LORA_TASK_ID"} <= {t.name for t in pre.input} and "OUT_LORA_TASK_ID" in {t.name for t in pre.output}
    (_, _, outputs), (_, inputs, _), _ = model_steps(tuned["support"], Path("repo"))
    assert outputs["OUT_LORA_TASK_ID"] == inputs["lora_task_id"] == "_OUT_LORA_TASK_ID"


def test_an_unknown_ensemble_kind_is_refused():
    with pytest.raises(ValueError, match="ensemble must be one of"):
        all_configs(settings("nvidia"))
