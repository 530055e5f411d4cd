"""The vSphere backend: one shared pyvmomi session, property-collector reads, Task MoRefs."""
