"""tests.support holds harnesses only walkit's own tests (and benchmarks) use: fuzzers, pausing, worker processes.

What applications and plugin authors use (the simulator, the memory cluster, the conformance suites) stays
in walkit.testing, which is installed; this package is not.
"""
