"""STAND-IN tensorrtllm backend for the server tests (not the reference backend).

Installed by ``test_server_standin.py`` as ``<backend-dir>/tensorrtllm/model.py`` so the Triton
wiring (ensemble, pre/postprocessing, streaming, cancellation, errors) is tested without the
real model. It "generates" by echoing the prompt ids cyclically: one token from the context step,
then two tokens per step (as if one of DRAFTS_PER_STEP draft tokens were accepted each step),
one step every STEP_SECONDS, on a thread per request (decoupled, like the in-flight batcher).
"""

import json
import threading
import time

import numpy as np
import triton_python_backend_utils as pb_utils

STEP_SECONDS = 0.01
TOKENS_PER_STEP = 2
DRAFTS_PER_STEP = 3


def _get(request, name, default=None):
    tensor = pb_utils.get_input_tensor_by_name(request, name)
    return default if tensor is None else tensor.as_numpy().reshape(-1)


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        self.exclude_default = config["parameters"]["exclude_input_in_output"]["string_value"] == "true"
        self.stops = {}  # request id -> Event, like the real backend's cancel-by-id (input "stop")

    def execute(self, requests):
        for request in requests:
            sender = request.get_response_sender()
            if bool(_get(request, "stop", [False])[0]):
                event = self.stops.get(request.request_id())
                if event is not None:
                    event.set()
                sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
                continue
            self.stops[request.request_id()] = threading.Event()
            threading.Thread(target=self._run, args=(request, sender), daemon=True).start()
        return None

    def _run(self, request, sender):
        try:
            self._generate(request, sender, self.stops[request.request_id()])
        except Exception as exc:  # noqa: BLE001 - any failure becomes the request's error
            sender.send(
                pb_utils.InferenceResponse(output_tensors=[], error=pb_utils.TritonError(str(exc))),
                flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL,
            )

    def _generate(self, request, sender, stop):
        length = int(_get(request, "input_lengths")[0])
        prompt = _get(request, "input_ids")[:length].astype(np.int32)
        wanted = int(_get(request, "request_output_len")[0])
        streaming = bool(_get(request, "streaming", [False])[0])
        perf = bool(_get(request, "return_perf_metrics", [False])[0])
        exclude = bool(_get(request, "exclude_input_in_output", [self.exclude_default])[0])
        end_id = int(_get(request, "end_id", [-1])[0])
        tokens = [int(prompt[i % length]) for i in range(wanted)]
        if end_id in tokens:  # EOS: the output stops before it, and the step that met it is empty
            tokens = tokens[: tokens.index(end_id)]
        steps = [tokens[:1]] + [tokens[i : i + TOKENS_PER_STEP] for i in range(1, len(tokens), TOKENS_PER_STEP)]
        if len(tokens) < wanted and len(tokens) % TOKENS_PER_STEP == 1:
            steps.append([])
        for index, chunk in enumerate(steps):
            if sender.is_cancelled() or stop.is_set():
                why = "stopped" if stop.is_set() else "cancelled"
                pb_utils.Logger.log_info(f"stand-in: request {why} after {index} steps")
                break  # like TensorRT-LLM: the request still ends with a final response
            time.sleep(STEP_SECONDS)
            if streaming:
                sender.send(self._response(chunk, perf, index))
        if not streaming and not stop.is_set():
            full = (list(prompt) if not exclude else []) + tokens
            sender.send(self._response(full, perf, len(steps) - 1))
        sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        self.stops.pop(request.request_id(), None)

    def _response(self, ids, perf, steps):
        """``steps``: generation steps so far (the context step drafts nothing)."""
        tensors = [
            pb_utils.Tensor("output_ids", np.array([[ids]], dtype=np.int32)),
            pb_utils.Tensor("sequence_length", np.array([[len(ids)]], dtype=np.int32)),
        ]
        if perf:
            accepted, drafted = steps * (TOKENS_PER_STEP - 1), steps * DRAFTS_PER_STEP
            rate = accepted / drafted if drafted else 0.0
            tensors += [
                pb_utils.Tensor("acceptance_rate", np.array([[rate]], dtype=np.float32)),
                pb_utils.Tensor("total_accepted_draft_tokens", np.array([[accepted]], dtype=np.int32)),
                pb_utils.Tensor("total_draft_tokens", np.array([[drafted]], dtype=np.int32)),
            ]
        return pb_utils.InferenceResponse(output_tensors=tensors)
