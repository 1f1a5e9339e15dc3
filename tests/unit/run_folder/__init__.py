"""Unit tests of app/run_folder/."""
