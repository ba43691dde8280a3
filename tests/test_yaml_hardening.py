"""Specs that attack the loader end in one located line, fast and in bounded memory."""

from __future__ import annotations

import os
import socket

import pytest

from pipeline.errors import InputError
from pipeline.spec.document import MAX_VARIANTS, load_spec
from pipeline.spec.yaml_source import MAX_DEPTH, MAX_NODES, MAX_SPEC_BYTES, load_yaml

HEAD = "name: demo\nmodel: {preset: llama-3-8b}\n"


def error_of(path) -> str:
    with pytest.raises(InputError) as info:
        load_spec(path)
    message = str(info.value)
    assert "\n" not in message and len(message) < 400, message
    return message


def write_bytes(tmp_path, data: bytes, name: str = "spec.yaml"):
    path = tmp_path / name
    path.write_bytes(data)
    return path


def laughs(levels: int, width: int = 9) -> str:
    lines = [f"l0: &l0 [{', '.join(['lol'] * width)}]"]
    for level in range(1, levels):
        lines.append(f"l{level}: &l{level} [{', '.join([f'*l{level - 1}'] * width)}]")
    return "\n".join(lines) + "\n"


def test_billion_laughs_is_refused_at_the_expansion_limit(tmp_path):
    path = write_bytes(tmp_path, (HEAD + laughs(9)).encode())
    message = error_of(path)
    assert f"more than {MAX_NODES} values" in message and str(path) + ":3:" in message


def test_aliases_inside_mappings_count_too(tmp_path):
    text = "a: &a {x: 1, y: 2, z: 3, w: 4, v: 5, u: 6, t: 7, s: 8, r: 9, q: 10}\n"
    for level in range(1, 7):
        keys = ", ".join(f"k{i}: *{'a' if level == 1 else f'm{level - 1}'}" for i in range(10))
        text += f"m{level}: &m{level} {{{keys}}}\n"
    assert f"more than {MAX_NODES} values" in error_of(write_bytes(tmp_path, (HEAD + text).encode()))


def test_small_alias_use_is_still_allowed(tmp_path):
    path = write_bytes(tmp_path, (HEAD + "description: &d hello\nvariants:\n  - name: a\n  - name: b\n").encode())
    assert [v.name for v in load_spec(path).variants] == ["a", "b"]
    document = load_yaml(write_bytes(tmp_path, laughs(3).encode(), "laughs.yaml"))  # 9 + 81 + 729 values
    assert len(document.data["l2"]) == 9 and document.data["l2"][0][0] == ["lol"] * 9


@pytest.mark.parametrize(
    "text, line",
    [
        ("description: &a [*a]\n", 3),
        ("description: &a {x: *a}\n", 3),
        ("description: &a [1, [2, [3, *a]]]\n", 3),
    ],
)
def test_self_referencing_alias_is_a_located_error(tmp_path, text, line):
    path = write_bytes(tmp_path, (HEAD + text).encode())
    message = error_of(path)
    assert "refers to the value that contains it" in message and f"{path}:{line}:" in message


@pytest.mark.parametrize("opener, closer", [("[", "]"), ("{a: ", "}")])
def test_deep_nesting_is_refused_without_recursion_error(tmp_path, opener, closer):
    path = write_bytes(tmp_path, (HEAD + "description: " + opener * 5000 + closer * 5000 + "\n").encode())
    message = error_of(path)
    assert f"nested deeper than {MAX_DEPTH} levels" in message and f"{path}:3:" in message


def test_block_style_nesting_is_bounded_too(tmp_path):
    text = "".join("  " * i + f"k{i}:\n" for i in range(MAX_DEPTH + 5))
    assert "nested deeper" in error_of(write_bytes(tmp_path, (HEAD + text).encode()))


def test_nesting_just_inside_the_limit_loads(tmp_path):
    depth = MAX_DEPTH - 2
    document = load_yaml(write_bytes(tmp_path, ("d: " + "[" * depth + "]" * depth + "\n").encode()))
    assert isinstance(document.data["d"], list)


def test_oversized_spec_is_refused_before_parsing(tmp_path):
    path = write_bytes(tmp_path, (HEAD + "description: '" + "x" * MAX_SPEC_BYTES + "'\n").encode())
    message = error_of(path)
    assert f"more than the {MAX_SPEC_BYTES} allowed" in message and str(path) in message


def test_too_many_variants_is_one_located_error(tmp_path):
    variants = "".join(f"  - name: v{i}\n" for i in range(MAX_VARIANTS + 1))
    path = write_bytes(tmp_path, (HEAD + "variants:\n" + variants).encode())
    message = error_of(path)
    assert message.startswith(f"{path}:3:1 variants: {MAX_VARIANTS + 1} variants")


def test_invalid_utf8_names_line_and_column(tmp_path):
    path = write_bytes(tmp_path, HEAD.encode() + b"description: caf\xc3\xa9 \xff\xfe\n")
    message = error_of(path)
    assert message.startswith(f"{path}:3:19 not UTF-8") and "0xff" in message


def test_binary_garbage_names_line_and_column(tmp_path):
    path = write_bytes(tmp_path, HEAD.encode() + b"description: ok\n\x00\x01\x02\x03")
    message = error_of(path)
    assert message.startswith(f"{path}:4:1 invalid YAML") and "U+0000" in message


def test_random_bytes_end_in_one_line(tmp_path):
    for seed in range(8):
        data = bytes((seed * 97 + i * 31) % 256 for i in range(400))
        path = write_bytes(tmp_path, data, f"random{seed}.yaml")
        assert str(path) in error_of(path)


def test_fifo_is_refused_without_opening_it(tmp_path):
    path = tmp_path / "spec.yaml"
    os.mkfifo(path)
    assert "is a FIFO (named pipe), not a regular file" in error_of(path)


def test_device_and_folder_and_socket_are_refused(tmp_path):
    assert "is a character device" in error_of(type(tmp_path)("/dev/zero"))
    assert "is a folder" in error_of(tmp_path)
    sock_path = tmp_path / "s.yaml"
    with socket.socket(socket.AF_UNIX) as sock:
        sock.bind(str(sock_path))
        assert "is a socket" in error_of(sock_path)


def test_dangling_symlink_and_missing_file(tmp_path):
    link = tmp_path / "link.yaml"
    link.symlink_to(tmp_path / "gone.yaml")
    assert "dangling symlink" in error_of(link)
    assert "spec file not found" in error_of(tmp_path / "nothing.yaml")


def test_symlink_to_a_regular_spec_is_read(tmp_path):
    real = write_bytes(tmp_path, HEAD.encode(), "real.yaml")
    link = tmp_path / "link.yaml"
    link.symlink_to(real)
    assert load_spec(link).variants[0].name == "demo"


def test_an_integer_too_long_for_python_is_a_located_error(tmp_path):
    path = write_bytes(tmp_path, (HEAD + "build: {max_batch_size: 1" + "0" * 5000 + "}\n").encode())
    assert error_of(path).startswith(f"{path}:3:25 build.max_batch_size: a number of 5001 characters")


@pytest.mark.parametrize(
    "value, words",
    [
        ("!!python/name:os.system", "could not determine a constructor"),
        ("!!python/object/apply:os.system [echo]", "not allowed in specs"),
        ("!!binary aGVsbG8=", "must be a string"),
        ("2001-12-14", "must be a string"),
        ("!!set {a, b}", "not allowed in specs"),
    ],
)
def test_tags_and_implicit_types_end_in_one_line(tmp_path, value, words):
    path = write_bytes(tmp_path, (HEAD + f"description: {value}\n").encode())
    message = error_of(path)
    assert message.startswith(f"{path}:3:") and words in message
