"""What the machine offers: hardware, the GPU probe and its problems, the environment report."""
