"""Mixed-precision TensorFlow training, shared by notebooks, SSH sessions and batch jobs.

Run as ``tfmp <command>`` (``python -m app <command>`` is an alias, but it imports
whatever ``app`` the current folder holds); see ``tfmp --help``.  From Python::

    import app
    app.train(model=build, data=load, precision="auto", epochs=3)   # -> metrics dict
    app.check(model=build)                                           # -> report dict
    app.tune(model="resnet", data="cifar10", memory_budget="2GiB")   # -> tune.json dict
"""

__version__ = "0.1.0"
__all__ = ["train", "check", "tune"]


def __getattr__(name):
    # Lazy: `tfmp --help` and the benchmark's parent process never import
    # TensorFlow; `app.train` imports it on first use.
    if name in __all__:
        from app import api

        return getattr(api, name)
    raise AttributeError(f"module 'app' has no attribute {name!r}")
