"""Disk image formats in pure Python: streamed conversions with bounded memory, no process forked.

Backend-neutral: vSphere's NFC leases speak streamOptimized VMDK while staging stores hold qcow2,
raw or vmdk, and these modules convert between them chunk by chunk.
"""
