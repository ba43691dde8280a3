"""specdeploy postprocessing: token ids -> text (a Triton Python model).

Copied into ``<repo>/postprocessing/1/model.py``, with the helper it shares with preprocessing
beside it (``specdeploy_tokenizer.py``: parameters, the tokenizer); imports only numpy, transformers
and Triton's utilities. Parameters: ``tokenizer_dir`` (relative to this model's folder, or
absolute) and ``skip_special_tokens``.

Streaming sends each decoding step's new tokens as a separate request, with no memory of the
previous ones. Decoded alone, a SentencePiece token loses its leading space ("▁world" ->
"world"), so pieces are decoded after a fixed anchor token and the anchor's text removed:
the pieces of a stream then join to the text a non-streaming request returns. (A character
whose UTF-8 bytes are split across two steps still shows as U+FFFD in both pieces.)

Besides ``OUTPUT`` it returns ``OUTPUT_TOKEN_COUNT``: a speculative step can accept several
tokens, so clients cannot count tokens by counting responses.
"""

from __future__ import annotations

import json

import numpy as np
import triton_python_backend_utils as pb_utils
from specdeploy_tokenizer import load_tokenizer, parameter  # beside this file (the module docstring)


class TritonPythonModel:
    def initialize(self, args: dict) -> None:
        config = json.loads(args["model_config"])
        self.tokenizer = load_tokenizer(args["model_repository"], config)
        self.skip_special = parameter(config, "skip_special_tokens", "true").lower() in ("true", "1", "yes")
        self.anchor = self.tokenizer.encode("a", add_special_tokens=False)[:1]
        self.anchor_text = self._decode(self.anchor)

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=self.skip_special)

    def decode_piece(self, ids: list[int]) -> str:
        if not ids:
            return ""
        text = self._decode(self.anchor + ids)
        if self.anchor and text.startswith(self.anchor_text):
            return text[len(self.anchor_text) :]
        return self._decode(ids)

    def execute(self, requests: list) -> list:
        responses = []
        for request in requests:
            tokens = pb_utils.get_input_tensor_by_name(request, "TOKENS_BATCH").as_numpy()
            lengths = pb_utils.get_input_tensor_by_name(request, "SEQUENCE_LENGTH").as_numpy()
            batch = tokens.shape[0]
            lengths = lengths.reshape(batch, -1)
            # [batch, beams, len]; a step can carry no token at all (e.g. the last one, at EOS).
            tokens = (
                tokens.reshape(batch, lengths.shape[1], -1)
                if tokens.size
                else np.zeros((batch, lengths.shape[1], 0), dtype=np.int32)
            )
            texts = np.empty(lengths.shape, dtype=object)
            counts = np.zeros(lengths.shape, dtype=np.int32)
            for row in range(batch):
                for beam in range(lengths.shape[1]):
                    count = int(min(max(lengths[row, beam], 0), tokens.shape[-1]))
                    texts[row, beam] = self.decode_piece(tokens[row, beam, :count].tolist()).encode("utf-8")
                    counts[row, beam] = count
            # One string per sequence of the request, flat ([num_beams] for one prompt), as NVIDIA's
            # postprocessing returns it: clients read text_output[0], not text_output[0][0].
            responses.append(
                pb_utils.InferenceResponse(
                    output_tensors=[
                        pb_utils.Tensor("OUTPUT", texts.reshape(-1)),
                        pb_utils.Tensor("OUTPUT_TOKEN_COUNT", counts.reshape(-1)),
                    ]
                )
            )
        return responses
