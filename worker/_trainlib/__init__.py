"""Private helpers of the training and evaluation processes (torch is imported only inside functions)."""
