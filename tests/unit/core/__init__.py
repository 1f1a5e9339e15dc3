"""Unit tests of app/core/."""
