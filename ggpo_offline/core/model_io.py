"""Find and fingerprint a local Hugging Face model folder and its tokenizer."""

import hashlib
import json
from pathlib import Path

from ggpo_offline.core.errors import UserError

WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt")
EMBEDDED_MODEL = "embedded:tiny"
"""How metadata names the shipped tiny model (its path differs between installs)."""


def tiny_model_dir() -> Path:
    """The folder of the shipped tiny model (package data of the organism)."""
    return Path(__file__).parents[1] / "organism" / "tiny_model"


def model_name(model_dir: Path) -> str:
    """EMBEDDED_MODEL for the shipped tiny model, else the folder's path."""
    return EMBEDDED_MODEL if Path(model_dir).resolve() == tiny_model_dir().resolve() else str(model_dir)


def resolve_model_dir(model: str | Path | None) -> Path:
    """The model folder: the embedded tiny model by default, else a local folder or a cached hub name."""
    if model is None:
        path = tiny_model_dir()
        if not (path / "config.json").is_file():
            raise UserError(f"the embedded tiny model is missing from {path}; reinstall ggpo-offline")
        return path
    path = Path(model).expanduser()
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise UserError(f"--model {model}: folder has no config.json (not a Hugging Face model folder)")
        return path.resolve()
    if path.exists():
        raise UserError(f"--model {model}: is a file, expected a Hugging Face model folder")
    try:  # a hub name already in the local cache works offline; nothing is downloaded
        from huggingface_hub import snapshot_download

        return Path(snapshot_download(str(model), local_files_only=True))
    except Exception:
        raise UserError(
            f"--model {model}: no such model folder (and not in the local Hugging Face cache)"
        ) from None


def weights_sha256(model_dir: Path) -> str:
    """sha256 over the model's weight files (names and bytes, in name order): its ``.safetensors`` and
    ``.bin`` files, or its ``.pt`` files where it has neither. A training checkpoint's resume state
    (``trainer_state.pt``, ``rank-*.pt``: optimizer, settings, paths) is not the weights, so checkpoints of
    equal weights get one fingerprint wherever they were written."""
    digest = hashlib.sha256()
    found = [p for p in Path(model_dir).iterdir() if p.suffix in WEIGHT_SUFFIXES and p.is_file()]
    files = sorted(p for p in found if p.suffix != ".pt") or sorted(found)
    if not files:
        raise UserError(f"{model_dir}: no weight files ({', '.join(WEIGHT_SUFFIXES)})")
    for path in files:
        digest.update(path.name.encode())
        with path.open("rb") as handle:
            for chunk in iter(lambda: handle.read(1 << 20), b""):
                digest.update(chunk)
    return digest.hexdigest()


def tokenizer_sha256(tokenizer) -> str:
    """Fingerprint of what the tokenizer maps: its vocabulary and special tokens, not its file formatting."""
    content = {
        "vocab": sorted(tokenizer.get_vocab().items()),
        "special": sorted((k, str(v)) for k, v in tokenizer.special_tokens_map.items()),
        "class": type(tokenizer).__name__,
    }
    return hashlib.sha256(json.dumps(content).encode()).hexdigest()


def load_tokenizer(model_dir: Path):
    """The model folder's tokenizer (transformers AutoTokenizer)."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(model_dir))


def eos_token_ids(model_dir: Path) -> set[int]:
    """Every id that ends a response: generation_config's eos ids plus the tokenizer's eos."""
    ids: set[int] = set()
    for name in ("generation_config.json", "config.json"):
        path = Path(model_dir) / name
        if path.is_file():
            value = json.loads(path.read_text()).get("eos_token_id")
            ids.update(value if isinstance(value, list) else [value] if value is not None else [])
    if not ids:
        tokenizer = load_tokenizer(model_dir)
        if tokenizer.eos_token_id is not None:
            ids.add(tokenizer.eos_token_id)
    return ids


def initial_model_dir(model: str | None, pool_model: str | None) -> Path:
    """``--model``, else the model that generated the pool: ``pool_model`` is its folder, None for the
    embedded model wherever it is installed (`PoolModel.location`)."""
    return resolve_model_dir(model if model is not None else pool_model)
