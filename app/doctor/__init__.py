"""``tfmp check``: the mixed-precision doctor.

The troubleshooting and best-practice tables of the mixed-precision guide, turned into
checks on one model under one dtype policy.  One module per job:

* ``layers``  - the per-layer table (class, compute/variable/output dtype), layers that
  compute in float32 under a mixed policy and why, the model's output dtype, Tensor Core fit;
* ``probe``   - one real forward and backward step on one batch: dtype clashes, non-finite
  values, the share of gradients that underflow to zero without loss scaling;
* ``compare`` - a few training steps from the same weights under float32 and the policy;
* ``report``  - findings, the verdict, the text table and the JSON form;
* ``run``     - puts them together for the command and for ``app.check`` (``api``).

Nothing here imports TensorFlow at import time; the command validates its flags first.
"""
