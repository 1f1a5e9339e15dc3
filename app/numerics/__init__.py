"""The numerics sentinel's analysis, shared by training and ``tfmp check``: what each dtype
can hold (``limits``), when skipped or non-finite steps are a fault (``rules``), each layer's
output recorded during a forward pass (``tap``), its headroom (``headroom``), the replay of a
failing batch (``replay``) and the report it gives (``diagnosis``).  docs/numerics.md."""
