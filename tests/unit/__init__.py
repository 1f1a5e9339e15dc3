"""Host unit tests, one folder per app/ package (tests/unit/training/ tests app/training/, ...)."""
