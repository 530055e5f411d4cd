"""A fuzz case as a recipe: which seed image, which mutations made over it (each a few bytes
patched at an offset, or the image cut short) and the size of the pieces the judge is fed.
Recipes are what regression cases keep (JSON under regressions/), never mutated images: a
seed image is rebuilt by qemu-img from its fixed disk, and a patch is a few bytes."""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

REGRESSIONS = Path(__file__).parent / "regressions"


@dataclass(frozen=True)
class Mutation:
    """`data` written over the image at `offset` (past the end, the image grows), or, when
    `cut_to` is set, the image cut to that many bytes. `kind` names the structure aimed at
    (a header field, "L2 entry", "deflated grain", ...); `what` says the change in words."""

    kind: str
    what: str
    offset: int = 0
    data: bytes = b""
    cut_to: int | None = None

    def applied(self, image: bytearray) -> None:
        if self.cut_to is not None:
            del image[self.cut_to :]
            return
        end = self.offset + len(self.data)
        if end > len(image):
            image.extend(bytes(end - len(image)))
        image[self.offset : end] = self.data

    def as_json(self) -> dict[str, Any]:
        if self.cut_to is not None:
            return {"kind": self.kind, "what": self.what, "cut_to": self.cut_to}
        return {"kind": self.kind, "what": self.what, "offset": self.offset, "hex": self.data.hex()}

    @staticmethod
    def from_json(kept: dict[str, Any]) -> Mutation:
        return Mutation(
            kind=kept["kind"],
            what=kept["what"],
            offset=int(kept.get("offset", 0)),
            data=bytes.fromhex(kept.get("hex", "")),
            cut_to=kept.get("cut_to"),
        )


@dataclass(frozen=True)
class Recipe:
    seed_image: str
    mutations: tuple[Mutation, ...]
    chunk_bytes: int = 65536  # the size of the pieces the judge is fed

    def applied(self, seed: bytes) -> bytes:
        image = bytearray(seed)
        for mutation in self.mutations:
            mutation.applied(image)
        return bytes(image)

    def alone(self, mutation: Mutation) -> Recipe:
        return replace(self, mutations=(mutation,))

    def as_json(self) -> dict[str, Any]:
        return {
            "seed_image": self.seed_image,
            "mutations": [mutation.as_json() for mutation in self.mutations],
            "chunk_bytes": self.chunk_bytes,
        }

    @staticmethod
    def from_json(kept: dict[str, Any]) -> Recipe:
        return Recipe(
            seed_image=kept["seed_image"],
            mutations=tuple(Mutation.from_json(mutation) for mutation in kept["mutations"]),
            chunk_bytes=int(kept["chunk_bytes"]),
        )


@dataclass(frozen=True)
class Regression:
    """A kind of disagreement once found, and the recipe that showed it, replayed every run.
    `known_open`: the judge does not refuse it yet, so its replay is expected to fail until
    it does (`reason` says what is missing); `found` is what qemu-img and the judge said."""

    name: str
    signature: str
    recipe: Recipe
    found: str
    known_open: bool
    reason: str


def load_regressions(folder: Path = REGRESSIONS) -> list[Regression]:
    regressions = []
    for path in sorted(folder.glob("*.json")):
        kept = json.loads(path.read_text())
        regressions.append(
            Regression(
                name=path.stem,
                signature=kept["signature"],
                recipe=Recipe.from_json(kept["recipe"]),
                found=kept["found"],
                known_open=bool(kept["known_open"]),
                reason=kept.get("reason", ""),
            )
        )
    return regressions


def regression_json(signature: str, recipe: Recipe, found: str) -> str:
    """A new regression case's file: known open, as the judge accepts it when it is found."""
    kept = {
        "signature": signature,
        "recipe": recipe.as_json(),
        "found": found,
        "known_open": True,
        "reason": "the judge accepts it (fill in what it is missing)",
    }
    return json.dumps(kept, indent=2) + "\n"
