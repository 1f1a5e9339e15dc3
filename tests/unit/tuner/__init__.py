"""Unit tests of app/tuner/."""
