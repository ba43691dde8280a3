"""config.pbtxt as protobuf: build with ``ModelConfig`` messages, write text, parse it back.

Why protobuf and not text templates: a template leaves ``${x}`` behind when a key is
forgotten (Triton then refuses the file, or silently uses a default for a parameter,
tensorrtllm_backend#210); a message cannot hold a placeholder and every field name and enum is
checked by the same schema the server uses. ``tritonclient`` 2.73 ships the schema
(``model_config_pb2``); it is newer than the 2.51 server, so only long-standing fields are used.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as mc

from pipeline.errors import StageError

ModelConfig = mc.ModelConfig

DTYPES: dict[str, int] = {
    "BOOL": mc.TYPE_BOOL,
    "UINT8": mc.TYPE_UINT8,
    "INT32": mc.TYPE_INT32,
    "INT64": mc.TYPE_INT64,
    "UINT64": mc.TYPE_UINT64,
    "FP16": mc.TYPE_FP16,
    "FP32": mc.TYPE_FP32,
    "BF16": mc.TYPE_BF16,
    "STRING": mc.TYPE_STRING,
}


def set_parameters(config: mc.ModelConfig, parameters: Mapping[str, str]) -> None:
    for key, value in parameters.items():
        if not isinstance(value, str):
            raise TypeError(f"parameter {key} must be a string, got {type(value).__name__}")
        config.parameters[key].string_value = value


def parameters(config: mc.ModelConfig) -> dict[str, str]:
    return {key: value.string_value for key, value in config.parameters.items()}


def to_text(config: mc.ModelConfig) -> str:
    return text_format.MessageToString(config)


def parse(text: str, source: str | Path = "<config.pbtxt>") -> mc.ModelConfig:
    """Parse with the server's schema; any error names the file, line and column."""
    try:
        return text_format.Parse(text, mc.ModelConfig())
    except text_format.ParseError as exc:
        raise StageError(f"{source}: invalid Triton model config: {exc}") from None


def load(path: Path) -> mc.ModelConfig:
    return parse(path.read_text(), path)


def write(config: mc.ModelConfig, path: Path) -> None:
    """Write, then read back: what lands on disk is exactly what the server will parse."""
    text = to_text(config)
    if "${" in text:
        raise StageError(f"{path}: an unfilled ${{...}} placeholder would reach Triton")
    if parse(text, path) != config:
        raise StageError(f"{path}: config does not survive a text round trip")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
