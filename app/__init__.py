"""Mixed-precision TensorFlow training, shared by notebooks, SSH sessions and batch jobs.

Run as ``python -m app <command>``; see ``python -m app --help``.
"""

__version__ = "0.1.0"
