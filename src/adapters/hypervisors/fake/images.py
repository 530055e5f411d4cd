"""Images on the fake hypervisor: a prepared image is a file under IMAGE_DIR, by target name."""

from __future__ import annotations

from dataclasses import dataclass

from returns.result import Result

from pyrigaud.adapters.hypervisors.fake.hypervisor import (
    FakeHypervisor,
    FakeImage,
    no_templates,
    not_on_this_host,
)
from pyrigaud.domain import fields
from pyrigaud.domain.errors import ExpectedError, ProviderError
from pyrigaud.domain.models import PreparedImage, PrepareImageRequest

IMAGE_DIR = "/var/lib/fake/images"
DOWNLOADED_IMAGE_GIB = 2


@dataclass(frozen=True)
class FakeImages:
    hypervisor: FakeHypervisor

    def prepare_image(self, request: PrepareImageRequest) -> Result[PreparedImage, ProviderError]:
        return self.hypervisor.serve("prepare_image", lambda: self._prepare(request))

    def _prepare(self, request: PrepareImageRequest) -> PreparedImage:
        path = f"{IMAGE_DIR}/{request.target_name}.qcow2"
        prepared = self.hypervisor.images.get(path)
        if prepared is None:
            prepared = FakeImage(
                id=request.target_name, path=path, size_gib=self._source_size(request)
            )
            self.hypervisor.images[path] = prepared
        return PreparedImage(id=prepared.id, path=prepared.path)

    def _source_size(self, request: PrepareImageRequest) -> int:
        source = request.source
        if source.template_name:
            raise no_templates(fields.PREPARE_TEMPLATE_NAME)
        if source.path:
            base = self.hypervisor.images.get(source.path)
            if base is None:
                raise not_on_this_host(fields.PREPARE_PATH, source.path)
            return base.size_gib
        if source.url.startswith(("http://", "https://")):
            return DOWNLOADED_IMAGE_GIB
        raise ExpectedError(
            ProviderError.invalid_spec(fields.PREPARE_URL, "must be an http(s) URL")
        )
