"""The dtype policy decision, the Keras 2/3 loss-scaling seam, dtype clashes."""
