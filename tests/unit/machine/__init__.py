"""Unit tests of app/machine/."""
