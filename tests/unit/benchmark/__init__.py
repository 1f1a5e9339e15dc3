"""Unit tests of app/benchmark/."""
