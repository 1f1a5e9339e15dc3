"""``tfmp benchmark``: float32 against mixed precision, measured on this machine.

Modules, one job each:

* ``plan``     - which policies run here, which are skipped and why; the interleaved schedule.
* ``stats``    - per-run measurements from a ``metrics.json``; medians, min and max per policy.
* ``diagnose`` - plain-word reasons when mixed precision does not pay (pure functions).
* ``report``   - ``benchmark.json`` and the Markdown table.
* ``chart``    - the PNG chart (matplotlib, Agg backend).
* ``runner``   - runs ``tfmp train`` once per (repeat, policy), each in a fresh process.

Everything except ``runner`` and ``chart`` is pure and imports no TensorFlow: the parent
process never touches the GPU, so it cannot hold memory that a measured run would see.
"""
