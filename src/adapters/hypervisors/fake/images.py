"""Images on the fake hypervisor: a prepared image is a file under IMAGE_DIR, by target name."""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial

from returns.result import Failure, Result, Success

from pyrigaud.adapters.hypervisors.fake.hypervisor import (
    FakeHypervisor,
    FakeImage,
    no_templates,
    not_on_this_host,
)
from pyrigaud.domain import fields
from pyrigaud.domain.errors import ProviderError
from pyrigaud.domain.models import PreparedImage, PrepareImageRequest

IMAGE_DIR = "/var/lib/fake/images"
DOWNLOADED_IMAGE_GIB = 2


@dataclass(frozen=True)
class FakeImages:
    hypervisor: FakeHypervisor

    def prepare_image(self, request: PrepareImageRequest) -> Result[PreparedImage, ProviderError]:
        return self.hypervisor.serve("prepare_image", partial(self._prepare, request))

    def _prepare(self, request: PrepareImageRequest) -> Result[PreparedImage, ProviderError]:
        path = f"{IMAGE_DIR}/{request.target_name}.qcow2"
        prepared = self.hypervisor.images.get(path)
        if prepared is not None:
            return Success(PreparedImage(id=prepared.id, path=prepared.path))

        def made(size_gib: int) -> PreparedImage:
            image = FakeImage(id=request.target_name, path=path, size_gib=size_gib)
            self.hypervisor.images[path] = image
            return PreparedImage(id=image.id, path=image.path)

        return self._source_size(request).map(made)

    def _source_size(self, request: PrepareImageRequest) -> Result[int, ProviderError]:
        source = request.source
        if source.template_name:
            return no_templates(fields.PREPARE_TEMPLATE_NAME)
        if source.path:
            base = self.hypervisor.images.get(source.path)
            if base is None:
                return not_on_this_host(fields.PREPARE_PATH, source.path)
            return Success(base.size_gib)
        if source.url.startswith(("http://", "https://")):
            return Success(DOWNLOADED_IMAGE_GIB)
        return Failure(ProviderError.invalid_spec(fields.PREPARE_URL, "must be an http(s) URL"))
