"""The formats ``ggpo pool import --from`` reads, each a function from source files to rollouts."""

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Literal

from ggpo_offline.importing.formats import generic, nemo_rl, prime_rl, trl, vllm_server
from ggpo_offline.importing.imported_response import Rollout

ImportFormat = Literal["generic", "nemo-rl", "prime-rl", "trl", "vllm"]

READERS: dict[str, Callable[[list[Path]], Iterator[Rollout]]] = {
    "generic": generic.rollouts,
    "nemo-rl": nemo_rl.rollouts,
    "prime-rl": prime_rl.rollouts,
    "trl": trl.rollouts,
    "vllm": vllm_server.rollouts,
}
