"""``tfmp tune``: the largest batch that fits and the fastest one, per precision.

Modules, one job each:

* ``search``   - the doubling-then-bracketing search and the choice (pure; unit-tested with
                 fake trial functions);
* ``budget``   - ``--memory-budget``: sizes, the container's limit, MemAvailable;
* ``trial``    - one trial, the child process that builds the model and trains a few steps;
* ``runner``   - starting children, the memory watchdog, reading how a child ended;
* ``report``   - tune.json, the console table, the PNG chart;
* ``progress`` - the progress bar across trials;
* ``tuned``    - using a tune.json (``train --tuned``) and the linear learning-rate rule;
* ``api``      - ``tune()``, the whole tune, shared by the command and ``app.tune(...)``.

The package is ``app.tuner`` (not ``app.tune``) so that ``app.tune`` stays the function.
Only ``trial`` imports TensorFlow, and only in its own process.
"""
