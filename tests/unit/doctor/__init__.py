"""Unit tests of app/doctor/."""
