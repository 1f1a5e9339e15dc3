"""Unit tests of app/training/."""
