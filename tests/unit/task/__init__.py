"""Unit tests of app/task/."""
