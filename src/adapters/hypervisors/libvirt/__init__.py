"""The libvirt backend: one persistent libvirt connection, domain XML, pool volumes."""
