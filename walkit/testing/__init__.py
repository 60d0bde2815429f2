"""walkit.testing holds what tests of walkit and of its plugins share: simulators and conformance suites."""
