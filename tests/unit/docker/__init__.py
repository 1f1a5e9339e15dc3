"""Unit tests of the image's start-up helpers (docker/start/, docker/bin/)."""
