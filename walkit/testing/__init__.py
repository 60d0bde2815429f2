"""walkit.testing holds what applications and plugin authors test with: the simulator, the memory cluster, the conformance suites.

It is installed and public (docs/internals/testing.md#support). Harnesses only walkit's own tests use live in
tests/support/, which is not installed.
"""
