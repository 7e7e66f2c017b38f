"""What every flowstd model shares: its errors, the config base class, weights drawn from a seed,
the `describe()` record, the content hash of a tensor payload, and the checks of inputs.

Weights come from `seeded_init_`: one `torch.Generator` seeded with the config's seed draws every
parameter in `named_parameters()` order, so two instances built from equal configs hold
bit-identical weights, and the process-wide RNG is left as it was (building a model neither
reads nor advances `torch.manual_seed`'s stream).
"""

from __future__ import annotations

import math
import struct
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
from torch import nn

from flowrt.compute.hashing import content_hash
from flowrt.errors import FlowrtError

Shape = tuple[int | str, ...]  # ints, or the names of sizes that depend on the input ("frames")


class ModelInputError(FlowrtError, ValueError):
    """A model was given an input it cannot take; the message names the shape and dtype it expects."""


class ModelConfigError(FlowrtError, ValueError):
    """A model config is inconsistent (e.g. a hidden size its heads do not divide)."""


@dataclass(frozen=True, kw_only=True)
class ModelConfig:
    """The base of every model's config: the seed its weights are drawn from."""

    seed: int = 0

    def __post_init__(self) -> None:
        if not isinstance(self.seed, int) or isinstance(self.seed, bool) or not 0 <= self.seed < 2**63:
            raise ModelConfigError(f"seed must be an int in [0, 2**63), not {self.seed!r}")

    def _require_positive(self, *names: str) -> None:
        for name in names:
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ModelConfigError(f"{type(self).__name__}.{name} must be a positive int, not {value!r}")

    def _require_divisible(self, name: str, by: str) -> None:
        if getattr(self, name) % getattr(self, by):
            raise ModelConfigError(
                f"{type(self).__name__}.{name} ({getattr(self, name)}) must be a multiple of {by} ({getattr(self, by)})"
            )


@dataclass(frozen=True)
class ModelDescription:
    """What `describe()` returns: the model's name, parameter count, config and the shapes of
    its inputs and outputs. A shape entry is an int or a symbol whose formula is in `symbols`."""

    name: str
    parameters: int
    config: dict[str, Any]
    inputs: dict[str, str]
    outputs: dict[str, Shape]
    symbols: dict[str, str] = field(default_factory=dict)

    def summary(self) -> dict[str, Any]:
        """JSON-ready (shapes as lists): what an event or `/stats` would show."""
        return {
            "name": self.name,
            "parameters": self.parameters,
            "config": self.config,
            "inputs": self.inputs,
            "outputs": {name: list(shape) for name, shape in self.outputs.items()},
            "symbols": self.symbols,
        }


def _std_for(owner: nn.Module, leaf: str) -> float | None:
    """The normal std a parameter is drawn with; None for norms' and biases' constant init."""
    if isinstance(owner, (nn.LayerNorm, nn.GroupNorm)) or leaf == "bias":
        return None
    if isinstance(owner, nn.Linear):
        return owner.in_features**-0.5
    if isinstance(owner, (nn.ConvTranspose1d, nn.ConvTranspose2d, nn.ConvTranspose3d)):
        # each output sample sums in_channels * kernel / stride taps: keep its variance near 1
        taps = owner.in_channels * math.prod(owner.kernel_size) / math.prod(owner.stride)
        return max(taps, 1.0) ** -0.5
    if isinstance(owner, (nn.Conv1d, nn.Conv2d, nn.Conv3d)):
        return (owner.in_channels // owner.groups * math.prod(owner.kernel_size)) ** -0.5
    if isinstance(owner, nn.Embedding):
        return 1.0
    return 0.02  # a model's own parameters: position embeddings and the like


@torch.no_grad()
def seeded_init_(module: nn.Module, seed: int) -> None:
    """Draw every parameter of `module` from one generator seeded with `seed`, in
    `named_parameters()` order: weights ~ N(0, 1/fan_in), biases 0, norms' scales 1."""
    generator = torch.Generator(device="cpu").manual_seed(seed)
    owners = dict(module.named_modules())
    for name, parameter in module.named_parameters():
        owner_name, _, leaf = name.rpartition(".")
        std = _std_for(owners[owner_name], leaf)
        if std is None:
            parameter.fill_(1.0 if leaf == "weight" else 0.0)
        else:
            # drawn on the CPU and copied: the same numbers whatever device the module is on
            parameter.copy_(torch.randn(parameter.shape, generator=generator, dtype=torch.float32) * std)


class SeededModel(nn.Module):
    """The base of flowstd's models: built from a config, weights from its seed, in eval mode.

    A subclass builds its layers inside `with self.seeded_weights():`, which keeps the default
    initialisers off the global RNG and then draws the weights from the config's seed."""

    model_name = "model"
    config_type: type[ModelConfig] = ModelConfig  # what the subclass is built from

    def __init__(self, config: ModelConfig | None = None) -> None:
        super().__init__()
        config = self.config_type() if config is None else config
        if not isinstance(config, self.config_type):
            wanted = self.config_type.__name__
            article = "an" if wanted[0] in "AEIOU" else "a"
            raise ModelConfigError(f"{type(self).__name__} takes {article} {wanted}, not {type(config).__name__}")
        self.config = config

    @contextmanager
    def seeded_weights(self) -> Iterator[None]:
        with torch.random.fork_rng(devices=[]):  # PyTorch's default inits draw from the global RNG
            yield
        seeded_init_(self, self.config.seed)
        self.eval()

    @property
    def device(self) -> torch.device:
        return next(self.parameters()).device

    def parameter_count(self) -> int:
        return sum(p.numel() for p in self.parameters())

    def describe(self) -> ModelDescription:
        inputs, outputs, symbols = self._shapes()
        return ModelDescription(
            name=self.model_name,
            parameters=self.parameter_count(),
            config=asdict(self.config),
            inputs=inputs,
            outputs=outputs,
            symbols=symbols,
        )

    def _shapes(self) -> tuple[dict[str, str], dict[str, Shape], dict[str, str]]:
        raise NotImplementedError


def tensor_content_hash(tensor: torch.Tensor) -> bytes:
    """The 16-byte content hash (flowrt.compute.hashing.content_hash) of a decoded media payload:
    its dtype and shape, then its bytes, so equal hashes mean equal tensors (a 2x8 and a 4x4
    image of the same bytes differ). The key of an encoder's cache, and a media page's extra."""
    tensor = tensor.detach().to("cpu").contiguous()
    header = struct.pack(f"<{tensor.dim() + 1}q", tensor.dim(), *tensor.shape) + str(tensor.dtype).encode() + b"\0"
    return content_hash(header + tensor.reshape(-1).view(torch.uint8).numpy().tobytes())


def as_tensor(value: Any, what: str, expected: str) -> torch.Tensor:
    """A torch tensor of `value` (a tensor or a numpy array), or a ModelInputError naming `expected`."""
    if isinstance(value, torch.Tensor):
        return value
    if hasattr(value, "__array_interface__") and hasattr(value, "strides"):  # numpy, without importing it
        if any(stride < 0 for stride in value.strides) or not getattr(value, "flags", None) or not value.flags.writeable:
            value = value.copy()  # torch takes neither negative strides (a flipped view) nor read-only memory
        try:
            return torch.as_tensor(value)
        except TypeError:
            raise ModelInputError(f"{what} must be {expected}; got an array of {value.dtype}") from None
    raise ModelInputError(f"{what} must be {expected}; got {type(value).__name__}")


def require_finite(tensor: torch.Tensor, what: str) -> None:
    if tensor.is_floating_point() and not bool(torch.isfinite(tensor).all()):
        raise ModelInputError(f"{what} holds NaN or infinite values")


def shape_text(tensor: torch.Tensor) -> str:
    return f"{str(tensor.dtype).removeprefix('torch.')} {tuple(tensor.shape)}"
