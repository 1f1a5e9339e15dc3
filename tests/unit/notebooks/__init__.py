"""Unit tests of app/notebooks/."""
