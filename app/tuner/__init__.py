"""``tfmp tune``: the largest batch that fits and the fastest one, per precision.

Modules, one job each:

* ``arguments`` - ``tune()``'s arguments, checked before any trial, and the trial settings
                  resolved as ``tfmp train`` resolves them;
* ``search``    - the doubling-then-bracketing search and the choice (pure; unit-tested with
                  fake trial functions);
* ``plan``      - ``--global-batch``: the micro-batch and accumulation that reach it fastest
                  (pure, as ``search``);
* ``budget``    - ``--memory-budget``: sizes, the container's limit, MemAvailable;
* ``trial``     - one trial, the child process that builds the model and trains a few steps;
* ``runner``    - starting children, the memory watchdog, reading how a child ended;
* ``output``    - the output folder: its name, what it may hold, writing the results;
* ``report``    - tune.json, the console table, the PNG chart;
* ``progress``  - the progress bar across trials;
* ``tuning``    - ``tune()``, the whole tune, shared by the command and ``app.tune(...)``.

Using a tune.json (``train --tuned``, the linear learning-rate rule) is training's:
``app.training.tuned``.

The package is ``app.tuner`` (not ``app.tune``) so that ``app.tune`` stays the function.
Only ``trial`` imports TensorFlow, and only in its own process.
"""
