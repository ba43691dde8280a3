"""Requests to the ``tensorrt_llm`` model of a running tritonserver, over one gRPC stream."""

from __future__ import annotations

import queue

import numpy as np


def stream(server, requests: dict[str, tuple[list[int], int, dict]]) -> dict[str, list]:
    """Send all requests on one stream; collect each one's responses (or error) until its final flag."""
    import tritonclient.grpc as grpcclient

    results: queue.Queue = queue.Queue()
    client = grpcclient.InferenceServerClient(server.grpc_url)
    client.start_stream(callback=lambda result, error: results.put((result, error)))
    for rid, (prompt, n, extra) in requests.items():
        arrays = {
            "input_ids": np.array([prompt], np.int32),
            "input_lengths": np.array([[len(prompt)]], np.int32),
            "request_output_len": np.array([[n]], np.int32),
            **extra,
        }
        inputs = []
        for name, value in arrays.items():
            tensor = grpcclient.InferInput(
                name, list(value.shape), {np.dtype(np.int32): "INT32", np.dtype(bool): "BOOL"}[value.dtype]
            )
            tensor.set_data_from_numpy(value)
            inputs.append(tensor)
        client.async_stream_infer("tensorrt_llm", inputs, request_id=rid, enable_empty_final_response=True)
    got: dict[str, list] = {rid: [] for rid in requests}
    open_ids = set(requests)
    while open_ids:
        result, error = results.get(timeout=60)
        if error is not None:  # an error response is final and carries no id: one bad request per call
            rid = next(iter(open_ids))
            got[rid].append(error)
            open_ids.discard(rid)
            continue
        response = result.get_response()
        rid = response.id
        if response.outputs:
            got[rid].append(result.as_numpy("output_ids"))
        if response.parameters["triton_final_response"].bool_param:
            open_ids.discard(rid)
    client.stop_stream()
    client.close()
    return got
