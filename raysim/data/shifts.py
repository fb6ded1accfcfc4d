"""Per-client distribution shifts of the inputs (FedOT spec §6.2, §9.1), usable with any method.

Client j's shift is drawn from ``(run seed, SHIFT_TAG, j)`` alone, so every process and every
round sees the same one, and it is the same for the client's train rows and its test view:

- ``affine`` / ``paper_diag`` (the default): ``x' = s_j ⊙ x + z_j`` on the flat input, with
  ``s_j ~ U[scale]^d`` and ``z_j ~ N(0, σ·I_d)`` (σ is the variance: FedOT spec §8.2 item 12);
- ``affine`` / ``code_full`` (the authors' notebook, §6.2 "code discrepancy"):
  ``x' = x + x M_j + z_j`` with ``M_j ~ N(0, (matrix_std/√d)²)`` entrywise and
  ``z_j ~ N(0, noise_std²·I)``, then re-quantised as the notebook does (``quantise``);
- ``colour`` (Colored-MNIST, §6.2): every pixel becomes an RGB 3-vector, ``a_j`` where
  ``x ≤ threshold`` (background) and ``x · b_j`` elsewhere, with ``a_j, b_j ~ U[0, 1]³``; a flat
  ``(N, P)`` input becomes ``(N, P, 3)``.

- ``embedding`` (FedOT spec §9.4's synthetic benchmark, on token data): client j's input
  embeddings become ``s_j ⊙ e + z_j`` with ``s_j ~ U[scale]^d`` and ``z_j ~ N(0, σ_e²·I)``, σ_e
  the std of the embedding table; the tokens stay as they are and the model applies the shift
  (``EmbeddingShift``, attached by the worker to a model with ``input_embeddings()``).

The dataset keeps the train rows shifted by their owner and a *reference view* of the shared sets
(the identity for affine shifts, grey ``(x, x, x)`` for colour: what the global model is scored
on); ``ClientShifts.test_view`` gives a client's own view of the test set.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

import numpy as np
from pydantic import Field, model_validator

from raysim.schema import StrictModel

if TYPE_CHECKING:  # the data layer loads without torch; only EmbeddingShift uses it
    import torch

SHIFT_TAG = 0xF07  # rng = default_rng([seed, SHIFT_TAG, client])


class ShiftConfig(StrictModel):
    """``data.shift``: a per-client transform of the inputs (FedOT spec §6.2)."""

    kind: Literal["none", "affine", "colour", "embedding"] = Field(
        "none",
        description="none; affine: dense inputs, each client's own s ⊙ x + z; colour: each "
        "pixel coloured by the client's own background and foreground RGB (Colored-MNIST); "
        "embedding: token data, the client's shift applied to the input embeddings",
    )
    affine_mode: Literal["paper_diag", "code_full"] = Field(
        "paper_diag", description="paper_diag: diag(s)x + z (paper); code_full: x + xM + z (code)"
    )
    scale: tuple[float, float] = Field((0.5, 1.5), description="paper_diag: s ~ U[lo, hi]^d")
    sigma: float = Field(1.0, ge=0, description="paper_diag: z ~ N(0, σ·I); σ is the variance")
    matrix_std: float = Field(5.0, ge=0, description="code_full: M ~ N(0, (matrix_std/√d)²)")
    noise_std: float = Field(5.0, ge=0, description="code_full: z ~ N(0, noise_std²·I)")
    quantise: bool = Field(
        True, description="code_full: truncate 127.5x'+127.5 to an integer and map back"
    )
    threshold: float = Field(1e-4, ge=0, description="colour: ζ, background where x ≤ ζ")
    embedding_std: float | None = Field(
        None, gt=0, description="embedding: σ_e of z (None: the std of the embedding table)"
    )

    @model_validator(mode="after")
    def _check(self) -> ShiftConfig:
        lo, hi = self.scale
        if not 0 <= lo <= hi:
            raise ValueError(f"shift.scale must be 0 <= lo <= hi, got {self.scale}")
        return self


class ClientShifts:
    """The run's per-client shifts: ``apply(j, x)`` on raw inputs, and each client's test view.

    Shift parameters are regenerated from the seed when needed (never stored), so the object is
    small whatever the number of clients; ``params(j)`` returns them for inspection and tests.
    """

    def __init__(self, cfg: ShiftConfig, seed: int, x_test_raw: np.ndarray) -> None:
        self.cfg = cfg
        self.seed = seed
        self.x_test_raw = x_test_raw

    def params(self, client: int, d: int) -> dict[str, np.ndarray]:
        """Client ``client``'s shift parameters for inputs of ``d`` values (pixels for colour)."""
        c = self.cfg
        rng = np.random.default_rng([self.seed, SHIFT_TAG, client])
        if c.kind == "colour":
            return {"a": rng.uniform(0.0, 1.0, 3), "b": rng.uniform(0.0, 1.0, 3)}
        if c.affine_mode == "code_full":
            m = rng.normal(0.0, c.matrix_std / np.sqrt(d), (d, d))
            return {"M": m, "z": rng.normal(0.0, c.noise_std, d)}
        s = rng.uniform(c.scale[0], c.scale[1], d)
        return {"s": s, "z": rng.normal(0.0, np.sqrt(c.sigma), d)}

    def apply(self, client: int, x: np.ndarray) -> np.ndarray:
        """Client ``client``'s view of raw inputs ``x`` (float32; tokens unchanged for an
        ``embedding`` shift, which the model applies)."""
        if self.cfg.kind == "embedding":
            return x
        flat = x.reshape(len(x), -1).astype(np.float64)
        p = self.params(client, flat.shape[1])
        c = self.cfg
        if c.kind == "colour":
            background = (flat <= c.threshold)[..., None]
            out = np.where(background, p["a"], flat[..., None] * p["b"])
            return _colour_layout(out, x.shape)
        if c.affine_mode == "code_full":
            out = flat + flat @ p["M"] + p["z"]
            if c.quantise:
                out = (np.trunc(127.5 * out + 127.5) - 127.5) / 127.5
        else:
            out = flat * p["s"] + p["z"]
        return out.reshape(x.shape).astype(np.float32)

    def reference(self, x: np.ndarray) -> np.ndarray:
        """The unshifted view of raw inputs in the shifted format (identity; grey for colour)."""
        if self.cfg.kind == "embedding":
            return x
        if self.cfg.kind == "colour":
            flat = np.asarray(x, np.float32).reshape(len(x), -1)
            return _colour_layout(np.repeat(flat[..., None], 3, axis=-1), x.shape)
        return np.asarray(x, np.float32)

    def test_view(self, client: int) -> np.ndarray:
        """The shared test inputs as client ``client`` sees them (FedOT spec §6.5)."""
        return self.apply(client, self.x_test_raw)


class EmbeddingShift:
    """Applies client j's ``embedding`` shift to a model's input embeddings (a forward hook on
    ``model.input_embeddings()``); ``use(j)`` selects the client, ``use(None)`` none (the global
    view)."""

    def __init__(self, shifts: ClientShifts, model: torch.nn.Module) -> None:
        table = model.input_embeddings().weight.detach()
        self.d = table.shape[1]
        self.std = shifts.cfg.embedding_std or float(table.float().std())
        self.shifts = shifts
        self.client: int | None = None
        self._params: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        model.input_embeddings().register_forward_hook(self._hook)

    def params(self, client: int) -> tuple[torch.Tensor, torch.Tensor]:
        if client not in self._params:
            import torch

            rng = np.random.default_rng([self.shifts.seed, SHIFT_TAG, client])
            lo, hi = self.shifts.cfg.scale
            s = torch.from_numpy(rng.uniform(lo, hi, self.d).astype(np.float32))
            z = torch.from_numpy(rng.normal(0.0, self.std, self.d).astype(np.float32))
            self._params[client] = s, z
        return self._params[client]

    def use(self, client: int | None) -> None:
        self.client = client

    def _hook(self, module, inputs, output: torch.Tensor) -> torch.Tensor | None:
        if self.client is None:
            return None
        s, z = self.params(self.client)
        return output * s.to(output) + z.to(output)


def embedding_model(module: torch.nn.Module) -> torch.nn.Module | None:
    """The first submodule with ``input_embeddings()`` (an ``lm_classifier``), or None."""
    return next((m for m in module.modules() if hasattr(m, "input_embeddings")), None)


def _colour_layout(rgb: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """(N, P, 3) colour values → the input's layout: a one-channel image (N, 1, H, W) becomes
    (N, 3, H, W) (channels first, as image models read it); anything else (N, ..., 3)."""
    if len(shape) == 4 and shape[1] == 1:
        n, _, h, w = shape
        return np.ascontiguousarray(rgb.reshape(n, h, w, 3).transpose(0, 3, 1, 2), np.float32)
    return rgb.reshape(*shape, 3).astype(np.float32)


def shift_clients(
    shifts: ClientShifts, x_train: np.ndarray, indices: np.ndarray, offsets: np.ndarray
) -> np.ndarray:
    """``x_train`` with each client's rows in its own view (rows no client owns: reference)."""
    out = shifts.reference(x_train).copy()
    for j in range(len(offsets) - 1):
        rows = indices[offsets[j] : offsets[j + 1]]
        if len(rows):
            out[rows] = shifts.apply(j, x_train[rows])
    return out
