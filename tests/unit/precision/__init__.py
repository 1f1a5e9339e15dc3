"""Unit tests of app/precision/."""
