"""Staging storage adapters: a PVC's files, an S3 bucket, an NFS export (userspace client)."""
