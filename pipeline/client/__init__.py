"""Clients of a running server: one streaming request (``stream``) and a load generator (``load``)."""

from pipeline.client.stream import (
    ClientError,
    GenerationRequest,
    GenerationResult,
    Piece,
    TritonClient,
    build_inputs,
)

__all__ = ["ClientError", "GenerationRequest", "GenerationResult", "Piece", "TritonClient", "build_inputs"]
