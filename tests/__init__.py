"""The test suite as a package, so that test modules in different folders may share a basename
(tests/unit/*/ are packages; pytest's default import mode then names each module by its path)."""
