"""Serve a packaged repository on a host where its engines are somewhere else.

A packaged ``tensorrt_llm`` model names its engine where the deployment mounts the engines root:
``gpt_model_path: /models/engines/<variant>/engine`` (``deploy.mount_path``; NVIDIA's backend reads
the path as given). On the cluster that path holds the engine; on the build machine, or wherever
the output folders were moved, ``specdeploy serve --engines-dir DIR`` names the engines root
instead, and :func:`served_repository` gives the server a copy of the repository whose
``gpt_model_path`` is ``DIR/<variant>/engine`` (and a LoRA group's ``lora_prefetch_dir``
``DIR/<variant>/lora``). The copy is small: config files are rewritten,
everything else (model.py, tokenizers) is hard-linked where the filesystem allows.

Example: a repository packaged with ``mount_path: /models`` and moved with its engines to ``/srv``::

    served_repository(Path("/srv/triton_repo/base"), Path("/srv/engines"), Path(".cache/serving"))
    # -> .cache/serving/base-<pid>/, whose tensorrt_llm/config.pbtxt names /srv/engines/base/engine
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path, PurePosixPath

from pipeline.errors import InputError
from pipeline.io.atomic import pid_alive, remove_path, replace_folder
from pipeline.triton import pbtxt

ENGINE_CONFIG = "config.json"  # every engine folder has one (trtllm-build's and the reference build's)


# The tensorrt_llm parameters that name a folder under the deployment's engines root.
DEPLOYED_PATHS = ("gpt_model_path", "lora_prefetch_dir")


def engine_paths(repo: Path) -> dict[Path, dict[str, str]]:
    """{config.pbtxt of each tensorrt_llm model: its parameters}."""
    found = {}
    for path in sorted(Path(repo).glob("*/config.pbtxt")):
        config = pbtxt.load(path)
        if config.backend == "tensorrtllm":
            found[path] = pbtxt.parameters(config)
    return found


def local_engine(deployed_path: str, engines_dir: Path) -> Path:
    """The folder ``deployed_path`` names (an engine, a LoRA group's adapters), under this host's
    engines root (``<variant>/engine``, ``<variant>/lora``)."""
    deployed = PurePosixPath(deployed_path)
    return Path(engines_dir) / deployed.parent.name / deployed.name


def served_repository(repo: Path, engines_dir: Path, scratch: Path) -> Path:
    """``repo`` when every engine it names is on this host, else a copy under ``scratch`` whose
    engine paths name ``engines_dir``; InputError (exit 2) naming the model when an engine is in
    no place it could be.

    Per tensorrt_llm model, in this order: its ``gpt_model_path`` (the deployment's mount is here),
    ``engines_dir`` (rewritten into the copy), and for a reference target the engine where the
    package stage left it relative to the model's folder (the CPU backend looks there itself)."""
    repo = Path(repo)
    moved: dict[Path, dict[str, str]] = {}
    for config_path, params in engine_paths(repo).items():
        deployed, packaged = params.get("gpt_model_path", ""), params.get("reference_engine_path")
        if deployed and (Path(deployed) / ENGINE_CONFIG).is_file():
            continue
        local = local_engine(deployed, engines_dir)
        if not (local / ENGINE_CONFIG).is_file():
            if packaged and (config_path.parent / packaged / ENGINE_CONFIG).is_file():
                continue
            raise InputError(
                f"{config_path}: gpt_model_path {deployed} holds no engine on this host, and neither does "
                f"{local}; give --engines-dir the folder that holds <variant>/engine for this repository"
            )
        # Every deployed path moves with the engine (a LoRA group's adapters sit beside it).
        moved[config_path] = {
            key: str(local_engine(params[key], engines_dir).resolve()) for key in DEPLOYED_PATHS if params.get(key)
        }
    if not moved:
        return repo
    scratch = Path(scratch)
    scratch.mkdir(parents=True, exist_ok=True)
    _remove_dead_copies(scratch)
    target = scratch / f"{repo.name}-{os.getpid()}"
    tmp = scratch / f".{target.name}.tmp"
    if os.path.lexists(tmp):
        remove_path(tmp)
    shutil.copytree(repo, tmp, copy_function=_link_or_copy)
    for config_path, paths in moved.items():
        config = pbtxt.load(config_path)
        pbtxt.set_parameters(config, paths)
        copied = tmp / config_path.relative_to(repo)
        copied.unlink()  # a hard link to the packaged file: never write through it
        pbtxt.write(config, copied)
    replace_folder(tmp, target)
    return target


def _link_or_copy(source: str, target: str) -> None:
    try:
        os.link(source, target)
    except OSError:  # another filesystem, or links not allowed
        shutil.copy2(source, target)


def _remove_dead_copies(scratch: Path) -> None:
    """Copies made for servers whose launcher is gone (its pid ends the name)."""
    for copy in scratch.iterdir():
        pid = copy.name.rsplit("-", 1)[-1].removesuffix(".tmp")
        if pid.isdigit() and int(pid) != os.getpid() and not pid_alive(int(pid)):
            try:
                remove_path(copy)
            except OSError:
                pass
