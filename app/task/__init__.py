"""What to train: the Task, model and dataset entries, a user's code, built-in models and
data, losses, and a model's layer tree."""
